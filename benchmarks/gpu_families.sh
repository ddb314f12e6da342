#!/usr/bin/env bash
# The attention families on the lent GPU machine, in steps that fit one or
# two device calls on a warm machine:
#   carry .whl (../shared/tools/device-wheels), then: STEPS="probes runs" bash benchmarks/gpu_families.sh
#                                               then: STEPS="tests" bash benchmarks/gpu_families.sh
# probes  the emulation's probe corpus under real CUDA graphs (gpu_equivalence.py: golden_cuda.json)
# runs    `orch run full.yaml --filter 'tp=1 backend=torch,aiter-triton,aiter-triton-pa'` twice (cold
#         and warm Triton cache): the gqa slice, the MLA block and the swa_sinks block in one run, so
#         their time per case compares on one machine (benchmarks/family_times.py reads the store)
# tests   the MLA, swa_sinks and hybrid_gdn mutation suites, the stray-write test (3 seeds, every
#         padding mode) and the family op tests on real CUDA graphs (pytest on the GPU device)
# hybrid  the hybrid GDN family alone, in one call: `orch run full.yaml --filter 'tp=1 backend=torch
#         attention=gqa,hybrid_gdn'` (the hybrid tp 1 slice beside gqa's torch slice: time a case,
#         family_times.py) and the hybrid_gdn mutation suite, reference and steps on CUDA graphs
# Writes $OUT/families.log (a line per step, each step's summary) and $OUT/families.tgz (stores,
# logs, JSON, JUnit), within the device tool's 8-file limit. Per-step timeouts.
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-families; mkdir -p "$R"
log=$OUT/families.log
touch "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
pack() { tar czf "$OUT/families.tgz" -C "$R" . 2>/dev/null; cp "$log" "$R/" 2>/dev/null; }
FILTER=${FAMILY_FILTER:-tp=1 backend=torch,aiter-triton,aiter-triton-pa}
STEPS=${STEPS:-probes runs tests}

for s in $STEPS; do
  case $s in
    probes)
      step "probes: the corpus under CUDA graphs"
      timeout 150 python3 benchmarks/gpu_equivalence.py --out "$R/golden_cuda.json" > "$R/equivalence.log" 2>&1
      echo "rc=$?" >> "$R/equivalence.log"; tail -8 "$R/equivalence.log" >> "$log"; pack ;;
    runs)
      for run in cold warm; do
        step "orch run full.yaml --filter '$FILTER' ($run Triton cache)"
        /usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-220}" python3 -m orchestrator.cli run \
            matrices/full.yaml --filter "$FILTER" --devices gpu --db "$R/$run.db" \
            --known-failures matrices/known-failures.yaml --no-progress --out "$R/$run-out" > "$R/$run.log" 2>&1
        echo "rc=$?" >> "$R/$run.log"; grep -v "^    repro:" "$R/$run.log" | tail -8 >> "$log"
        single_file_db "$R/$run.db"
        python3 benchmarks/family_times.py "$R/$run.db" >> "$log" 2>&1; pack
      done ;;
    tests)
      step "family mutation suites, stray write, op tests on the GPU"
      timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -n 4 tests/families tests/checker/test_stray_write.py \
          -k "not tp_gang and not on_a_tp_gang and not replicates" -q -p no:cacheprovider \
          --junitxml="$R/families_gpu.xml" > "$R/tests.log" 2>&1
      echo "rc=$?" >> "$R/tests.log"; grep -E "passed|failed|FAILED|Error|rc=" "$R/tests.log" | tail -30 >> "$log"; pack ;;
    hybrid)
      step "hybrid_gdn: the tp 1 slice beside gqa's torch slice, then its suites on the GPU"
      /usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-220}" python3 -m orchestrator.cli run \
          matrices/full.yaml --filter "tp=1 backend=torch attention=gqa,hybrid_gdn" --devices gpu --db "$R/hybrid.db" \
          --no-progress --out "$R/hybrid-out" > "$R/hybrid.log" 2>&1
      echo "rc=$?" >> "$R/hybrid.log"; grep -v "^    repro:" "$R/hybrid.log" | tail -8 >> "$log"
      single_file_db "$R/hybrid.db"
      python3 benchmarks/family_times.py "$R/hybrid.db" >> "$log" 2>&1
      timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -n 4 tests/families/test_gdn_mutants.py \
          tests/families/test_gdn_reference.py tests/families/test_gdn_steps.py -k "not tp_gang" -q \
          -p no:cacheprovider --junitxml="$R/hybrid_gpu.xml" > "$R/hybrid_tests.log" 2>&1
      echo "rc=$?" >> "$R/hybrid_tests.log"; grep -E "passed|failed|FAILED|Error|rc=" "$R/hybrid_tests.log" | tail -30 >> "$log"
      pack ;;
  esac
done
step done
pack
