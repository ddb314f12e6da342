#!/usr/bin/env bash
# One call on the lent GPU machine: this tree against an older one, same slice, same machine.
#   mkdir .base && git archive <old commit> | tar -x -C .base   # git-ignored; carry .whl and .base
#   bash benchmarks/gpu_ab.sh                        # device tool: carry [".whl", ".base"]
# Order on a fresh machine: Ray's start with and without the worker preload (cluster_bench), then
# old cold, new cold (each with its own empty TRITON_CACHE_DIR), old warm, new warm, old warm, new
# warm; then (SKIP_AUTO=0) a Ray head started with RAY_preload_python_modules=torch and two warm
# runs of this tree joining it (--address auto). Every run's verdicts are compared with the first's
# (diff_verdicts.py --checks). Writes $OUT/all.log and $OUT/res.tgz (the databases and run logs).
# Environment: BASE (.base), FILTER (the tp 1 slice of torch, aiter-triton, aiter-triton-pa),
# SKIP_AUTO (0), SKIP_CLUSTER_BENCH (0), RUN_TIMEOUT (200 s a run).
set -u
NEW=$PWD; OLD=$PWD/${BASE:-.base}
[ -d "$OLD/orchestrator" ] || { echo "no old tree at $OLD (git archive <commit> | tar -x -C $OLD)" >&2; exit 2; }
. benchmarks/gpu_env.sh
L=$OUT/all.log; R=/tmp/orch-ab; mkdir -p "$R"
F=${FILTER:-attention=gqa tp=1 backend=torch,aiter-triton,aiter-triton-pa}
T0=$(date +%s)
step() { echo "== $* (+$(( $(date +%s) - T0 ))s)" >> "$L"; }
gpu_header "$L"
if [ "${SKIP_CLUSTER_BENCH:-0}" != 1 ]; then
  step "cluster_bench: Ray's start without the worker preload (as before)"
  timeout 120 python3 benchmarks/cluster_bench.py --devices gpu --num-cpus 16 --repeat 2 --no-preload 2>&1 | tail -4 >> "$L"
  step "cluster_bench: as cluster.connect starts Ray now (the worker preload)"
  timeout 120 python3 benchmarks/cluster_bench.py --devices gpu --num-cpus 16 --repeat 2 2>&1 | tail -4 >> "$L"
fi
run() {  # name tree triton-cache [orch run args...]
  local name=$1 tree=$2 cache=$3; shift 3
  step "run $name"
  ( cd "$tree" && TRITON_CACHE_DIR=$cache PYTHONPATH=/tmp/site:$tree /usr/bin/time -f "wall %e s" \
      timeout "${RUN_TIMEOUT:-200}" python3 -m orchestrator.cli run matrices/full.yaml --filter "$F" --devices gpu \
      --known-failures "$NEW/matrices/known-failures.yaml" --no-progress --db "$R/$name.db" "$@" > "$R/$name.log" 2>&1
    echo "rc=$?" >> "$R/$name.log" )
  grep -E "time:|gate|wall|rc=" "$R/$name.log" | tail -4 >> "$L"
  single_file_db "$R/$name.db"
}
run old_cold "$OLD" /tmp/tc_old
run new_cold "$NEW" /tmp/tc_new
run old_warm "$OLD" /tmp/tc_old
run new_warm "$NEW" /tmp/tc_new
run old_warm2 "$OLD" /tmp/tc_old
run new_warm2 "$NEW" /tmp/tc_new
names="new_cold old_warm new_warm old_warm2 new_warm2"
if [ "${SKIP_AUTO:-0}" != 1 ]; then
  step "ray start --head with RAY_preload_python_modules=torch"
  RAY_preload_python_modules=torch timeout 60 python3 -m ray.scripts.scripts start --head --num-gpus 1 \
      --include-dashboard false > "$R/raystart.log" 2>&1; tail -2 "$R/raystart.log" >> "$L"
  run new_auto1 "$NEW" /tmp/tc_new --address auto
  run new_auto2 "$NEW" /tmp/tc_new --address auto
  python3 -m ray.scripts.scripts stop > /dev/null 2>&1
  names="$names new_auto1 new_auto2"
fi
step "verdicts against old_cold; case time by provider"
for n in $names; do
  python3 benchmarks/diff_verdicts.py "$R/old_cold.db" "$R/$n.db" --checks 2>&1 | tail -1 | sed "s/^/$n: /" >> "$L"
done
for n in old_warm new_warm; do python3 benchmarks/case_times.py "$R/$n.db" --by provider >> "$L" 2>&1; done
tar czf "$OUT/res.tgz" -C "$R" .
step end
