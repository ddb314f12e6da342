#!/usr/bin/env bash
# The GPU half of CI, on the lent GPU machine (one H100), with the wheels of
# ../shared/tools/device-wheels carried in .whl (benchmarks/gpu_env.sh installs them into /tmp/site).
# Two parts, each one device call of under ten minutes on a warm machine:
#   bash benchmarks/gpu_ci.sh run     the README's main command, exactly `orch run matrices/full.yaml`
#                                     (its gate must pass: the families' tp 1 slice on the GPU), then
#                                     the probe corpus under real CUDA graphs (gpu_equivalence.py: every
#                                     probe's emulated verdict must agree)
#   bash benchmarks/gpu_ci.sh tests   the GPU test suites: tests/graphs, tests/checker, tests/families
#                                     and every other file with a test marked `gpu`, on the GPU
#   bash benchmarks/gpu_ci.sh         both, in one call (when the machine is fast enough for it)
# Prints one line per sub-step: its verdict (PASS / FAIL / TIMEOUT) and its seconds. Writes under
# $OUT (the device tool brings back 8 files): gpu_ci.log (those lines and each sub-step's tail),
# summary.md, junit.xml (a suite of the sub-steps, then the run's cases and the tests' cases) and
# gpu_ci.tgz (the run's store as one SQLite file, its outputs, the probes' JSON, every log).
# Exits 1 when any sub-step is red, 2 on bad usage: a red here is a red of the project.
#
# Off the GPU machine: DEVICES=cpu runs the same sub-steps on this machine's CPU (no wheel install;
# the README's command then plans the CPU matrix); --dry-run prints each sub-step's command and runs
# none; GPU_CI_<STEP>_CMD (README, PROBES, TESTS) replaces a sub-step's command, to test this script.
# Timeouts per sub-step (seconds): README_TIMEOUT (360), PROBES_TIMEOUT (150), TESTS_TIMEOUT (500);
# TEST_WORKERS (12) pytest workers.
set -u
cd "$(dirname "$0")/.."

dry=0
parts=()
for arg in "$@"; do
  case $arg in
    --dry-run) dry=1 ;;
    run|tests) parts+=("$arg") ;;
    *) echo "usage: bash benchmarks/gpu_ci.sh [run|tests]... [--dry-run]" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(run tests)
DEVICES=${DEVICES:-gpu}
case $DEVICES in gpu|cpu) ;; *) echo "gpu_ci: DEVICES must be gpu or cpu, not '$DEVICES'" >&2; exit 2 ;; esac

if [ "$DEVICES" = gpu ] && [ $dry = 0 ]; then
  . benchmarks/gpu_env.sh  # the wheels, PYTHONPATH, OUT, gpu_header, single_file_db
else
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  OUT=${OUT:-/tmp/orch-gpu-out}; mkdir -p "$OUT"
  gpu_header() { { date -u; echo "DEVICES=cpu"; } >> "$1"; }
  single_file_db() {
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('pragma wal_checkpoint(TRUNCATE)').fetchall(); c.execute('pragma journal_mode=DELETE').fetchall(); c.close()" "$1" 2>/dev/null
  }
fi
R=$(mktemp -d /tmp/orch-gpu-ci.XXXXXX)
log=$OUT/gpu_ci.log
steps=$R/steps.tsv  # name, verdict, seconds, rc, command
: > "$log"; : > "$steps"
[ $dry = 1 ] || gpu_header "$log"

# Every file outside the three suites' folders with a test marked gpu (each such file runs whole).
gpu_marked=$(grep -rlE "pytest\.mark\.gpu\b" tests --include='*.py' | grep -vE '^tests/(graphs|checker|families)/' | sort | tr '\n' ' ')
README_CMD=${GPU_CI_README_CMD:-"python3 -m orchestrator.cli run matrices/full.yaml"}
PROBES_CMD=${GPU_CI_PROBES_CMD:-"python3 benchmarks/gpu_equivalence.py --out $R/golden_cuda.json"}
TESTS_CMD=${GPU_CI_TESTS_CMD:-"python3 -m pytest -q -p no:cacheprovider -p no:randomly -n ${TEST_WORKERS:-12} --dist loadgroup tests/graphs tests/checker tests/families ${gpu_marked}-k 'not tp_gang and not on_a_tp_gang and not replicates' --junitxml=$R/pytest-junit.xml"}

substep() {  # name, timeout, command: runs it, logs its verdict line, records it
  local name=$1 limit=$2 cmd=$3 t0 rc secs verdict
  if [ $dry = 1 ]; then
    echo "$name: $cmd"
    return
  fi
  t0=$(date +%s.%N)
  timeout -k 20 "$limit" bash -c "$cmd" > "$R/$name.log" 2>&1
  rc=$?
  secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
  case $rc in 0) verdict=PASS ;; 124|137) verdict=TIMEOUT ;; *) verdict=FAIL ;; esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$verdict" "$secs" "$rc" "$cmd" >> "$steps"
  echo "gpu_ci: $name $verdict ${secs}s (rc $rc)" | tee -a "$log"
  { echo "--- $name: last lines"; grep -v "^    repro:" "$R/$name.log" | tail -15; } >> "$log"
}

for part in "${parts[@]}"; do
  case $part in
    run)
      # The README's command exactly, in the checkout, writing where it writes by default.
      [ $dry = 1 ] || rm -rf orch-out orch-results.db orch-results.db-wal orch-results.db-shm
      substep readme "${README_TIMEOUT:-360}" "$README_CMD"
      if [ $dry = 0 ]; then
        [ -f orch-results.db ] && single_file_db orch-results.db && cp orch-results.db "$R/"
        [ -d orch-out ] && cp -r orch-out "$R/orch-out"
      fi
      substep probes "${PROBES_TIMEOUT:-150}" "$PROBES_CMD" ;;
    tests)
      substep tests "${TESTS_TIMEOUT:-500}" "$TESTS_CMD" ;;
  esac
done
[ $dry = 1 ] && exit 0

# summary.md and junit.xml: the sub-steps, then the cases and tests they reported.
python3 - "$steps" "$R" "$OUT" "$DEVICES" <<'PY'
import os, sys
import xml.etree.ElementTree as ET

steps_file, run_dir, out, devices = sys.argv[1:5]
rows = [line.rstrip("\n").split("\t") for line in open(steps_file) if line.strip()]
red = [r for r in rows if r[1] != "PASS"]


def tail(name, n=6):
    path = os.path.join(run_dir, f"{name}.log")
    lines = [l.rstrip() for l in open(path, errors="replace")] if os.path.exists(path) else []
    return [l for l in lines if l and not l.startswith("    repro:")][-n:]


md = [f"# GPU CI ({devices}): {'GREEN' if not red else 'RED: ' + ', '.join(r[0] for r in red)}", "",
      "| sub-step | verdict | seconds | command |", "|---|---|---|---|"]
md += [f"| {n} | {v} | {s} | `{c}` |" for n, v, s, _, c in rows]
for n, v, *_ in rows:
    md += ["", f"## {n}: {v}", "", "```", *tail(n), "```"]
run_summary = os.path.join(run_dir, "orch-out", "summary.md")
if os.path.exists(run_summary):
    md += ["", "## The README command's summary (orch-out/summary.md)", "", open(run_summary).read()]
open(os.path.join(out, "summary.md"), "w").write("\n".join(md) + "\n")

suite = ET.Element("testsuite", name="gpu_ci", tests=str(len(rows)), failures=str(len(red)), errors="0")
for n, v, s, rc, c in rows:
    case = ET.SubElement(suite, "testcase", classname="gpu_ci", name=n, time=s)
    if v != "PASS":
        ET.SubElement(case, "failure", message=f"{v} (rc {rc})").text = "\n".join(tail(n, 30))
root = ET.Element("testsuites")
root.append(suite)
for path in (os.path.join(run_dir, "orch-out", "junit.xml"), os.path.join(run_dir, "pytest-junit.xml")):
    if os.path.exists(path):  # their own suites, as they wrote them
        try:
            got = ET.parse(path).getroot()
        except ET.ParseError as e:
            print(f"gpu_ci: {path}: {e}", file=sys.stderr)
            continue
        root.extend([got] if got.tag == "testsuite" else list(got.iter("testsuite")))
ET.ElementTree(root).write(os.path.join(out, "junit.xml"), encoding="utf-8", xml_declaration=True)
PY
tar czf "$OUT/gpu_ci.tgz" -C "$R" . 2>/dev/null
if awk -F'\t' '$2 != "PASS" {bad = 1} END {exit !bad}' "$steps"; then
  echo "gpu_ci: RED ($(awk -F'\t' '$2 != "PASS" {printf "%s ", $1}' "$steps"))" | tee -a "$log"
  exit 1
fi
echo "gpu_ci: GREEN" | tee -a "$log"
