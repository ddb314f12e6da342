"""Dispatcher invariants for every policy, driven by hand (no simulator) and by the simulator."""

from __future__ import annotations

import pytest

from orchestrator.errors import InputError
from orchestrator.scheduling.policy import POLICIES, Dispatcher, Task, make_dispatcher
from orchestrator.scheduling.simulate import synthetic_workload


def drain(policy, tasks, nodes):
    """Run tasks to completion with an executor that finishes everything it started each round;
    checks GPU capacity at every grant and returns {task id: node}."""
    d = make_dispatcher(policy, tasks, nodes)
    placed: dict[str, int] = {}
    clock = 0.0
    while d.remaining():
        running = []
        for n, g in enumerate(nodes):
            free = g
            while (t := d.next_for(n, free, None, now=clock)) is not None:
                assert t.tp <= free, f"{policy}: {t.id} tp={t.tp} on node {n} with {free} free"
                assert t.id not in placed, f"{policy}: {t.id} dispatched twice"
                free -= t.tp
                placed[t.id] = n
                running.append(t)
        assert running, f"{policy}: nothing dispatched with every GPU free and {d.remaining()} left"
        clock += 1.0
        for t in running:
            d.done(t, 1.0)
    return placed


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("nodes", [[8], [8, 8, 8], [4, 8]], ids=["1x8", "3x8", "4+8"])
def test_every_task_dispatched_once_and_gangs_fit_one_node(policy, nodes):
    tasks, _ = synthetic_workload(300, seed=3, sigma=0.5, max_tp=max(nodes))
    placed = drain(policy, tasks, nodes)
    assert sorted(placed) == sorted(t.id for t in tasks)
    for t in tasks:
        assert nodes[placed[t.id]] >= t.tp


@pytest.mark.parametrize("policy", POLICIES)
def test_tp_larger_than_any_node_is_rejected(policy):
    tasks = [Task("small", 1, 1.0), Task("huge-gang", 16, 5.0)]
    with pytest.raises(InputError, match=r"huge-gang.*tp=16.*largest node has 8"):
        make_dispatcher(policy, tasks, [8, 8])


@pytest.mark.parametrize(
    "tasks, nodes, match",
    [
        ([Task("a", 1, 1.0), Task("a", 1, 2.0)], [8], "appears twice"),
        ([Task("a", 0, 1.0)], [8], "tp must be >= 1"),
        ([Task("a", 1, float("nan"))], [8], "est_s"),
        ([Task("a", 1, 1.0)], [], "nodes"),
        ([Task("a", 1, 1.0)], [8, 0], "nodes"),
    ],
    ids=["duplicate-id", "tp0", "nan-estimate", "no-nodes", "empty-node"],
)
def test_bad_tasks_or_nodes_are_input_errors(tasks, nodes, match):
    with pytest.raises(InputError, match=match):
        Dispatcher(tasks, nodes)


def test_unknown_policy_is_input_error():
    with pytest.raises(InputError, match="unknown policy"):
        make_dispatcher("round-robin", [Task("a", 1, 1.0)], [8])


@pytest.mark.parametrize("policy", POLICIES)
def test_requeue_gives_the_task_out_again(policy):
    tasks = [Task("a", 1, 3.0), Task("b", 2, 2.0), Task("c", 1, 1.0)]
    d = make_dispatcher(policy, tasks, [4])
    first = d.next_for(0, 4, now=0.0)
    assert first is not None
    before = d.remaining()
    d.requeue(first)  # e.g. its GPU faulted: run it again
    assert d.remaining() == before + 1
    seen = []
    free = 4
    while (t := d.next_for(0, free, now=1.0)) is not None:
        seen.append(t.id)
        free -= t.tp
    assert first.id in seen and len(seen) == len(set(seen))


def test_requeue_of_a_task_not_running_is_refused():
    d = Dispatcher([Task("a", 1, 1.0)], [8])
    with pytest.raises(ValueError, match="not running"):
        d.requeue(Task("a", 1, 1.0))


def test_longest_expected_first():
    tasks = [Task(f"t{i}", 1, float(i)) for i in range(10)]
    d = Dispatcher(tasks, [2])
    got = [d.next_for(0, 2, now=0.0).id, d.next_for(0, 1, now=0.0).id]
    assert got == ["t9", "t8"]


def test_small_task_backfills_gpus_a_gang_cannot_use():
    # 8 GPUs, a tp4 gang running; 3 free: the tp4 head cannot run, a tp2 and a tp1 can.
    tasks = [Task("g1", 4, 10.0), Task("g2", 4, 9.0), Task("pair", 2, 1.0), Task("one", 1, 0.5)]
    d = Dispatcher(tasks, [8])
    assert d.next_for(0, 8, now=0.0).id == "g1"
    assert d.next_for(0, 4, now=0.0).id == "g2"
    d.done(tasks[0], 10.0)
    assert d.next_for(0, 3, now=10.0).id == "pair"
    assert d.next_for(0, 1, now=10.0).id == "one"


def test_same_group_wins_a_close_tie_but_not_a_clear_priority_gap():
    tasks = [Task("x", 1, 10.0, group="A"), Task("y", 1, 9.8, group="B"), Task("z", 1, 4.0, group="B")]
    d = Dispatcher(tasks, [8])
    assert d.next_for(0, 1, warm=("B",), now=0.0).id == "y"  # 2% below the best: reuse graphs
    assert d.next_for(0, 1, warm=("B",), now=0.0).id == "x"  # z is 60% below: priority wins


@pytest.mark.parametrize("warm, want", [
    ((), "x"),                  # nothing held: longest first
    (("B",), "y"),              # B's longest is within the tie
    (("C", "B"), "c"),          # the latest held group within the tie, not the longest
    (("D",), "x"),              # D's task is past the tie: priority wins
    (("E",), "x"),              # E's task is of a later tier
    (("D", "C"), "c"),          # past the tie in the latest: an older held group's task
    (("D", "E", "B"), "y"),     # ... however far back
])  # fmt: skip # a table: one row per line, as it reads
def test_a_held_group_wins_a_close_tie(warm, want):
    tasks = [
        Task("x", 1, 10.0, group="A"),
        Task("y", 1, 9.8, group="B"),
        Task("c", 1, 6.0, group="C"),
        Task("d", 1, 4.0, group="D"),
        Task("e", 1, 9.9, group="E", tier=1),
    ]
    assert Dispatcher(tasks, [8]).next_for(0, 1, warm, now=0.0).id == want


def test_blocked_long_gang_gets_a_node_drained_for_it():
    # Both nodes full of long tp1 work; then a long tp8 gang is the head, with plenty of short
    # tp1 work behind it. Greedy backfill would keep both nodes busy with the short tasks and start
    # the gang last; the reservation must hold one node for it once its GPUs free up.
    long_ones = [Task(f"l{i}", 1, 50.0) for i in range(16)]
    gang = Task("gang", 8, 40.0)
    short = [Task(f"s{i}", 1, 1.0) for i in range(100)]
    d = Dispatcher(long_ones + [gang] + short, [8, 8])
    on_node0 = []
    for n in (0, 1):
        for _ in range(8):
            t = d.next_for(n, 8, now=0.0)
            assert t.id.startswith("l")
            if n == 0:
                on_node0.append(t)
    granted = []
    free = 0
    for i, t in enumerate(on_node0):  # node 0's long tasks end one by one
        d.done(t, 50.0 + i * 0.01)
        free += 1
        while (g := d.next_for(0, free, now=50.0 + i * 0.01)) is not None:
            granted.append(g.id)
            free -= g.tp
    assert granted == ["gang"]


def test_blocked_gang_test_depends_on_the_reservation(monkeypatch):
    monkeypatch.setattr(Dispatcher, "reserve", False)
    with pytest.raises(AssertionError):
        test_blocked_long_gang_gets_a_node_drained_for_it()


def test_without_urgency_gang_waits_while_plenty_of_work_remains():
    # The same gang behind a lot of work: not urgent, so a freed GPU is backfilled, not held.
    long_ones = [Task(f"l{i}", 1, 50.0) for i in range(8)]
    gang = Task("gang", 8, 5.0)
    short = [Task(f"s{i}", 1, 4.0) for i in range(400)]
    d = Dispatcher(long_ones + [gang] + short, [8])
    for _ in range(8):
        d.next_for(0, 8, now=0.0)
    d.done(long_ones[0], 50.0)
    assert d.next_for(0, 1, now=50.0).id.startswith("s")


def test_many_requeues_keep_priority_order_and_stay_fast():
    # The executor batches by asking for more and giving back what does not suit the batch:
    # every task may pass through requeue. Order must survive and the cost must stay ~linear.
    import time

    tasks = [Task(f"t{i:05d}", 1 + (i % 2), float(i % 997), group=f"g{i % 7}") for i in range(20000)]
    d = Dispatcher(tasks, [8])
    t0 = time.perf_counter()
    for _ in range(10000):
        d.requeue(d.next_for(0, 8, now=0.0))
    order = []
    while (t := d.next_for(0, 8, now=0.0)) is not None:
        order.append(t.est_s)
        d.done(t, 0.0)
    assert len(order) == 20000
    assert order == sorted(order, reverse=True)
    assert time.perf_counter() - t0 < 5.0


def _order(d: Dispatcher, nodes: list[int], lift_after: int | None = None) -> list[str]:
    """Hand out every task one at a time on node 0 (one GPU free each time); returns the ids in
    dispatch order. lift_after=k: lift the tiers after the k-th grant."""
    out: list[str] = []
    while d.remaining():
        t = d.next_for(0, 1, None, now=float(len(out)))
        assert t is not None
        out.append(t.id)
        d.done(t, 1.0)
        if lift_after is not None and len(out) == lift_after:
            d.lift_tiers()
    return out


@pytest.mark.parametrize(
    "tasks, lift_after, expected",
    [
        # Tier 0 first, longest first inside each tier, whatever the estimates across tiers.
        (
            [Task("jit-long", 1, 9.0, tier=1), Task("a", 1, 1.0), Task("b", 1, 2.0), Task("jit", 1, 3.0, tier=1)],
            None,
            ["b", "a", "jit-long", "jit"],
        ),
        # Lifted after the first grant: the rest rank by estimate alone.
        (
            [Task("jit-long", 1, 9.0, tier=1), Task("a", 1, 1.0), Task("b", 1, 2.0), Task("jit", 1, 3.0, tier=1)],
            1,
            ["b", "jit-long", "jit", "a"],
        ),
        # One tier: plain longest-first.
        ([Task("a", 1, 1.0), Task("b", 1, 2.0)], None, ["b", "a"]),
    ],
    ids=["tiered", "lifted", "untiered"],
)
def test_tiers_order_dispatch(tasks, lift_after, expected):
    assert _order(Dispatcher(tasks, [1]), [1], lift_after) == expected


def test_a_tier_1_task_takes_a_gpu_that_no_waiting_tier_0_task_fits():
    # One GPU free: the waiting tier 0 gang cannot use it, so the tier 1 case runs there instead
    # of the GPU idling; with both free, the gang goes first.
    tasks = [Task("gang", 2, 5.0), Task("jit", 1, 1.0, tier=1)]
    assert Dispatcher(tasks, [2]).next_for(0, 1, None, now=0.0).id == "jit"
    assert Dispatcher(tasks, [2]).next_for(0, 2, None, now=0.0).id == "gang"


def test_a_requeued_task_keeps_its_tier_until_lifted():
    d = Dispatcher([Task("jit", 1, 9.0, tier=1), Task("a", 1, 1.0), Task("b", 1, 2.0)], [1])
    b = d.next_for(0, 1, None, now=0.0)
    assert b.id == "b"
    d.requeue(b)  # e.g. its worker died: back among tier 0, still ahead of the tier 1 task
    assert d.next_for(0, 1, None, now=1.0).id == "b"
    d.done(b, 1.0)
    a = d.next_for(0, 1, None, now=2.0)
    assert a.id == "a"
    d.requeue(a)
    d.lift_tiers()  # one tier now: the longer "jit" goes before the requeued "a"
    handed = [d.next_for(0, 1, None, now=3.0).id, d.next_for(0, 1, None, now=3.0).id]
    assert handed == ["jit", "a"]
    assert d.remaining() == 0


# -- requeue and reservation: each test below fails with one rule of policy.py undone ----------


def test_requeued_tasks_come_back_longest_first():
    tasks = [Task("a", 1, 1.0), Task("b", 1, 5.0), Task("c", 1, 3.0)]
    d = Dispatcher(tasks, [3])
    running = [d.next_for(0, 3 - i, now=0.0) for i in range(3)]
    for t in running:
        d.requeue(t)  # e.g. their node was lost
    assert [d.next_for(0, 3 - i, now=1.0).id for i in range(3)] == ["b", "c", "a"]


def _reserved_node(ends: list[float], backfill: Task) -> Dispatcher:
    """One node of 4 GPUs: three tp 1 tasks running (estimated to end at `ends`), a tp 2 gang of
    60 s waiting, urgent and longer than `backfill`; the gang fits nowhere, so node 0 is reserved."""
    running = [Task(f"r{i}", 1, 100.0) for i in range(3)]
    d = Dispatcher(running + [Task("gang", 2, 60.0), backfill], [4])
    for i, end in enumerate(ends):
        got = d.next_for(0, 4 - i, now=end - 100.0)
        assert got is not None and got.id == f"r{i}"
    return d


def test_a_reserved_node_backfills_what_ends_before_the_gangs_expected_start():
    # The gang's GPUs are expected free at 10 s (the first running task's end): a 5 s task ends
    # before then, so it runs in the meantime instead of the GPU idling.
    d = _reserved_node([10.0, 30.0, 50.0], Task("short", 1, 5.0))
    got = d.next_for(0, 1, now=0.0)
    assert got is not None and got.id == "short"


def test_a_reserved_node_backfills_gpus_the_gang_will_not_need():
    # At 10 s two tasks end: 3 GPUs free then, the gang needs 2, so one spare GPU may take a task
    # that runs past 10 s.
    d = _reserved_node([10.0, 10.0, 100.0], Task("long", 1, 50.0))
    got = d.next_for(0, 1, now=0.0)
    assert got is not None and got.id == "long"


def test_a_requeued_task_counts_as_waiting_work_again():
    # A 60 s tp 4 gang behind four 50 s tasks on 4 GPUs. Three of the four are requeued (their
    # worker died): 390 GPU-seconds wait again, the gang is not urgent, and a freed GPU takes one
    # of them. Counted as gone, only the gang would be waiting: urgent, the node would be held.
    tasks = [Task("gang", 4, 60.0)] + [Task(f"x{i}", 1, 50.0) for i in range(4)]
    d = Dispatcher(tasks, [4])
    xs = [d.next_for(0, 1, now=0.0) for _ in range(3)] + [d.next_for(0, 1, now=-45.0)]
    assert [x.id for x in xs] == ["x0", "x1", "x2", "x3"]  # x3 is expected to end at 5 s
    for x in xs[:3]:
        d.requeue(x)
    got = d.next_for(0, 3, now=0.0)
    assert got is not None and got.id in ("x0", "x1", "x2")


def test_a_task_requeued_into_a_new_tier_is_still_handed_out():
    d = Dispatcher([Task("a", 1, 1.0)], [1])
    a = d.next_for(0, 1, now=0.0)
    d.requeue(a, Task("a", 1, 1.0, tier=1))  # e.g. deferred behind a warm-up from now on
    got = d.next_for(0, 1, now=1.0)
    assert got is not None and got.tier == 1
    assert d.remaining() == 0
