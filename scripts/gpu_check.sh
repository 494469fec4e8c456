#!/usr/bin/env bash
# Every GPU number in one command, on a machine with one CUDA GPU and no network (CONTRIBUTING.md, "The GPU
# check").
#
#   bash scripts/gpu_check.sh               # both parts, about 10 minutes: on a lease, whose commands
#                                           # stop at 10 minutes, run the two parts as two commands
#   bash scripts/gpu_check.sh --part tests  # environment, tests, wheel: under 5 minutes
#   bash scripts/gpu_check.sh --part perf   # environment, bench, peers, decoding: under 5 minutes
#   bash scripts/gpu_check.sh --dry-run     # the same steps on CPU, tiny sizes, CUDA parts skipped
#                                           # (tests/test_gpu_check.py)
#   bash scripts/gpu_check.sh --out DIR     # results folder (default: $OUT when set, else runs/gpu-check)
#
# Stages, each under a time budget and each writing its results file as soon as it has something to save:
#   environment  environment-gpu.json GPU, driver, a bf16 matrix-product speed, package versions, wheels
#   tests        tests-gpu.json       the CUDA tests (scripts/gpu_check.py: CUDA_TESTS), then the model tests
#                                     on CPU tensors (CPU_TESTS); every outcome written when pytest has it,
#                                     a crash kept with its traceback
#   wheel        wheel-gpu.json       the package's wheel resolved against this machine's torch, installed
#                                     without dependencies, the README quickstarts run from it, a saved
#                                     model reloaded through its remote code alone
#   bench        benchmarks-gpu.json  FLASH (Triton, torch path, packed documents) vs Llama at 4k, 16k and
#                                     64k; then entropy-invariant vs Llama 2k-16k
#   peers        peers-gpu.json       FLASH causal LM (Triton, torch path) vs FLASH-pytorch vs Llama at 16 x 4k,
#                                     4 x 16k, 1 x 64k tokens, fwd+bwd with the same chunked loss, MFU
#   decoding     decoding-gpu.json    generate tokens/s at batch 1 and 64, contexts 512 and 4096, dynamic
#                                     cache (and the static cache compiled at batch 1), a profile of each model
# plus gpu-check.log (everything printed) and stages.tsv (stage, verdict, seconds, budget): eight files.
#
# Wheels in .whl/ (`make gpu-wheels`) are installed into a scratch folder first and put on PYTHONPATH; without
# any the machine's own packages are used. The package itself comes from src/ (PYTHONPATH) for every stage but
# wheel, which installs its own wheel (.whl/hf_attn_variants-*.whl, or one built from this checkout).
# Publish what came back as a new run: python scripts/gpu_check.py publish DIR --title "what the run was"
# (docs/results/*-gpu-<run>.json, docs/benchmarks-gpu.md).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

DRY_RUN=0
PART=all
OUT_DIR="${OUT:-}"
while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out)
            [[ $# -ge 2 ]] || { echo "gpu_check.sh: --out needs a folder" >&2; exit 2; }
            OUT_DIR="$2"
            shift
            ;;
        --part)
            [[ $# -ge 2 && "$2" =~ ^(tests|perf|all)$ ]] || {
                echo "gpu_check.sh: --part takes tests, perf or all" >&2
                exit 2
            }
            PART="$2"
            shift
            ;;
        -h | --help) usage; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="${OUT_DIR:-runs/gpu-check}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOG="$OUT_DIR/gpu-check.log"
STAGES="$OUT_DIR/stages.tsv"
: >"$LOG"
printf 'stage\tverdict\tseconds\tbudget_s\n' >"$STAGES"

if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    if ((DRY_RUN)) && [[ -x .venv/bin/python ]]; then
        PYTHON=.venv/bin/python
    fi
fi

# Seconds per stage: each part's stages 290 s together, and the wheels' install (about 10 s) before them, so
# that a part fits 5 minutes and one lease can run a part and run it again. Inside a stage the most expensive optional work goes
# first when time runs short: the bench's longest lengths, the decoding stage's static-cache compiles.
case "$PART" in
    tests) STAGE_NAMES=(environment tests wheel) ;;
    perf) STAGE_NAMES=(environment bench peers decoding) ;;
    *) STAGE_NAMES=(environment tests wheel bench peers decoding) ;;
esac
declare -A BUDGET=(
    [environment]="${GPU_CHECK_BUDGET_ENVIRONMENT:-25}"
    [tests]="${GPU_CHECK_BUDGET_TESTS:-185}"
    [wheel]="${GPU_CHECK_BUDGET_WHEEL:-80}"
    [bench]="${GPU_CHECK_BUDGET_BENCH:-60}"
    [peers]="${GPU_CHECK_BUDGET_PEERS:-75}"
    [decoding]="${GPU_CHECK_BUDGET_DECODING:-130}"
)

SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT

say() {
    echo "gpu-check: $*" | tee -a "$LOG"
}

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
if ((DRY_RUN)); then
    # CPU only; GAU's Triton kernels in Triton's interpreter
    export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
    say "dry run on CPU ($PART): tiny sizes, CUDA tests skip, Triton interpreted"
else
    # Triton compiles for the GPU (tests/conftest.py keeps a set value)
    export TRITON_INTERPRET=0
fi

install_wheels() {
    local wheels=() site="$SCRATCH/site"
    shopt -s nullglob
    for wheel in .whl/*.whl; do
        [[ "${wheel##*/}" == hf_attn_variants-* ]] || wheels+=("$wheel")  # the wheel stage installs ours
    done
    shopt -u nullglob
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
    export GPU_CHECK_WHEELS=""
    if ((${#wheels[@]} == 0)); then
        say "wheels: none in .whl/, installing nothing: the installed packages are used"
        return 0
    fi
    say "wheels: installing ${#wheels[@]} from .whl/ into a scratch folder: ${wheels[*]##*/}"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}" 2>&1 | tee -a "$LOG"; then
        say "wheels: pip install of .whl/*.whl failed: going on with the installed packages"
        return 0
    fi
    if ! PYTHONPATH="$ROOT/src:$site${PYTHONPATH#"$ROOT/src"}" \
        "$PYTHON" -c "import hf_attn_variants, transformers" 2>&1 | tee -a "$LOG"; then
        say "wheels: importing hf_attn_variants with the wheels failed: going on with the installed packages"
        return 0
    fi
    export PYTHONPATH="$ROOT/src:$site${PYTHONPATH#"$ROOT/src"}"
    export GPU_CHECK_WHEELS="${wheels[*]##*/}"
}

FAILED=()
run_stage() {
    local name="$1" budget="$2" status verdict start="$SECONDS"
    shift 2
    say "stage $name: up to $budget s"
    set +e
    timeout --kill-after=10 "$budget" "$@" 2>&1 | tee -a "$LOG"
    status="${PIPESTATUS[0]}"
    set -e
    case "$status" in
        0) verdict=ok ;;
        1) verdict=failed ;;
        124 | 137) verdict="timed out" ;;
        *) verdict="error (exit status $status)" ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$verdict" "$((SECONDS - start))" "$budget" >>"$STAGES"
    say "stage $name: $verdict after $((SECONDS - start)) s"
    if [[ "$status" != 0 ]]; then
        FAILED+=("$name: $verdict")
    fi
}

install_wheels
dry=()
if ((DRY_RUN)); then
    dry=(--dry-run)
fi
for name in "${STAGE_NAMES[@]}"; do
    run_stage "$name" "${BUDGET[$name]}" "$PYTHON" scripts/gpu_check.py "$name" --out "$OUT_DIR" \
        --budget "${BUDGET[$name]}" ${dry[@]+"${dry[@]}"}
done

rm -f "$OUT_DIR"/*.tmp
results=("$OUT_DIR"/*)
say "results in $OUT_DIR: ${results[*]##*/}"
say "publish them from the repository root: python scripts/gpu_check.py publish <that folder> --title '...'"
if ((${#FAILED[@]})); then
    say "done in $SECONDS s; not ok: $(IFS=';'; echo "${FAILED[*]}")"
    exit 1
fi
say "done in $SECONDS s; every stage ok"
