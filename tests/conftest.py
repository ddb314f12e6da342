"""Shared fixtures. Area-specific fixtures live in the area's own test modules or conftest.

Ray: one local cluster per xdist worker process, started lazily by the first test that asks for
it. Tests that use it carry `@pytest.mark.xdist_group("ray")` so that, under `--dist loadgroup`,
they all land on one worker and the 2-core machine runs a single cluster.
"""

from __future__ import annotations

import os

import pytest


def _share_the_cores() -> None:
    """One intra-op thread set per xdist worker, the cores split between them (as orch's CPU actors
    and its pytest plugin take one each). torch's default (every core per process) with two
    workers on the 2-core box oversubscribes OpenMP, whose threads spin while they wait: the
    families' mutation suites took 259 s under -n 2 against 38 s with one thread a worker.
    Children (orch commands, gang ranks) inherit it through OMP_NUM_THREADS."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture(autouse=True)
def own_store_and_outputs(tmp_path_factory, monkeypatch):
    """Every command a test runs writes and reads its own store and outputs, never the checkout's:
    `--db` and `--out` default to ORCH_DB / ORCH_OUT (orchestrator/defaults.py), set here to a
    fresh folder per test (and inherited by the commands tests start as subprocesses). README's
    main job leaves orch-results.db and orch-out/ in the checkout; a test that read them failed
    when the README's two commands ran in order."""
    own = tmp_path_factory.mktemp("orch-state")
    monkeypatch.setenv("ORCH_DB", str(own / "orch-results.db"))
    monkeypatch.setenv("ORCH_OUT", str(own / "orch-out"))
    return own


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # our own, even where another Ray runs on the machine
            num_cpus=4,
            num_gpus=0,
            include_dashboard=False,
            object_store_memory=256 * 1024**2,
            log_to_driver=False,
        )
    yield ray
    ray.shutdown()


def in_ci() -> bool:
    """CI sets CI (GitHub, GitLab, Buildkite do; .ci/run exports it)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server for this session (per xdist worker): tests/pgserver.py. Skipped
    with the reason where none can start; in CI that is a failure (.ci/run installs one)."""
    from tests import pgserver

    try:
        server = pgserver.start()
    except pgserver.Unavailable as e:
        if in_ci():
            pytest.fail(f"no PostgreSQL server: {e}; in CI that is a failure, not a skip", pytrace=False)
        pytest.skip(f"no PostgreSQL server: {e}")
    yield server
    server.stop()


_pg_databases = iter(range(10**6))


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty database on the session's server: its URL, password included."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_pg_databases)}")
