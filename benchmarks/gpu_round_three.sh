#!/usr/bin/env bash
# One call on the lent GPU machine for the checker's round three: the graph probe
# corpus under real CUDA graphs (records tests/graphs/golden_cuda.json, the 6 new probes included),
# then the round's mutants on the GPU: memory that moves (lru_scratch, rows_unwritten, the
# allocator's free blocks poisoned), padding values (pad_declared; correct providers under 1/0 and
# 0/-1), frozen scales (host_scale_copy, both orders), sinks (SinkTwice, SinkNoExp2, the share), and
# with two GPUs the tp 2 gangs (rank_split_mode: rank_consensus; allreduce_registered: FAIL replay).
#   carry .whl (../shared/tools/device-wheels), then: bash benchmarks/gpu_round_three.sh
# Writes $OUT/round_three.log (a line per step, each step's summary) and $OUT/results.tgz (the new
# golden_cuda.json and golden_cuda.md, probe_verdicts.json, the pytest log and JUnit XML).
# About 4-6 minutes on an H100 (the probes ~1, the mutants ~3-4). Per-step timeouts.
set -u
. benchmarks/gpu_env.sh
R=/tmp/orch-round-three; mkdir -p "$R"
log=$OUT/round_three.log
: > "$log"; gpu_header "$log"
step() { echo "== $* ($(date -u +%T))" >> "$log"; }
pack() { tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }

step "equivalence: the probe corpus under CUDA graphs (writes golden_cuda.json)"
timeout 180 python3 benchmarks/gpu_equivalence.py --out "$R/golden_cuda.json" > "$R/equivalence.log" 2>&1
echo "rc=$?" >> "$R/equivalence.log"; grep -E "disagrees|golden source|rc=" "$R/equivalence.log" >> "$log"; pack

step "round three mutants on the GPU (and on its CPU: the same tests, both devices)"
timeout "${MUTANT_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -n 4 \
    tests/checker/test_memory_moves.py tests/checker/test_padding.py tests/checker/test_scales.py \
    tests/checker/test_rank_consensus.py tests/checker/test_unverifiable.py \
    --junitxml="$R/round_three.xml" > "$R/mutants.log" 2>&1
echo "rc=$?" >> "$R/mutants.log"; grep -E "passed|failed|FAILED|Error|rc=" "$R/mutants.log" | tail -30 >> "$log"; pack
step "sink mutants on the GPU (swa_sinks' torch provider)"
timeout "${SINK_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -n 4 tests/families/test_swa_mutants.py \
    -k "twice or exp2 or real_share" --junitxml="$R/sinks.xml" > "$R/sinks.log" 2>&1
echo "rc=$?" >> "$R/sinks.log"; grep -E "passed|failed|FAILED|Error|rc=" "$R/sinks.log" | tail -10 >> "$log"; pack
step done
pack
