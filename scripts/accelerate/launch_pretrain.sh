#!/usr/bin/env bash
# Thin launcher for `hf-attn-variants pretrain` under accelerate.
#   scripts/accelerate/launch_pretrain.sh ddp-cpu <model_type> [pretrain flags...]   # 2 CPU processes, gloo
#   scripts/accelerate/launch_pretrain.sh ddp     <model_type> [pretrain flags...]   # all GPUs
#   scripts/accelerate/launch_pretrain.sh fsdp    <model_type> [pretrain flags...]   # FSDP, one unit per layer
# NUM_PROCESSES=N overrides the process count; PYTHON picks the interpreter (default: python).
# One node only. Several nodes: scripts/accelerate/launch_sharded.sh (torchrun, c10d rendezvous; without
# sharding flags it is this DDP), e.g. NNODES=2 NODE_RANK=R RDZV_ENDPOINT=node0:29500 launch_sharded.sh 8 ...
set -euo pipefail
if [[ "${NNODES:-1}" != 1 ]]; then
  echo "launch_pretrain.sh runs on one node (NNODES=$NNODES); for several nodes use scripts/accelerate/launch_sharded.sh" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:?mode: ddp-cpu | ddp | fsdp}"; model_type="${2:?model_type: entropy_invariant | gau | synthesizer}"
shift 2
python="${PYTHON:-python}"
launch=("$python" -m accelerate.commands.launch)
[[ -n "${NUM_PROCESSES:-}" ]] && launch+=(--num_processes "$NUM_PROCESSES")
case "$mode" in
  ddp-cpu) export ACCELERATE_USE_CPU=1; launch+=(--config_file "$here/ddp_cpu.yaml") ;;
  ddp)     launch+=(--config_file "$here/ddp_gpu.yaml") ;;
  fsdp)
    # The wrap class comes from the family's `_no_split_modules`.
    layer_cls="$("$python" -c "import hf_attn_variants as h, sys; \
print(','.join(h.FAMILIES[sys.argv[1]][1]['Model']._no_split_modules))" "$model_type")"
    launch+=(--config_file "$here/fsdp.yaml" --fsdp_transformer_layer_cls_to_wrap "$layer_cls") ;;
  *) echo "mode must be one of: ddp-cpu, ddp, fsdp (got '$mode')" >&2; exit 2 ;;
esac
exec "${launch[@]}" -m hf_attn_variants pretrain --model_type "$model_type" "$@"
