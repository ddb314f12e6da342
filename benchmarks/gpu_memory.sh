#!/usr/bin/env bash
# Device memory on the lent GPU machine (an H100 80GB: the H200 hides the problem), in steps that fit
# one device call each on a warm machine:
#   carry .whl (../shared/tools/device-wheels), then: STEPS="runs packed" bash benchmarks/gpu_memory.sh
#                                               then: STEPS="small alone" bash benchmarks/gpu_memory.sh
# runs    the families' tp 1 slice (FAMILY_FILTER, as gpu_families.sh) cold then warm, one worker
#         per GPU (the default): no out-of-memory anywhere, gate passed
# packed  the same slice warm with --workers-per-gpu auto (WPG to force a number) into a copy of the
#         warm store (PACKED_FROM=cold: of the cold one; auto packs by the needs that run recorded): the
#         same verdicts, and the `time:` lines of both runs give the cases phase side by side; MPS=1
#         starts NVIDIA's MPS daemon first (the workers' kernels share one context instead of
#         time-slicing the device between processes)
# cold, warm  one run each (the runs step's two), each followed by its memory report
# trace   benchmarks/memory_trace.py on the slice (one process, no Ray): what stays allocated once
#         every session is dropped, and where it was allocated
# small   the slice under --gpu-memory 24 (a 24 GiB card): the same verdicts as the warm run
# alone   each family of the slice in a run of its own: the same verdicts as the combined run
# RUN_ARGS: more `orch run` options for every run (e.g. `--gpu-memory 80` on an H200: an H100's
# budget, for a diagnosis only; the figures in docs/BENCHMARKS.md come from an H100).
# Writes $OUT/memory.log (a line per step, each run's last lines, benchmarks/memory_report.py) and
# $OUT/memory.tgz (the stores and logs). Per-step timeouts.
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-memory; mkdir -p "$R"
log=$OUT/memory.log
touch "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
pack() { tar czf "$OUT/memory.tgz" -C "$R" . 2>/dev/null; cp "$log" "$R/" 2>/dev/null; }
FILTER=${FAMILY_FILTER:-tp=1 backend=torch,aiter-triton,aiter-triton-pa}
STEPS=${STEPS:-runs packed small alone}
orch_run() {  # NAME DB FILTER [ARGS...]: one run, its last lines and time: line into the log
  local name=$1 db=$2 filter=$3; shift 3
  step "orch run full.yaml --filter '$filter' ${RUN_ARGS:-} $* ($name)"
  /usr/bin/time -f "wall %e s, max rss %M KB" timeout "${RUN_TIMEOUT:-240}" python3 -m orchestrator.cli run \
      matrices/full.yaml --filter "$filter" --devices gpu --db "$db" --known-failures matrices/known-failures.yaml \
      --no-progress --out "$R/$name-out" ${RUN_ARGS:-} "$@" > "$R/$name.log" 2>&1
  echo "rc=$?" >> "$R/$name.log"; grep -v "^    repro:" "$R/$name.log" | grep -E "time:|run [0-9]+|workers per GPU|worker|rc=|wall" | tail -6 >> "$log"
  single_file_db "$db"
}

for s in $STEPS; do
  case $s in
    runs)
      orch_run cold "$R/cold.db" "$FILTER"
      orch_run warm "$R/warm.db" "$FILTER"
      python3 benchmarks/memory_report.py "$R/warm.db" "$R/cold.db" >> "$log" 2>&1; pack ;;
    cold|warm)
      orch_run "$s" "$R/$s.db" "$FILTER"
      python3 benchmarks/memory_report.py "$R/$s.db" >> "$log" 2>&1; pack ;;
    trace)
      step "memory_trace.py: the slice in one process, what stays allocated"
      timeout "${TRACE_TIMEOUT:-150}" python3 benchmarks/memory_trace.py matrices/full.yaml --filter "$FILTER" \
          --devices gpu --history --budget-s "${TRACE_S:-110}" ${RUN_ARGS:-} > "$R/trace.log" 2>&1
      echo "rc=$?" >> "$R/trace.log"; grep -E "^-- drop|live:|GiB  |allocator|budget|cases in|rc=" "$R/trace.log" | head -40 >> "$log"; pack ;;
    packed)
      if [ "${MPS:-0}" = 1 ] && command -v nvidia-cuda-mps-control > /dev/null; then  # several processes, one context
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d && step "MPS daemon started" || step "MPS daemon did not start"
      fi
      cp "$R/${PACKED_FROM:-warm}.db" "$R/packed.db"
      orch_run packed "$R/packed.db" "$FILTER" --workers-per-gpu "${WPG:-auto}"
      python3 benchmarks/memory_report.py "$R/warm.db" "$R/packed.db" >> "$log" 2>&1; pack ;;
    small)
      orch_run small "$R/small.db" "$FILTER" --gpu-memory 24
      python3 benchmarks/memory_report.py "$R/warm.db" "$R/small.db" >> "$log" 2>&1; pack ;;
    alone)
      for fam in gqa mla swa_sinks; do orch_run "alone-$fam" "$R/alone.db" "$FILTER attention=$fam"; done
      python3 benchmarks/memory_report.py "$R/warm.db" "$R/alone.db" >> "$log" 2>&1; pack ;;
  esac
done
step done
pack
