"""orchestrator/executor/pool.py as tables: slot widths, what a node holds and has free, and which
gang a task gets. No Ray: gangs are driver-side records with a stand-in placement group."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec, Case
from orchestrator.executor.cluster import ClusterInfo, NodeSlots
from orchestrator.executor.config import ExecConfig
from orchestrator.executor.gangs import Gang, GangSpec, GangState
from orchestrator.executor.pool import ChoiceKind, GangPool
from orchestrator.scheduling.policy import WARM_GROUPS

GiB = 1024**3


def _case(tp: int) -> Case:
    return Case(backend="torch", tp=tp, mode="FULL", kv_cache_dtype="auto", batch=BatchSpec("b", (1,), (16,)))


I, B, P, D = GangState.IDLE, GangState.BUSY, GangState.PLACING, GangState.DEAD


def _pool(kind="gpu", slots=(4,), per_gpu=1, cores=0, **config) -> GangPool:
    nodes = tuple(NodeSlots(f"n{i}", "127.0.0.1", s, cores=cores) for i, s in enumerate(slots))
    return GangPool(ClusterInfo("local", kind, nodes, workers_per_gpu=per_gpu), ExecConfig(**config))


def _gang(pool: GangPool, tp: int, state=I, node=0, share=1.0, group="", pg=None, warm=()) -> Gang:
    spec = GangSpec(tp, pool.cluster.device_kind, "r", "/tmp", gpu_share=share)
    g = Gang(spec=spec, node=node, node_id=f"n{node}", pg=pg if pg is not None else object(), state=state)
    for held in (*reversed(warm), group):
        g.ran(held)
    pool.gangs.append(g)
    return g


@pytest.mark.parametrize("per_gpu, tp, need_gib, width", [
    (1, 1, 0, 1), (1, 4, 0, 4),            # one worker per GPU: a slot is a device
    (4, 1, 0, 1), (4, 2, 0, 8),            # a gang's ranks take whole devices: tp x N slots
    (4, 1, 30, 3),                         # a 30 GiB case on three of four shares of 80 GiB x 0.9
    (4, 1, 200, 4),                        # never wider than the whole GPU
])  # fmt: skip # a table: one row per line, as it reads
def test_case_width(per_gpu, tp, need_gib, width):
    case = _case(tp)
    pool = _pool(
        slots=(8 * per_gpu,),
        per_gpu=per_gpu,
        memory_needs={case.case_id: need_gib * GiB},
        device_bytes=80 * GiB,
        gpu_memory_utilization=0.9,
    )
    assert pool.case_width(case) == width


@pytest.mark.parametrize("kind, per_gpu, tp, share, width", [
    ("gpu", 4, 1, 0.25, 1), ("gpu", 4, 1, 0.75, 3), ("gpu", 4, 1, 1.0, 4), ("gpu", 4, 2, 1.0, 8),
    ("cpu", 1, 1, 1.0, 1), ("cpu", 1, 4, 1.0, 4),
])  # fmt: skip # a table: one row per line, as it reads
def test_gang_width(kind, per_gpu, tp, share, width):
    pool = _pool(kind, slots=(8,), per_gpu=per_gpu)
    assert pool.gang_width(_gang(pool, tp, share=share)) == width


def test_too_wide_names_the_largest_node():
    pool = _pool(slots=(8, 4), per_gpu=2)  # 4 and 2 GPUs
    assert pool.too_wide(_case(8)) == "needs 8 GPUs on one node; the largest has 4"
    assert pool.too_wide(_case(4)) is None
    assert _pool("cpu", slots=(2,)).too_wide(_case(4)) == "needs 4 CPU workers on one node; the largest has 2"


@pytest.mark.parametrize("kind, cores, gangs, free", [
    ("gpu", 0, [], 8),
    ("gpu", 0, [(2, B), (1, I)], 6),          # idle gangs count as free: the dispatcher may fill them
    ("gpu", 0, [(4, P), (2, B), (1, D)], 2),  # coming up or busy: held
    ("cpu", 2, [], 8),                        # the core cap applies once something runs
    ("cpu", 2, [(1, B)], 1),
    ("cpu", 2, [(4, B)], 0),                  # a tp 4 gang alone on 2 cores
])  # fmt: skip # a table: one row per line, as it reads
def test_free(kind, cores, gangs, free):
    pool = _pool(kind, slots=(8,), cores=cores)
    for tp, state in gangs:
        _gang(pool, tp, state)
    assert pool.free(0) == free


def test_a_lost_node_has_nothing_free_and_gives_back_its_idle_gangs():
    pool = _pool(slots=(4, 4))
    idle, busy, other = _gang(pool, 1), _gang(pool, 2, B), _gang(pool, 1, node=1)
    assert pool.node_lost(0) == [idle]
    assert pool.free(0) == 0 and pool.free(1) == 4
    assert busy.state == B and other.state == I


def test_a_split_pg_is_held_whole_while_any_view_lives():
    pool = _pool(slots=(8,))
    pg = object()
    a = _gang(pool, 2, pg=pg)
    b = _gang(pool, 2, pg=pg)
    a.pg_size = b.pg_size = 4  # two tp 2 views over one tp 4 placement group
    assert pool.held(0) == 4
    assert pool.shares_pg(a)
    b.state = D
    assert pool.held(0) == 4 and not pool.shares_pg(a)  # the last view keeps the pg's bundles
    assert pool.held(0, without=[a]) == 0


def test_ours_counts_each_pg_once_in_gpu_shares():
    pool = _pool(slots=(8,), per_gpu=4)
    pg = object()
    _gang(pool, 1, share=0.25), _gang(pool, 1, share=0.5, state=B), _gang(pool, 1, share=0.25, state=P)
    _gang(pool, 2, pg=pg), _gang(pool, 2, pg=pg, state=B)
    assert pool.ours() == pytest.approx(0.25 + 0.5 + 2.0)


def _choose(pool, tp, width=None, group="g", avoid=None):
    return pool.choose(0, tp, width or tp, group, avoid)


def test_choose_reuses_an_idle_gang_of_its_size_same_group_first():
    pool = _pool(slots=(4,))
    _gang(pool, 1, group="other")
    mine = _gang(pool, 1, group="g")
    _gang(pool, 2, group="g")
    c = _choose(pool, 1)
    assert (c.kind, c.gang, c.teardown) == (ChoiceKind.REUSE, mine, ())


@pytest.mark.parametrize("held, want", [
    ((("a", "b"), ("g",)), 1),              # the only one holding g
    ((("g", "b"), ("b", "g")), 0),          # both hold it: the one that used it last
    ((("a", "b", "c"), ("x", "y", "g")), 1),  # held further back still beats not held
    ((("a",), ("b",)), 0),                  # nobody holds it: the first idle one
])  # fmt: skip # a table: one row per line, as it reads
def test_choose_prefers_the_gang_holding_the_tasks_session(held, want):
    pool = _pool(slots=(4,))
    gangs = [_gang(pool, 1, warm=w) for w in held]
    c = pool.choose(0, 1, 1, "g", None)
    assert (c.kind, c.gang) == (ChoiceKind.REUSE, gangs[want])


def test_warm_lists_the_idle_gangs_groups_latest_first():
    pool = _pool(slots=(4,))
    _gang(pool, 1, warm=("a", "b", "c"))
    _gang(pool, 1, warm=("d", "a"))
    _gang(pool, 1, state=B, warm=("busy",))  # a busy gang's sessions are not on offer
    _gang(pool, 1, node=1, warm=("elsewhere",))
    assert pool.warm(0) == ("a", "d", "b", "c")


def test_a_gang_holds_its_latest_groups_as_its_workers_session_cache_does():
    g = _gang(_pool(), 1)
    for group in ["a", "b", "a", "", *(f"x{i}" for i in range(WARM_GROUPS))]:
        g.ran(group)
    assert g.warm == tuple(f"x{i}" for i in reversed(range(WARM_GROUPS)))
    g.ran("x3")
    assert g.warm == ("x3", *(f"x{i}" for i in reversed(range(WARM_GROUPS)) if i != 3))  # once, latest


def test_a_retry_avoids_its_first_worker_unless_there_is_nowhere_else():
    pool = _pool(slots=(2,))
    first = _gang(pool, 1)
    c = _choose(pool, 1, avoid=first.label)
    assert (c.kind, c.teardown) == (ChoiceKind.PLACE, ())  # a second worker fits beside it
    alone = _pool(slots=(1,))
    only = _gang(alone, 1)
    assert _choose(alone, 1, avoid=only.label).gang is only


def test_a_larger_idle_gang_is_split_rather_than_started_anew():
    pool = _pool(slots=(4,))
    big = _gang(pool, 4)
    big.infos = [object()] * 4  # gangs.splits needs its ranks' infos
    assert _choose(pool, 2).kind == ChoiceKind.REFORM and _choose(pool, 2).gang is big
    assert _pool(slots=(4,), reuse_gangs=False).choose(0, 2, 2, "g", None).kind == ChoiceKind.PLACE


def test_a_new_gang_tears_down_idle_gangs_of_other_sizes_first():
    pool = _pool(slots=(4,))
    same = _gang(pool, 2)
    other = _gang(pool, 1)
    same.infos = []  # not splittable: no infos
    c = _choose(pool, 2, group="x", avoid=same.label)
    # 4 slots, 3 held: the tp 1 gang goes first, which leaves room for a second tp 2 gang.
    assert (c.kind, c.teardown) == (ChoiceKind.PLACE, (other,))


@pytest.mark.parametrize("busy_tp, kind, down", [(2, ChoiceKind.WAIT, 1), (1, ChoiceKind.PLACE, 1)])
def test_without_room_it_waits(busy_tp, kind, down):
    pool = _pool(slots=(4,))
    _gang(pool, busy_tp, B)
    _gang(pool, 1)
    c = _choose(pool, 3 if busy_tp == 1 else 4)
    assert (c.kind, len(c.teardown)) == (kind, down)


def _views(pool, pg, tps, states=None, pg_size=8):
    """Idle (or `states`) views of one placement group of `pg_size` bundles, as a split leaves them."""
    out = []
    for i, tp in enumerate(tps):
        g = _gang(pool, tp, state=(states or [I] * len(tps))[i], pg=pg)
        g.pg_size, g.infos = pg_size, [object()] * tp
        out.append(g)
    return out


@pytest.mark.parametrize("views, states, want, joined", [
    ((2, 2, 2, 2), None, 8, (0, 1, 2, 3)),   # a split tp 8 gang, wide again: no new processes
    ((2, 2, 2, 2), None, 4, (0, 1)),         # part of it
    ((4, 2, 1, 1), None, 8, (0, 1, 2, 3)),   # views of several sizes, the widest first
    ((4, 2, 1, 1), None, 6, (0, 1)),
    ((2, 2, 2, 2), [I, I, I, B], 8, ()),     # a busy view: not joinable (placed anew, or wait)
    ((1, 1), None, 4, ()),                   # too few idle ranks
])  # fmt: skip # a table: one row per line, as it reads
def test_idle_views_of_one_split_join_again(views, states, want, joined):
    pool = _pool(slots=(8,))
    gs = _views(pool, object(), views, states)
    c = _choose(pool, want)
    if joined:
        assert (c.kind, c.parts) == (ChoiceKind.MERGE, tuple(gs[i] for i in joined))
    else:
        assert c.kind in (ChoiceKind.PLACE, ChoiceKind.WAIT) and not c.parts


def test_views_of_two_placement_groups_never_join():
    pool = _pool(slots=(8,))
    _views(pool, object(), (2,), pg_size=4)
    _views(pool, object(), (2,), pg_size=4)
    assert _choose(pool, 4).kind != ChoiceKind.MERGE
    assert _pool(slots=(8,), reuse_gangs=False).choose(0, 4, 4, "g", None).kind == ChoiceKind.PLACE
