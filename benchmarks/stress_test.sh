#!/usr/bin/env bash
# The test suite on a busy machine: one core is kept busy by a CPU hog while the suite runs, RUNS times in a
# row. Capacity is a benchmark's business; tests check behaviour, so they must pass like this every time.
#
#   bash benchmarks/stress_test.sh [RUNS] [COMMAND...]     (make test-stress: 3 runs of `bash .ci/run`)
#
# Prints each run's exit code and wall time, pytest's slowest tests, and a summary line; exits non-zero if
# any run failed. Logs go to ${STRESS_LOG_DIR:-out/stress}/run-N.log, with what each passing test printed
# (its measured figures: pytest -rP), to see how close each came to its bound.
set -u
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
if [ $# -gt 0 ]; then command=("$@"); else command=(bash .ci/run); fi
logs=${STRESS_LOG_DIR:-out/stress}
mkdir -p "$logs"

hog_pid=""
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null; hog_pid=""; }
trap stop_hog EXIT INT TERM

failed=0
for run in $(seq 1 "$runs"); do
  # One busy core for the whole run (bounded: it ends by itself after 30 minutes).
  timeout 1800 sh -c 'while :; do :; done' &
  hog_pid=$!
  started=$(date +%s)
  PYTEST_ARGS="${PYTEST_ARGS:---durations=15 -rsP}" "${command[@]}" >"$logs/run-$run.log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - started ))
  stop_hog
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  echo "run $run/$runs: exit $rc in ${elapsed} s (one core busy) — $(grep -E '^=+ .*(passed|failed).* =+$' "$logs/run-$run.log" | tail -n 1)"
  grep -A 17 -E '^=+ slowest' "$logs/run-$run.log" | sed 's/^/    /' | tail -n +2
done
echo "stress: $((runs - failed)) of $runs runs passed with one core busy (logs in $logs/)"
[ "$failed" -eq 0 ]
