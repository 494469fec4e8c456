#!/usr/bin/env bash
# Re-run the length-generalisation study published in docs/length_generalization.md.
#
# CPU-sized (tiny models; ~1 h with 3 seeds and WORKERS=2 on a shared 2-core CPU, much less on an idle
# one). Every variant uses its config's default initialisation (GAU: gau_init="gau_alpha", GAU-α's). The
# stock Llama is trained once per seed and evaluated as llama/sdpa, llama/entropy_invariant_all (log-n
# scaling on every row) and llama/entropy_invariant_beyond_L (only rows that see more than L keys, the
# stock default scope "beyond"). Resumable: rerunning skips finished variant x seed runs, so it can be
# interrupted and restarted at will, and adding a seed (SEEDS="0 1 2 3") only trains the new runs.
# Results: $OUT/results.md, results.json, results.csv, summary.csv, lengthgen_{mlm,clm}.png and
# finetune/{sequence,token}/finetune.json; the plots are copied to docs/length_generalization_{mlm,clm}.png,
# and the numbers docs/length_generalization.md shows go to docs/results/$RESULTS.json (default length-study;
# RESULTS= to skip), which `python tools/render_docs.py` renders into the page.
#
#   scripts/run_length_study.sh                    # defaults below (seeds 0 1 2)
#   SEEDS="0 1 2 3" scripts/run_length_study.sh    # one more seed
#   WORKERS=2 scripts/run_length_study.sh          # two processes share the runs (run folders are locked)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_workers.sh
source scripts/study_workers.sh
OUT=${OUT:-runs/length_study}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-400}
L=${L:-64}
study() {
  # shellcheck disable=SC2086
  "$PY" -m hf_attn_variants lengthgen \
    --output_dir "$OUT" --train_length "$L" --max_train_steps "$STEPS" --seeds $SEEDS \
    --variants ei_standard ei_entropy_invariant ei_ssmax \
               gau_softmax gau_softmax_plus gau_relu2_dynamic gau_relu2_fixed gau_relu2_normalized \
               gau_relu2_dynamic+mixed synthesizer_random_vanilla llama \
    --hidden_size 64 --num_hidden_layers 2 --num_attention_heads 4 \
    --per_device_train_batch_size 16 --learning_rate 2e-3 --num_warmup_steps 30 \
    --eval_mask_repeats 2 --finetune --num_threads "${THREADS:-1}" "$@"
}
WORKERS=${WORKERS:-1}
RESULTS=${RESULTS-length-study}
mkdir -p "$OUT"
STARTED=$SECONDS
run_workers study "$@"
for objective in mlm clm; do
  if [ -f "$OUT/lengthgen_$objective.png" ]; then
    cp "$OUT/lengthgen_$objective.png" "docs/${DOC_PLOT_PREFIX:-length_generalization}_$objective.png"
  fi
done
if [ -n "$RESULTS" ]; then
  COMMAND="WORKERS=$WORKERS SEEDS=\"$SEEDS\" STEPS=$STEPS L=$L scripts/run_length_study.sh${*:+ $*}"
  "$PY" tools/publish_study.py length "$OUT/results.json" "$RESULTS" --command "$COMMAND" \
    --wall-seconds "$((SECONDS - STARTED))" \
    || { echo "run_length_study.sh: publishing docs/results/$RESULTS.json failed (above)" >&2; exit 1; }
  "$PY" tools/render_docs.py \
    || { echo "run_length_study.sh: tools/render_docs.py failed (above): docs not rendered" >&2; exit 1; }
fi
echo "done: $OUT/results.md"
