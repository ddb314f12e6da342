#!/usr/bin/env bash
# vLLM's own backends of the families, in place on one GPU, in one device call (docs/VLLM.md):
# the two kernel probes that settle their known reds outside orch, then every family block of
# matrices/vllm-families.yaml through benchmarks/gpu_vllm.py (no Ray), GDN_ATTN with its mutant.
# Carry `.whl-vllm` (benchmarks/build_vllm_wheel.py); results under $OUT (8 files come back):
#   sinks_fp8_probe.json  mla_pad_probe.json  vllm_families.log  <family>/gpu_vllm.json (mla, swa, gdn, sparse)
# Each part has its own time box; a red part does not stop the next. Exit 1 when any part is red.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-gpu-out}; mkdir -p "$OUT"
if [ ! -d /tmp/site-vllm/vllm ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-vllm .whl-vllm/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site-vllm:$PWD  # its own folder: gpu_env.sh installs Ray's wheels into /tmp/site
log=$OUT/vllm_families.log
: > "$log"
red=0
part() {  # name, seconds, command...
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.out" 2>&1
  rc=$?
  [ $rc = 0 ] || red=1
  echo "== $name: rc $rc, $(( $(date +%s) - t0 )) s" | tee -a "$log"
  grep -E "^run (FAIL|ERROR)|gate|verdict|holds|failing|rc=" "$OUT/$name.out" | cut -c1-240 | tail -25 >> "$log"
}
vf=(python3 benchmarks/gpu_vllm.py --matrix matrices/vllm-families.yaml --backend '')
part mla_pad_probe 60 python3 benchmarks/gpu_mla_pad_probe.py --out "$OUT/mla_pad_probe.json"
part sinks_fp8_probe 60 python3 benchmarks/gpu_sinks_fp8_probe.py --out "$OUT/sinks_fp8_probe.json"
part mla ${MLA_S:-120} "${vf[@]}" --mutant '' --filter attention=mla --out-dir "$OUT/mla" --budget-s 90
part swa ${SWA_S:-100} "${vf[@]}" --mutant '' --filter attention=swa_sinks --out-dir "$OUT/swa" --budget-s 70
part gdn ${GDN_S:-150} "${vf[@]}" --filter attention=hybrid_gdn --mutant tests.mutants.vllm_gdn:Unstaged \
  --mutant-filter 'tp=1 kv=auto batch=decode_7' --out-dir "$OUT/gdn" --budget-s 110
part sparse ${SPARSE_S:-90} "${vf[@]}" --mutant '' --filter attention=mla_sparse --out-dir "$OUT/sparse" --budget-s 60
rm -f "$OUT"/*.out "$OUT"/*/gpu_vllm.md
exit $red
