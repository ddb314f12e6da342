"""Shared fixtures. Area-specific fixtures live in the area's own test modules or conftest.

Ray: one local cluster per xdist worker process, started lazily by the first test that asks for
it. Tests that use it carry `@pytest.mark.xdist_group("ray")` so that, under `--dist loadgroup`,
they all land on one worker and the 2-core machine runs a single cluster.
"""

from __future__ import annotations

import pytest


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
