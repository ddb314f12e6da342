#!/usr/bin/env bash
# Two `orch run --address auto` drivers on one GPU machine: a persistent Ray head (as a
# CI GPU runner keeps one), then two runs of two halves of the gqa tp 1 torch slice, first one
# after the other, then both at once into one store; every case of every run recorded once, and
# the walls side by side. One device call, about 3 minutes on an H100:
#   carry .whl (../shared/tools/device-wheels), then: bash benchmarks/gpu_two_drivers.sh
# Environment: STORE (default $OUT/two.db, a SQLite file both drivers write; a postgresql:// URL
# works where psycopg and a server are there), SLICE (default 'tp=1 attention=gqa backend=torch'),
# RUN_ARGS (more `orch run` options for both drivers, e.g. the GPU-memory issue's worker packing),
# DEVICES (default gpu; cpu tries the script on a machine without one).
# Writes $OUT/two_drivers.log (walls, verdicts, the every-case-once check), $OUT/two.db and
# $OUT/two_drivers.tgz (each driver's log and outputs): 3 files.
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-two; rm -rf "$R"; mkdir -p "$R"
log=$OUT/two_drivers.log
: > "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
STORE=${STORE:-$OUT/two.db}
SLICE=${SLICE:-tp=1 attention=gqa backend=torch}
PORT=6390
export RAY_AUTH_MODE=token  # drivers and head alike: token auth stays on

step "ray head (1 GPU, torch preloaded in its idle workers)"
RAY_preload_python_modules=torch setsid python3 -m ray.scripts.scripts start --head --block --port=$PORT \
    --num-gpus=1 --temp-dir="$R/ray" --include-dashboard=false --disable-usage-stats > "$R/head.log" 2>&1 &
HEAD=$!
trap 'kill -TERM -- -$HEAD 2>/dev/null; sleep 3; kill -KILL -- -$HEAD 2>/dev/null' EXIT
for _ in $(seq 60); do
  python3 -c "import ray; ray.init(address='127.0.0.1:$PORT', log_to_driver=False); assert ray.cluster_resources().get('GPU')" \
      >/dev/null 2>&1 && break
  sleep 2
done
export RAY_ADDRESS=127.0.0.1:$PORT

drive() {  # name, kv dtype: one driver (its name is its label), its wall time on its last line
  local name=$1 kv=$2 t0; t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout 400 python3 -m orchestrator.cli run matrices/full.yaml --filter "$SLICE kv_cache_dtype=$kv" \
      --devices "${DEVICES:-gpu}" --address auto --db "$STORE" --label "$name" --no-progress \
      --known-failures matrices/known-failures.yaml \
      --out "$R/$name-out" ${RUN_ARGS:-} > "$R/$name.log" 2>&1
  echo "rc=$? wall $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s" >> "$R/$name.log"
}
summary() { for n in "$@"; do echo "-- $n: $(grep -E 'waiting for|got the' "$R/$n.log" | head -3 | tr '\n' ' ')"; tail -2 "$R/$n.log"; done >> "$log"; }

step "warm-up: the head's workers import torch and CUDA once (not timed)"
drive warm auto; tail -1 "$R/warm.log" >> "$log"

step "one after the other"
t0=$(date +%s.%N); drive seq-auto auto; drive seq-fp8 fp8; t1=$(date +%s.%N)
echo "sequential: both in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s" >> "$log"; summary seq-auto seq-fp8

step "both at once (two drivers, one GPU, one store)"
t0=$(date +%s.%N); drive par-auto auto & A=$!; drive par-fp8 fp8 & B=$!; wait $A $B; t1=$(date +%s.%N)
echo "concurrent: both in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s" >> "$log"; summary par-auto par-fp8

step "every case of every run recorded once"
python3 - "$STORE" >> "$log" 2>&1 <<'EOF'
import sys
from orchestrator.store import ResultStore
with ResultStore(sys.argv[1], readonly=True) as s:
    for run in s.runs():
        results = s.results(run.id)
        planned = [c.case_id for c in s.planned_cases(run.id)]
        once = sorted(r.case_id for r in results) == sorted(planned)
        logged = all(len(s.attempt_log(run.id, r.case_id)) == r.attempts for r in results)
        statuses = {}
        for r in results:
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
        print(f"run {run.id} [{run.label}] {run.status} {run.device_model!r}: {len(planned)} planned, every case once: "
              f"{once}, attempts logged: {logged}, {statuses}")
EOF
for kv in auto fp8; do  # the same verdicts alone and side by side
  python3 -m orchestrator.cli diff "$STORE#seq-$kv" "$STORE#par-$kv" | tail -2 >> "$log" 2>&1
done
case $STORE in *.db) single_file_db "$STORE" ;; esac
tar czf "$OUT/two_drivers.tgz" -C "$R" --exclude=ray . 2>/dev/null
step done
