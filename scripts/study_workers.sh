# Sourced by the study scripts (run_length_study.sh, run_retrieval_study.sh, run_hybrid_study.sh,
# run_entropy_study.sh); not run by itself.
#
# What every study shares: one torch thread per process (the workers share the cores), and $PY, the project's
# Python (or the caller's).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}

# run_workers COMMAND [ARGS...]: COMMAND in $WORKERS processes that share the study's run folders (each run
# folder is claimed by one process; the others skip it, logging to $OUT/.worker_<i>.log), then, with more than
# one worker, once more here: every run is finished by then, so this pass reuses them all and writes the
# complete outputs. The logs are hidden names: a run refuses an output folder holding files that no run wrote,
# and hidden names are not counted.
run_workers() {
  local i
  mkdir -p "$OUT"
  for i in $(seq 2 "$WORKERS"); do
    "$@" > "$OUT/.worker_$i.log" 2>&1 &
  done
  "$@"
  wait
  if [ "$WORKERS" -gt 1 ]; then
    "$@"
  fi
}
