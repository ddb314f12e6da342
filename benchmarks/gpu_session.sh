#!/usr/bin/env bash
# One call on the lent GPU machine (see docs/BENCHMARKS.md): equivalence table, mutation suite on
# real CUDA graphs, and the tp=1 full matrix through Ray with a GPU-pinned actor. Writes at most
# 8 files under $OUT (the device tool's limit). PROFILE_FILTER=expr adds benchmarks/gpu_profile.py
# on that slice, in-process, after the run (profile.txt).
#   carry .whl (../shared/tools/device-wheels), then: bash benchmarks/gpu_session.sh
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/orch-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
log=$OUT/all.log
{ date -u; nvidia-smi -L; python3 -c "import torch, triton, ray; print('torch', torch.__version__, 'triton', triton.__version__, 'ray', ray.__version__)"; } > "$log" 2>&1
step() { echo "== $* ($(date -u +%T))" >> "$log"; }

if [ "${SKIP_EQUIV:-0}" != 1 ]; then
  step equivalence
  timeout 120 python3 benchmarks/gpu_equivalence.py --out "$OUT/equivalence.json" >> "$log" 2>&1
fi
if [ "${SKIP_MUTANTS:-0}" != 1 ]; then
  step mutation suite and graph tests on the GPU
  timeout "${MUTANT_TIMEOUT:-200}" python3 -m pytest tests/checker/test_mutants.py tests/checker/test_checker.py tests/graphs \
      -k "not tp_gang" -q -p no:cacheprovider --junitxml="$OUT/mutants_gpu.xml" > "$OUT/mutants.log" 2>&1
  tail -3 "$OUT/mutants.log" >> "$log"
fi
step orch run full.yaml tp=1
# RESUME_DB=path RUN_ARGS="--resume N": continue run N of a store brought back from an earlier call.
[ -n "${RESUME_DB:-}" ] && cp "$RESUME_DB" "$OUT/gpu.db"
/usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-330}" python3 -m orchestrator.cli run matrices/full.yaml \
    --filter "${RUN_FILTER:-tp=1}" --devices gpu --db "$OUT/gpu.db" --out /tmp/orch-out \
    --junit "$OUT/junit.xml" --summary "$OUT/summary.md" --known-failures matrices/known-failures.yaml \
    --no-progress ${RUN_ARGS:-} > "$OUT/run.log" 2>&1
echo "rc=$?" >> "$OUT/run.log"
tail -25 "$OUT/run.log" >> "$log"
python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" "$OUT/gpu.db" 2>/dev/null
tar czf "$OUT/dashboard.tgz" -C /tmp/orch-out . 2>/dev/null
if [ -n "${PROFILE_FILTER:-}" ]; then
  # After the run (so the run's figures include Triton's first compilations): where time goes.
  step profile "$PROFILE_FILTER"
  timeout "${PROFILE_TIMEOUT:-120}" python3 benchmarks/gpu_profile.py matrices/full.yaml --filter "$PROFILE_FILTER" \
      --devices gpu --top 25 > "$OUT/profile.txt" 2>&1
  tail -4 "$OUT/profile.txt" | head -2 >> "$log"
fi
step done
