#!/usr/bin/env bash
# The gate at GPU speed, on the lent GPU machine, in one device call (< 10 min with a warm Triton
# cache): each slice with one worker per GPU and with `--workers-per-gpu auto` (the default), side
# by side, and whether their verdicts are identical.
#   carry .whl (../shared/tools/device-wheels), then, on a fresh machine:
#     STEPS=warmup bash benchmarks/gpu_speed.sh     the families' slice once: compiles the Triton
#                                                   kernels into the cache and records the cases'
#                                                   memory needs and durations (auto packs by them)
#   then, on the same warm machine:
#     bash benchmarks/gpu_speed.sh                  STEPS="torch families" (default)
# torch     --filter 'tp=1 backend=torch' (245 cases), 1 worker per GPU then auto
# base      the torch slice with 1 worker from an older tree (BASE, default .base, git-ignored:
#           mkdir .base && git archive <commit> | tar -x -C .base; carry [".whl", ".base"]), its
#           verdicts against torch-1's: `STEPS="torch base"` is this tree's work against that one
#           on the same machine, in one call; base:N (base:auto) the same with N workers per GPU
# auto      the torch slice with auto only (its verdicts against the warm-up's)
# mps       the torch slice with auto under NVIDIA's MPS daemon (the workers' kernels share one
#           context instead of time-slicing the device), its verdicts against the warm-up's
# WARMUP_FILTER: the warm-up's slice (default the families'): WARMUP_FILTER='tp=1 backend=torch'
#           STEPS="warmup auto families" is the torch slice 1 vs auto, then the families' slice
# auto:N, mps:N   the same with N workers per GPU instead of auto (runs torch-wN, torch-mpsN):
#           STEPS="warmup auto auto:2 mps mps:2" sizes the packing on one warm machine; after a
#           `torch` step their verdicts are compared with torch-1's (the warm-up may be another slice):
#           STEPS="torch auto:3 auto:4 families" on a machine warm from STEPS=warmup
# families  --filter 'tp=1 backend=torch,aiter-triton,aiter-triton-pa' (520 cases), 1 then auto
# Both runs of a slice start from a copy of the warm-up's store when there is one (the same
# history and memory needs), else from an empty one. RUN_ARGS: more `orch run` options for every
# run; AUTO: what the second run of each slice passes to --workers-per-gpu (default auto).
# For a dry run elsewhere: DEVICES=cpu MATRIX=matrices/smoke.yaml TORCH_FILTER=... FAMILY_FILTER=...
# Writes $OUT/speed.md (benchmarks/speed_table.py: wall, cases phase, GPU busy, per-phase medians,
# verdicts 1 vs auto), $OUT/speed.log (each run's worker, time: and last lines) and
# $OUT/speed.tgz (the stores and logs).
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-speed; mkdir -p "$R"
log=$OUT/speed.log
touch "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
pack() { tar czf "$OUT/speed.tgz" -C "$R" --exclude='*-out' . 2>/dev/null; }
TORCH=${TORCH_FILTER:-tp=1 backend=torch}
FAMILIES=${FAMILY_FILTER:-tp=1 backend=torch,aiter-triton,aiter-triton-pa}
MATRIX=${MATRIX:-matrices/full.yaml}
# Per-run limits that keep the four runs inside one 10-minute call (the H100 figures:
# torch slice 70 s with one worker, families' 151 s).
declare -A LIMIT=([warmup]=540 [torch]=110 [families]=170)
STEPS=${STEPS:-torch families}
orch_run() {  # NAME LIMIT FILTER [ARGS...]: one run into $R/NAME.db, its output in $R/NAME.log (TREE: whose code)
  local name=$1 limit=$2 filter=$3 tree=${TREE:-$PWD}; shift 3
  rm -f "$R/$name.db"
  [ -f "$R/warmup.db" ] && [ "$name" != warmup ] && cp "$R/warmup.db" "$R/$name.db"
  step "orch run $MATRIX --filter '$filter' ${RUN_ARGS:-} $* ($name)"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree /usr/bin/time -f "wall %e s, max rss %M KB" timeout "$limit" \
      python3 -m orchestrator.cli run "$MATRIX" --filter "$filter" --devices "${DEVICES:-gpu}" --db "$R/$name.db" \
      --known-failures matrices/known-failures.yaml --no-progress --out "$R/$name-out" ${RUN_ARGS:-} "$@" \
      > "$R/$name.log" 2>&1
    echo "rc=$?" >> "$R/$name.log")
  grep -v "^    repro:" "$R/$name.log" | grep -E "GPU worker|workers per GPU|time:|^run [0-9]+|rc=|wall" | tail -6 >> "$log"
  single_file_db "$R/$name.db"
}

rows=(); pairs=()
case " $STEPS " in *" warmup "*) ;; *)  # auto packs by recorded needs: a fresh store gets one worker
  [ -f "$R/warmup.db" ] || step "warning: no $R/warmup.db: auto runs start from an empty store and run one worker per GPU" ;;
esac
for s in $STEPS; do
  case $s in
    warmup) orch_run warmup "${LIMIT[warmup]}" "${WARMUP_FILTER:-$FAMILIES}"; rows+=("warmup=$R/warmup.db:$R/warmup.log") ;;
    torch|families)
      filter=$TORCH; [ "$s" = families ] && filter=$FAMILIES
      orch_run "$s-1" "${LIMIT[$s]}" "$filter" --workers-per-gpu 1
      orch_run "$s-auto" "${LIMIT[$s]}" "$filter" --workers-per-gpu "${AUTO:-auto}"
      rows+=("$s-1=$R/$s-1.db:$R/$s-1.log" "$s-auto=$R/$s-auto.db:$R/$s-auto.log")
      pairs+=(--same "$s-1,$s-auto")
      [ "$s" = torch ] && base_run=torch-1 ;;  # the later auto:N / mps runs' verdicts against it
    auto|auto:*)  # the torch slice packed, against the warm-up's one worker (STEPS="warmup auto mps",
      # FAMILY_FILTER set to the torch slice: one fresh one-worker run that records the needs, then auto)
      n=${s#auto}; n=${n#:}; name=torch-${n:+w$n}; name=${name%-}; [ -n "$n" ] || name=torch-auto
      orch_run "$name" "${LIMIT[torch]}" "$TORCH" --workers-per-gpu "${n:-${AUTO:-auto}}"
      rows+=("$name=$R/$name.db:$R/$name.log"); pairs+=(--same "${base_run:-warmup},$name") ;;
    mps|mps:*)
      n=${s#mps}; n=${n#:}; name=torch-mps$n
      if command -v nvidia-cuda-mps-control > /dev/null; then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d && step "MPS daemon started" || step "MPS daemon did not start"
        orch_run "$name" "${LIMIT[torch]}" "$TORCH" --workers-per-gpu "${n:-${AUTO:-auto}}"
        echo quit | nvidia-cuda-mps-control
        for _ in $(seq 20); do pgrep -x nvidia-cuda-mps > /dev/null || break; sleep 0.5; done  # before the next start
        step "MPS daemon stopped"
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        rows+=("$name=$R/$name.db:$R/$name.log"); pairs+=(--same "${base_run:-warmup},$name")
      else
        step "no nvidia-cuda-mps-control"
      fi ;;
    base|base:*)
      base=$(cd "${BASE:-.base}" 2> /dev/null && pwd) || { echo "== no old tree at ${BASE:-.base}" >> "$log"; continue; }
      n=${s#base}; n=${n#:}; n=${n:-1}
      TREE=$base orch_run "base-$n" "${LIMIT[torch]}" "$TORCH" --workers-per-gpu "$n"
      rows+=("base-$n=$R/base-$n.db:$R/base-$n.log"); pairs+=(--same "base-$n,${base_run:-warmup}") ;;
  esac
  pack
done
python3 benchmarks/speed_table.py "${rows[@]}" "${pairs[@]}" --out "$OUT/speed.md" >> "$log" 2>&1
step done
pack
