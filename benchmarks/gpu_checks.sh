#!/usr/bin/env bash
# One call on the lent GPU machine for the checker's own evidence: the
# probe corpus under real CUDA graphs (golden table), what the checks measure for correct
# providers and near-threshold mutants (tolerance table), the spec-decode cases, padded rows,
# and the mutation suite on real graphs. Optionally first the tp=1 matrix on a fresh machine
# (COLD_RUN=1: cold Triton cache, so it must come first) and again warm.
#   carry .whl (../shared/tools/device-wheels), then: bash benchmarks/gpu_checks.sh
# Writes $OUT/all.log (a line per step with its time, and each step's summary) and
# $OUT/results.tgz (every JSON/markdown/log/junit the steps wrote), within the device tool's
# 8-file limit. Per-step timeouts: a slow step cannot take the others with it.
# Environment: COLD_RUN=1, RUN_FILTER (tp=1), SKIP_EQUIV, SKIP_TOL, SKIP_SPEC, SKIP_PADDED,
# SKIP_MUTANTS (=1 to skip), TOL_ARGS, SPEC_ARGS, PROFILE_FILTER (a slice to profile in one process).
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-results; mkdir -p "$R"
log=$OUT/all.log
: > "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
pack() { tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }
filter=${RUN_FILTER:-tp=1}
step "driver start-up: GPUs asked of the driver without torch; orch plan on the GPU"
python3 -c "import sys, time; t = time.perf_counter(); from backend.attention import capabilities as c; print('driver_gpu_count', c.driver_gpu_count(), 'gpu_visible', c.gpu_visible(), 'local_gpu_count', c.local_gpu_count(), 'torch imported', 'torch' in sys.modules, f'{time.perf_counter() - t:.3f}s')" >> "$log" 2>&1
/usr/bin/time -f "orch plan --devices gpu: wall %e s" python3 -m orchestrator.cli plan matrices/full.yaml --devices gpu --json > /dev/null 2>> "$log"

orch_run() {  # name, extra args...
  local name=$1; shift
  /usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-240}" python3 -m orchestrator.cli run \
      matrices/full.yaml --filter "$filter" --devices gpu --db "$R/$name.db" \
      --known-failures matrices/known-failures.yaml --no-progress "$@" > "$R/$name.log" 2>&1
  echo "rc=$?" >> "$R/$name.log"
  local wdir; wdir=$(ls -td /tmp/orch-workers-* 2>/dev/null | head -1)  # the run's worker logs
  [ -n "$wdir" ] && [ -f "$wdir/precompile.log" ] && cp "$wdir/precompile.log" "$R/$name-precompile.log" \
      && grep -E "over|already|done" "$R/$name-precompile.log" >> "$log"
  grep -v "^    repro:\|^orch: ERROR" "$R/$name.log" | tail -12 >> "$log"
  single_file_db "$R/$name.db"
}

if [ "${COLD_RUN:-0}" = 1 ]; then
  step "orch run full.yaml --filter $filter (fresh machine, cold Triton cache)"
  orch_run cold --out "$R/orch-out" --junit "$R/junit.xml" --summary "$R/summary.md"
  step "orch run full.yaml --filter $filter again (warm Triton cache)"
  orch_run warm
  pack
fi
if [ -n "${PROFILE_FILTER:-}" ]; then
  step "profile: $PROFILE_FILTER in one process (cProfile; then the kernel floor under torch.profiler; then host syncs)"
  timeout "${PROFILE_TIMEOUT:-150}" python3 benchmarks/gpu_profile.py matrices/full.yaml --filter "$PROFILE_FILTER" \
      --devices gpu --top 40 --bare --kernels --syncs > "$R/profile.txt" 2>&1
  echo "rc=$?" >> "$R/profile.txt"; grep -E "^bare|cases in|seconds by phase|kernel floor|^syncs|rc=" "$R/profile.txt" >> "$log"; pack
fi
if [ "${SKIP_EQUIV:-0}" != 1 ]; then
  step "equivalence: probe corpus under CUDA graphs"
  timeout 150 python3 benchmarks/gpu_equivalence.py --out "$R/golden_cuda.json" > "$R/equivalence.log" 2>&1
  echo "rc=$?" >> "$R/equivalence.log"; tail -8 "$R/equivalence.log" >> "$log"; pack
fi
if [ "${SKIP_TOL:-0}" != 1 ]; then
  step "tolerances: correct providers and near-threshold mutants"
  # shellcheck disable=SC2086
  OUT=$R timeout "${TOL_TIMEOUT:-170}" python3 benchmarks/gpu_tolerances.py ${TOL_ARGS:-} > "$R/tolerances.log" 2>&1
  echo "rc=$?" >> "$R/tolerances.log"; tail -20 "$R/tolerances.log" >> "$log"; pack
fi
if [ "${SKIP_SPEC:-0}" != 1 ]; then
  step "spec decode cases and mutants"
  # shellcheck disable=SC2086
  OUT=$R timeout "${SPEC_TIMEOUT:-150}" python3 benchmarks/gpu_spec_decode.py ${SPEC_ARGS:-} > "$R/spec_decode.log" 2>&1
  echo "rc=$?" >> "$R/spec_decode.log"; tail -8 "$R/spec_decode.log" >> "$log"; pack
fi
if [ "${SKIP_PADDED:-0}" != 1 ]; then
  step "padded rows"
  timeout 90 python3 benchmarks/gpu_padded_rows.py > "$R/padded_rows.log" 2>&1
  echo "rc=$?" >> "$R/padded_rows.log"; tail -30 "$R/padded_rows.log" >> "$log"; pack
fi
if [ "${SKIP_MUTANTS:-0}" != 1 ]; then
  step "mutation suite and graph tests on the GPU"
  timeout "${MUTANT_TIMEOUT:-200}" python3 -m pytest -n 4 tests/checker/test_mutants.py tests/checker/test_verdict_rules.py \
      tests/checker/test_load_bearing.py tests/checker/test_checker.py tests/graphs -k "not tp_gang" -q \
      -p no:cacheprovider --junitxml="$R/mutants_gpu.xml" > "$R/mutants.log" 2>&1
  echo "rc=$?" >> "$R/mutants.log"; grep -E "passed|failed|FAILED|Error|rc=" "$R/mutants.log" | tail -25 >> "$log"; pack
fi
step done
pack
