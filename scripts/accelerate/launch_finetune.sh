#!/usr/bin/env bash
# Thin launcher for `hf-attn-variants finetune` (Trainer) under accelerate.
#   scripts/accelerate/launch_finetune.sh ddp-cpu|ddp [finetune flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:?mode: ddp-cpu | ddp}"; shift
python="${PYTHON:-python}"
launch=("$python" -m accelerate.commands.launch)
[[ -n "${NUM_PROCESSES:-}" ]] && launch+=(--num_processes "$NUM_PROCESSES")
case "$mode" in
  ddp-cpu) export ACCELERATE_USE_CPU=1; launch+=(--config_file "$here/ddp_cpu.yaml") ;;
  ddp)     launch+=(--config_file "$here/ddp_gpu.yaml") ;;
  *) echo "mode must be one of: ddp-cpu, ddp (got '$mode')" >&2; exit 2 ;;
esac
exec "${launch[@]}" -m hf_attn_variants finetune "$@"
