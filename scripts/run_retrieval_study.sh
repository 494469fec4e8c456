#!/usr/bin/env bash
# Re-run the retrieval study (passkey and MQAR) published in docs/length_generalization.md ("Retrieval
# tasks").
#
# Every applicable variant (the ei_* scales, the gau_* normalisations, FLASH chunked relu², the Synthesizer
# and the stock Llama with its three evaluation modes) x position scheme (RoPE, none; the Llama is RoPE only)
# x seed, trained at L on the task and scored by exact-match accuracy at L, 2L ... 64L. CPU-sized: about 30
# minutes with WORKERS=2 on a shared 2-core CPU. Resumable: rerunning skips finished runs
# (runs/<series>/seed_<s>/result.json). Results: $OUT/{passkey,mqar}/results.md, results.json, results.csv,
# summary.csv, lengthgen_<task>.png; the combined plot goes to docs/length_generalization_retrieval.png and
# the numbers the docs show to docs/results/$RESULTS.json (default retrieval-study; RESULTS= to skip),
# rendered by `python tools/render_docs.py`.
#
#   scripts/run_retrieval_study.sh                  # defaults below (seeds 0 1 2)
#   WORKERS=2 scripts/run_retrieval_study.sh        # two processes share the runs (run folders are locked)
#   TASKS=passkey SEEDS="0 1" scripts/run_retrieval_study.sh --variants ei_standard ei_entropy_invariant
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_workers.sh
source scripts/study_workers.sh
OUT=${OUT:-runs/retrieval_study}
SEEDS=${SEEDS:-"0 1 2"}
TASKS=${TASKS:-"passkey mqar"}
L=${L:-32}
STEPS=${STEPS:-}
MEMORY=${MEMORY:-3}
# The published study predates lengthgen's MQAR defaults (1,500 steps, the first 750 on the copy warm-up):
# its MQAR runs are 500 steps without the warm-up, unless STEPS or MQAR_WARMUP say otherwise.
MQAR_WARMUP=${MQAR_WARMUP:-0}
study() {
  local task=$1 budget=()
  shift
  if [ "$task" = mqar ]; then
    budget=(--max_train_steps "${STEPS:-500}" --copy_warmup_steps "$MQAR_WARMUP")
  elif [ -n "$STEPS" ]; then
    budget=(--max_train_steps "$STEPS")
  fi
  # shellcheck disable=SC2086
  "$PY" -m hf_attn_variants lengthgen --task "$task" \
    --output_dir "$OUT/$task" --train_length "$L" --seeds $SEEDS "${budget[@]}" \
    --eval_memory_gib "$MEMORY" --num_threads "${THREADS:-1}" --disable_tqdm "$@"
}
all_tasks() {
  for task in $TASKS; do
    study "$task" "$@"
  done
}
WORKERS=${WORKERS:-1}
RESULTS=${RESULTS-retrieval-study}
mkdir -p "$OUT"
STARTED=$SECONDS
run_workers all_tasks "$@"
if [ -n "$RESULTS" ]; then
  COMMAND="WORKERS=$WORKERS SEEDS=\"$SEEDS\" L=$L${STEPS:+ STEPS=$STEPS}"
  [ "$MQAR_WARMUP" = 0 ] || COMMAND+=" MQAR_WARMUP=$MQAR_WARMUP"
  COMMAND+=" scripts/run_retrieval_study.sh${*:+ $*}"
  FILES=()
  for task in $TASKS; do FILES+=("$OUT/$task/results.json"); done
  "$PY" tools/publish_study.py retrieval "$RESULTS" "${FILES[@]}" --command "$COMMAND" \
    --wall-seconds "$((SECONDS - STARTED))" --plot docs/length_generalization_retrieval.png \
    || { echo "run_retrieval_study.sh: publishing docs/results/$RESULTS.json failed (above)" >&2; exit 1; }
  "$PY" tools/render_docs.py \
    || { echo "run_retrieval_study.sh: tools/render_docs.py failed (above): docs not rendered" >&2; exit 1; }
fi
echo "done: $OUT/<task>/results.md"
