"""The local gang: spawned gloo processes, results in rank order, failures surfaced (not hung)."""

from __future__ import annotations

import pytest

from backend.harness.distributed import GangError, free_port, run_local_gang, world
from tests.checker.gang_fns import fail_on_rank_1, reduce_rank


@pytest.mark.slow
def test_gang_all_reduces_and_returns_in_rank_order():
    assert run_local_gang(reduce_rank, 2, 2.0) == [(0, 2, 6.0), (1, 2, 6.0)]  # (1 + 2) * 2


@pytest.mark.slow
def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(GangError, match="rank 1 broke on purpose"):
        run_local_gang(fail_on_rank_1, 2, timeout_s=60)


def test_no_gang_here():
    assert world() == (0, 1)
    assert 1024 < free_port() < 65536
