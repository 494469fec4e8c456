#!/usr/bin/env bash
# The length-generalisation study at L = 512 (issue 49), part 1 or 2, in one command per GPU lease
# (CONTRIBUTING.md, "The GPU study"; docs/length_generalization.md, "The study at a real scale").
#
#   bash scripts/gpu_study.sh                 # on a lease: builds the corpus, times every variant, trains and
#                                             # evaluates the runs not committed yet until the deadline
#   bash scripts/gpu_study.sh --dry-run       # the same steps on CPU at tiny sizes, under a minute
#                                             # (tests/test_gpu_study.py), then publishes into the folder
#   bash scripts/gpu_study.sh --out DIR       # results folder (default: $OUT when set, else runs/gpu-study)
#   bash scripts/gpu_study.sh --part 2        # part 2, retrieval: passkey and MQAR models (default: part 1,
#                                             # the language model); one part per lease
#
# Other arguments go to `python scripts/gpu_study.py run` (--budget S, --deadline S, --seeds …, --steps N).
# What comes back (at most 5 files), part 1: gpu-study-runs.jsonl (one line per finished run),
# gpu-study-plan.json, gpu-study.log, and with --dry-run gpu-study-results.md and gpu-study-perplexity.png;
# part 2 the same with gpu-study-retrieval instead of gpu-study (…-retrieval-accuracy.png).
# After a lease, here: python scripts/gpu_study.py absorb DIR, then commit docs/results/gpu-study/*.jsonl.
set -euo pipefail
export GPU_STUDY_T0="${GPU_STUDY_T0:-$(date +%s)}"  # the deadline counts from here, as the lease's limit does

DRY_RUN=0
PART=1
OUT_DIR="${OUT:-}"
PASS=()
while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out)
            [[ $# -ge 2 ]] || { echo "gpu_study.sh: --out needs a folder" >&2; exit 2; }
            OUT_DIR="$2"
            shift
            ;;
        --part)
            [[ $# -ge 2 && ("$2" == 1 || "$2" == 2) ]] || {
                echo "gpu_study.sh: --part must be 1 (the language model) or 2 (retrieval), got '${2:-}'" >&2
                exit 2
            }
            PART="$2"
            shift
            ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) PASS+=("$1") ;;
    esac
    shift
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="${OUT_DIR:-runs/gpu-study}"
if [[ -e "$OUT_DIR" && ! -d "$OUT_DIR" ]]; then
    echo "gpu_study.sh: --out: '$OUT_DIR' is a file, not a folder" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    if ((DRY_RUN)) && [[ -x .venv/bin/python ]]; then
        PYTHON=.venv/bin/python
    fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
if ((DRY_RUN)); then
    export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
    # tiny models: more threads only wait on each other (10 times slower on two busy cores)
    export OMP_NUM_THREADS=1
    PASS=(--dry-run ${PASS[@]+"${PASS[@]}"})
fi
LOG="$OUT_DIR/gpu-study.log"
((PART == 1)) || LOG="$OUT_DIR/gpu-study-retrieval.log"
set +e
"$PYTHON" scripts/gpu_study.py run --part "$PART" --out "$OUT_DIR" ${PASS[@]+"${PASS[@]}"} 2>&1 | tee -a "$LOG"
status="${PIPESTATUS[0]}"
set -e
if ((DRY_RUN)) && [[ "$status" == 0 ]]; then
    "$PYTHON" scripts/gpu_study.py publish --part "$PART" --runs "$OUT_DIR" --out "$OUT_DIR" \
        2>&1 | tail -n 40 | tee -a "$LOG"
    status="${PIPESTATUS[0]}"
fi
rm -f "$OUT_DIR"/*.tmp
exit "$status"
