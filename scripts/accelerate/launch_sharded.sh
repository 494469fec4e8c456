#!/usr/bin/env bash
# Sharded training through Transformers' DistributedConfig (FSDP2, tensor parallel, HSDP) under torchrun —
# CPU (gloo) and GPU (NCCL) alike. The size flags must multiply to nodes × nproc_per_node:
#   dp_replicate_size × fsdp_size × tp_size = WORLD_SIZE.
#   scripts/accelerate/launch_sharded.sh <nproc_per_node> [pretrain flags...]
#     2 CPU processes, FSDP2:        scripts/accelerate/launch_sharded.sh 2 --model_type gau --fsdp_size 2 ...
#     1 node × 8 GPUs, FSDP2 × TP:   scripts/accelerate/launch_sharded.sh 8 --model_type gau --fsdp_size 4 --tp_size 2 ...
#     2 nodes × 8 GPUs, HSDP (run on each node, NODE_RANK 0 and 1):
#       NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/accelerate/launch_sharded.sh 8 --model_type gau \
#         --dp_replicate_size 2 --fsdp_size 8 ...
# COMMAND=finetune runs `hf-attn-variants finetune` instead of pretrain (FSDP2/HSDP; see docs/training.md).
# PYTHON picks the interpreter (default: python); MASTER_PORT (default 29500) for several nodes. On CPU,
# OMP_NUM_THREADS defaults to 1 (several processes share the cores).
set -euo pipefail
nproc="${1:?nproc_per_node: processes on this node}"; shift
python="${PYTHON:-python}"
command="${COMMAND:-pretrain}"
launch=("$python" -m torch.distributed.run --nproc_per_node "$nproc")
if [[ "${NNODES:-1}" != 1 ]]; then
  launch+=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?NODE_RANK is needed with NNODES}"
           --master_addr "${MASTER_ADDR:?MASTER_ADDR is needed with NNODES}" --master_port "${MASTER_PORT:-29500}")
else
  launch+=(--standalone)
fi
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.accelerator.is_available() else 1)"; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
exec "${launch[@]}" -m hf_attn_variants "$command" "$@"
