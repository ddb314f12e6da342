# Sourced by the benchmarks/gpu_*.sh scripts: what every call on the lent GPU machine sets up first.
# Installs the carried wheels (.whl, ../shared/tools/device-wheels) into /tmp/site once per machine,
# puts them and this tree on PYTHONPATH, and defines:
#   gpu_header LOG       the date, the GPU and torch/triton/ray versions, appended to LOG
#   single_file_db DB    checkpoint a SQLite store into its main file (no -wal/-shm left beside it:
#                        the device tool brings back at most 8 files)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/orch-gpu-out}; mkdir -p "$OUT"
if [ ! -d /tmp/site/ray ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD

gpu_header() {
  { date -u; nvidia-smi -L; python3 -c "import torch, triton, ray; print('torch', torch.__version__, 'triton', triton.__version__, 'ray', ray.__version__)"; } >> "$1" 2>&1
}

single_file_db() {
  python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('pragma wal_checkpoint(TRUNCATE)').fetchall(); c.execute('pragma journal_mode=DELETE').fetchall(); c.close()" "$1" 2>/dev/null
}
