"""Start-up: the embedded cluster's workers import torch before they take an actor.

`cluster.connect("local")` starts Ray with the raylet's `preload_python_modules`, so a worker
actor finds torch already imported (the worker did it before taking the actor; whether that saves
time depends on how long before, docs/BENCHMARKS.md: neutral in an embedded run, it pays on a head
kept running). Checked on a real embedded cluster in a child process (the test session's
own cluster is started without it), and against a plain ray.init as the contrast: there the same
actor reports nothing preloaded, so the assertion can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.executor.actors import WORKER_PRELOAD

pytestmark = pytest.mark.xdist_group("ray")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import ray, sys, tempfile
from orchestrator.executor import gangs
from orchestrator.executor.cluster import connect, disconnect, embedded_init_kwargs

def one_actor(node_id):
    spec = gangs.GangSpec(tp=1, device_kind="cpu", runner="backend.harness.checker:run_case", log_dir=tempfile.mkdtemp())
    gang, ready = gangs.place(spec, 0, node_id)
    ray.get(ready, timeout=60)
    info = ray.get(gangs.start_actors(gang)[0], timeout=120)
    log = open(info.log_path).read()
    gangs.teardown(gang)
    return ",".join(info.preloaded) or "-", "preloaded torch" in log

if sys.argv[1] == "connect":  # as orch run starts its cluster
    cluster = connect("local", devices="cpu", workers=1)
    print("RESULT", *one_actor(cluster.nodes[0].node_id))
    disconnect(cluster)
else:  # the contrast: the same embedded cluster without the preload
    ray.init(**embedded_init_kwargs(0, preload=False))
    print("RESULT", *one_actor(ray.nodes()[0]["NodeID"]))
    ray.shutdown()
"""


def _probe(how: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_preload_python_modules", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    assert len(lines) == 1, (done.stdout[-1500:], done.stderr[-1500:])
    return lines[0].split()[1:]


# how the cluster was started -> (what the worker actor reports preloaded, its log line says so)
SCENARIOS = {
    "connect": [",".join(WORKER_PRELOAD), "True"],
    "plain ray.init": ["-", "False"],  # the contrast: the check can fail
}


@pytest.mark.slow
@pytest.mark.parametrize("how", SCENARIOS)
def test_the_embedded_clusters_worker_finds_torch_already_imported(how):
    got = _probe(how)
    assert got == SCENARIOS[how]
