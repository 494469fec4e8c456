#!/usr/bin/env bash
# torchrun launcher for `hf-attn-variants pretrain` on one node or several (c10d rendezvous).
# With --fsdp_size / --tp_size / --dp_replicate_size, the run is sharded through Transformers' DistributedConfig
# (FSDP2, tensor parallel, HSDP); the sizes must multiply to NNODES × nproc_per_node:
#   dp_replicate_size × fsdp_size × tp_size = WORLD_SIZE.
# Without them it is accelerate DDP (accelerate reads torchrun's environment). CPU (gloo) and GPU (NCCL) alike.
#   scripts/accelerate/launch_sharded.sh <nproc_per_node> [pretrain flags...]
#     2 CPU processes, FSDP2:        scripts/accelerate/launch_sharded.sh 2 --model_type gau --fsdp_size 2 ...
#     1 node × 8 GPUs, FSDP2 × TP:   scripts/accelerate/launch_sharded.sh 8 --model_type gau --fsdp_size 4 --tp_size 2 ...
#     2 nodes × 8 GPUs, HSDP (the same command on each node, NODE_RANK 0 on node0 and 1 on the other):
#       NNODES=2 NODE_RANK=0 RDZV_ENDPOINT=node0:29500 RDZV_ID=gau-hsdp scripts/accelerate/launch_sharded.sh 8 \
#         --model_type gau --dp_replicate_size 2 --fsdp_size 8 --output_dir /shared/runs/gau ...
#     2 nodes × 8 GPUs, DDP:         NNODES=2 NODE_RANK=R MASTER_ADDR=node0 scripts/accelerate/launch_sharded.sh 8 \
#                                      --model_type gau --output_dir /shared/runs/gau ...
# Several nodes (NNODES > 1): torchrun --nnodes NNODES --node_rank NODE_RANK --rdzv_backend c10d
#   --rdzv_endpoint RDZV_ENDPOINT --rdzv_id RDZV_ID. RDZV_ENDPOINT (host:port) defaults to MASTER_ADDR:MASTER_PORT
#   (port 29500); the node with NODE_RANK 0 hosts the rendezvous store there (rdzv_conf is_host), so it must be
#   that node's address (or set is_host yourself in RDZV_CONF). torchrun assigns the global ranks itself.
#   RDZV_ID names the run, the same on every node (default hf_attn_variants-<command>; e.g. $SLURM_JOB_ID).
#   RDZV_CONF adds rendezvous settings (e.g. join_timeout=900); LOCAL_ADDR is this node's address for the
#   others (torchrun --local_addr; default its hostname). --output_dir must be on a filesystem all nodes see.
# One node (NNODES unset or 1): torchrun --standalone.
# COMMAND=finetune runs `hf-attn-variants finetune` instead of pretrain (see docs/training.md).
# PYTHON picks the interpreter (default: python). On CPU, OMP_NUM_THREADS defaults to 1 (processes share cores)
# and, for pretrain, ACCELERATE_USE_CPU to 1 (accelerate DDP on gloo).
set -euo pipefail
nproc="${1:?nproc_per_node: processes on this node}"; shift
python="${PYTHON:-python}"
command="${COMMAND:-pretrain}"
launch=("$python" -m torch.distributed.run --nproc_per_node "$nproc")
if [[ "${NNODES:-1}" != 1 ]]; then
  node_rank="${NODE_RANK:?NODE_RANK is needed with NNODES}"
  endpoint="${RDZV_ENDPOINT:-${MASTER_ADDR:?RDZV_ENDPOINT (host:port) or MASTER_ADDR is needed with NNODES}:${MASTER_PORT:-29500}}"
  rdzv_conf="${RDZV_CONF:-}"
  if [[ ",$rdzv_conf" != *",is_host="* ]]; then
    is_host=$([[ "$node_rank" == 0 ]] && echo 1 || echo 0)
    rdzv_conf="is_host=$is_host${rdzv_conf:+,$rdzv_conf}"
  fi
  launch+=(--nnodes "$NNODES" --node_rank "$node_rank" --rdzv_backend c10d --rdzv_endpoint "$endpoint"
           --rdzv_id "${RDZV_ID:-hf_attn_variants-$command}" --rdzv_conf "$rdzv_conf")
  if [[ -n "${LOCAL_ADDR:-}" ]]; then launch+=(--local_addr "$LOCAL_ADDR"); fi
else
  launch+=(--standalone)
fi
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.accelerator.is_available() else 1)"; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  # accelerate runs plain pretrain (DDP) on CPU only with this; the sharded path does not read it. (finetune: --use_cpu)
  if [[ "$command" == pretrain ]]; then export ACCELERATE_USE_CPU="${ACCELERATE_USE_CPU:-1}"; fi
fi
exec "${launch[@]}" -m hf_attn_variants "$command" "$@"
