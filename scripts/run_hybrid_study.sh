#!/usr/bin/env bash
# Re-run the hybrid position study published in docs/length_generalization.md ("NoPE layers in a RoPE model").
#
# The entropy-invariant family with standard attention, log-n everywhere, and log-n on the layers without RoPE
# only (Llama 4), crossed with RoPE in every layer, no position embedding, and every fourth layer without RoPE
# (SmolLM3's no_rope_layers): 7 series x 3 seeds per task, 4 layers, trained at L on passkey and on MQAR
# (MQAR_STEPS steps, the first half on lengthgen's copy warm-up: docs/length_generalization.md, "MQAR at L"),
# scored at L ... 64L. Each model is kept and its attention entropy measured (hf-attn-variants entropy). CPU-sized:
# under an hour with WORKERS=2 on 2 cores. Resumable: rerunning skips finished runs. Results:
# $OUT/<task>/results.{md,json}, $OUT/<task>/entropy.{json,png}; docs/results/$RESULTS.json (default
# hybrid-study; RESULTS= to skip) and docs/length_generalization_hybrid.png, rendered by
# `python tools/render_docs.py`.
#
#   scripts/run_hybrid_study.sh                      # defaults below
#   WORKERS=2 scripts/run_hybrid_study.sh            # two processes share the runs (run folders are locked)
#   TASKS=passkey SEEDS=0 scripts/run_hybrid_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_workers.sh
source scripts/study_workers.sh
OUT=${OUT:-runs/hybrid_study}
SEEDS=${SEEDS:-"0 1 2"}
TASKS=${TASKS:-"passkey mqar"}
L=${L:-32}
LAYERS=${LAYERS:-4}
MQAR_STEPS=${MQAR_STEPS:-1500}
MEMORY=${MEMORY:-3}
VARIANTS="ei_standard ei_entropy_invariant ei_entropy_invariant_nope_layers"
POSITIONS="rope none nope_every_4"
SERIES="ei_standard ei_entropy_invariant ei_standard+nope ei_entropy_invariant+nope ei_standard+nope_every_4
ei_entropy_invariant+nope_every_4 ei_entropy_invariant_nope_layers+nope_every_4"
study() {
  local task=$1 steps=()
  [ "$task" = mqar ] && steps=(--max_train_steps "$MQAR_STEPS")
  # shellcheck disable=SC2086
  "$PY" -m hf_attn_variants lengthgen --task "$task" --output_dir "$OUT/$task" --train_length "$L" \
    --num_hidden_layers "$LAYERS" --variants $VARIANTS --position_embedding_types $POSITIONS --seeds $SEEDS \
    "${steps[@]}" --save_models --eval_memory_gib "$MEMORY" --num_threads "${THREADS:-1}" --disable_tqdm
}
all_tasks() {
  for task in $TASKS; do
    study "$task"
  done
}
WORKERS=${WORKERS:-1}
RESULTS=${RESULTS-hybrid-study}
mkdir -p "$OUT"
STARTED=$SECONDS
run_workers all_tasks
ENTROPY=()
for task in $TASKS; do
  models=() names=()
  for series in $SERIES; do
    for seed in $SEEDS; do
      models+=("$OUT/$task/runs/$series/seed_$seed/model")
      names+=("$series@$seed")
    done
  done
  "$PY" -m hf_attn_variants entropy --models "${models[@]}" --names "${names[@]}" --task "$task" \
    --train_length "$L" --memory_gib "$MEMORY" --output "$OUT/$task/entropy.json"
  ENTROPY+=("$OUT/$task/entropy.json")
done
if [ -n "$RESULTS" ]; then
  COMMAND="WORKERS=$WORKERS SEEDS=\"$SEEDS\" L=$L LAYERS=$LAYERS MQAR_STEPS=$MQAR_STEPS scripts/run_hybrid_study.sh"
  FILES=()
  for task in $TASKS; do FILES+=("$OUT/$task/results.json"); done
  "$PY" tools/publish_study.py hybrid "$RESULTS" "${FILES[@]}" --entropy "${ENTROPY[@]}" \
    --command "$COMMAND" --wall-seconds "$((SECONDS - STARTED))" --plot docs/length_generalization_hybrid.png \
    || { echo "run_hybrid_study.sh: publishing docs/results/$RESULTS.json failed (above)" >&2; exit 1; }
  "$PY" tools/render_docs.py \
    || { echo "run_hybrid_study.sh: tools/render_docs.py failed (above): docs not rendered" >&2; exit 1; }
fi
echo "done: $OUT/<task>/results.md"
