#!/usr/bin/env bash
# One call on the lent GPU machine (see docs/BENCHMARKS.md): the tp=1 full matrix through Ray with
# a GPU-pinned actor, optionally again with a warm Triton cache, then the equivalence table
# and the mutation suite on real CUDA graphs. Writes at most 8 files under $OUT (the device tool's
# limit): all.log, run.log, gpu.db, junit.xml, summary.md, dashboard.tgz, gpu_warm.db,
# mutants_gpu.xml (or profile.txt / equivalence.json in their place when asked for).
#   carry .whl (../shared/tools/device-wheels), then: bash benchmarks/gpu_session.sh
# Environment: RUN_FILTER (default tp=1), RUN_TIMEOUT, RUN_ARGS, RESUME_DB (continue a run of a
# store brought back: RESUME_DB=gpu.db RUN_ARGS="--resume 1"), WARM_RUN=1 (the main run again, warm Triton cache: gpu_warm.db; set
# RUN_LOG=/tmp/run.log to stay within 8 files), SKIP_RUN=1, SKIP_EQUIV=1, SKIP_MUTANTS=1, PROFILE_FILTER=expr
# (benchmarks/gpu_profile.py on that slice, in-process, after the runs).
set -u
. benchmarks/gpu_env.sh
log=$OUT/all.log
: > "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
filter=${RUN_FILTER:-tp=1}

orch_run() {  # db, log, extra args...
  local db=$1 out=$2; shift 2
  /usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-330}" python3 -m orchestrator.cli run \
      matrices/full.yaml --filter "$filter" --devices gpu --db "$db" --known-failures matrices/known-failures.yaml \
      --no-progress "$@" > "$out" 2>&1
  echo "rc=$?" >> "$out"
  grep -v "^    repro:\|^orch: ERROR" "$out" | tail -12 >> "$log"
  single_file_db "$db"
}

if [ "${SKIP_RUN:-0}" != 1 ]; then
  step orch run full.yaml "$filter" "${RUN_ARGS:-}"
  [ -n "${RESUME_DB:-}" ] && cp "$RESUME_DB" "$OUT/gpu.db"
  # shellcheck disable=SC2086
  orch_run "$OUT/gpu.db" "${RUN_LOG:-$OUT/run.log}" --out /tmp/orch-out --junit "$OUT/junit.xml" --summary "$OUT/summary.md" ${RUN_ARGS:-}
  tar czf "$OUT/dashboard.tgz" -C /tmp/orch-out . 2>/dev/null
fi
if [ "${WARM_RUN:-0}" = 1 ]; then
  # The same run again: Triton's kernel cache (~/.triton) is warm now, as on a GPU runner that
  # has run the gate before.
  step orch run full.yaml "$filter" again, warm Triton cache
  orch_run "$OUT/gpu_warm.db" /tmp/run_warm.log --out /tmp/orch-out-warm
fi
if [ "${SKIP_EQUIV:-0}" != 1 ]; then
  step equivalence
  timeout 120 python3 benchmarks/gpu_equivalence.py --out "$OUT/equivalence.json" >> "$log" 2>&1
fi
if [ "${SKIP_MUTANTS:-0}" != 1 ]; then
  step mutation suite and graph tests on the GPU
  timeout "${MUTANT_TIMEOUT:-200}" python3 -m pytest tests/checker/test_mutants.py tests/checker/test_checker.py tests/graphs \
      -k "not tp_gang" -q -p no:cacheprovider --junitxml="$OUT/mutants_gpu.xml" > /tmp/mutants.log 2>&1
  grep -E "passed|failed|FAILED|Error" /tmp/mutants.log | tail -15 >> "$log"
fi
if [ -n "${PROFILE_FILTER:-}" ]; then
  step profile "$PROFILE_FILTER"
  timeout "${PROFILE_TIMEOUT:-120}" python3 benchmarks/gpu_profile.py matrices/full.yaml --filter "$PROFILE_FILTER" \
      --devices gpu --top 25 > "$OUT/profile.txt" 2>&1
  grep -A1 "cases in" "$OUT/profile.txt" >> "$log"
fi
step done
