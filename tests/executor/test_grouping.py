"""A config's cudagraph modes run on one worker (they share its eager steps and reference): the
pure parts (config_key, Dispatcher.siblings, Attempts.batch, grouped_estimates) table-driven, and
real Ray workers (the session cluster) with the fault runner's slow cases."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.executor.attempts import Attempts
from orchestrator.executor.config import config_key, group_key
from orchestrator.executor.executor import ExecConfig, Executor
from orchestrator.scheduling.cost import LATER_MODE_FACTOR, grouped_estimates
from orchestrator.scheduling.policy import Dispatcher, Task
from tests.executor.conftest import session_node

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
RUNNER = "tests.executor.faulty_backends:fault_runner"
# A group as the executor keys it (config.group_key): a name of many characters, as a string
# handed where a tuple of groups belongs would show (its characters are no group).
G = "torch|tp1|auto|8x2x32|bfloat16|2|512|51"


def _case(mode: str, seed: int = 0, kind: str = "slow", **kw) -> Case:
    return Case(
        backend="torch",
        tp=1,
        mode=mode,
        kv_cache_dtype="auto",
        batch=BatchSpec(kind, (1, 1), (8, 8), ""),
        seed=seed,
        **kw,
    )


KEYS = [
    # (name, change to the case, same config?)
    ("another cudagraph mode", {"mode": "FULL"}, True),
    ("another seed", {"seed": 1}, False),
    ("another kv dtype", {"kv_cache_dtype": "fp8"}, False),
    ("another backend", {"backend": "aiter-emulated"}, False),
    ("more steps", {"steps": 4}, False),
    ("another batch", {"batch": BatchSpec("other", (1, 1), (8, 8), "")}, False),
]


@pytest.mark.parametrize("name,change,same", KEYS, ids=[k[0] for k in KEYS])
def test_config_key(name, change, same):
    a = _case("NONE")
    b = dataclasses.replace(a, **change)
    assert (config_key(a) == config_key(b)) is same
    assert config_key(a).startswith(group_key(a))


def _tasks(configs: int, modes: int = 5) -> list[Task]:
    # est: every config's modes interleaved with the other configs' in longest-first order
    return [Task(f"c{c}-m{m}", 1, 10.0 - m - c / 10, G, config=f"c{c}") for c in range(configs) for m in range(modes)]


def test_siblings_are_taken_with_the_first_of_their_config():
    d = Dispatcher(_tasks(3), [2])
    first = d.next_for(0, 2)
    assert first is not None and first.id == "c0-m0"
    assert sorted(t.id for t in d.siblings(first, 0, now=0.0)) == [f"c0-m{m}" for m in range(1, 5)]
    nxt = d.next_for(0, 1)
    assert nxt is not None and nxt.config == "c1"  # the rest of c0 is gone from the queue
    assert d.siblings(Task("x", 1, 1.0), 0, now=0.0) == []  # no config: nothing


def test_a_requeued_sibling_is_not_taken_again():
    d = Dispatcher(_tasks(1, 3), [2])
    first = d.next_for(0, 2)
    sibs = d.siblings(first, 0, now=0.0)
    d.requeue(sibs[0])  # a retry goes wherever it may, not with its config
    assert [t.id for t in d.siblings(first, 0, now=0.0)] == []


def _attempts(tasks: list[Task], gpus: int) -> tuple[Dispatcher, Attempts]:
    """A dispatcher and attempts over `tasks` (each a case of its own seed), all queued."""
    d = Dispatcher(tasks, [gpus])
    at = Attempts({t.id: _case("NONE", seed=n) for n, t in enumerate(tasks)}, d, retries=1, unit="GPU")
    at.queue(tasks)
    return d, at


def test_a_sibling_given_back_untried_still_goes_with_its_config():
    """A task handed out but given back before it ran (it did not suit a batch) is taken with its
    config when another of its modes leads; a requeued retry is not (the test above)."""
    d = Dispatcher(_tasks(1, 3), [2])
    first = d.next_for(0, 2)
    assert first is not None and first.id == "c0-m0"
    d.give_back(first)
    lead = d.next_for(0, 2, warm=(G,))  # the group's longest fresh task wins the tie
    assert lead is not None and lead.id == "c0-m1"
    assert sorted(t.id for t in d.siblings(lead, 0, now=0.0)) == ["c0-m0", "c0-m2"]
    assert d.remaining() == 0


def test_a_config_mode_that_did_not_fit_a_batchs_fill_comes_back_with_its_config():
    """c1's first mode did not fit c0's batch (budget 1 s) and was given back; when c1's second
    mode leads a batch, the first comes with it."""
    est = {"c0-m0": 0.9, "c1-m0": 0.7, "c1-m1": 0.6}
    d, at = _attempts([Task(i, 1, e, G, config=i.split("-")[0]) for i, e in est.items()], 2)
    first = d.next_for(0, 1)
    at.taken(first)
    assert [t.id for t in at.batch(0, first, 1, "w0", 1.0, 64)] == ["c0-m0"]
    lead = d.next_for(0, 1, warm=(G,))
    assert lead is not None and lead.id == "c1-m1"
    at.taken(lead)
    assert [t.id for t in at.batch(0, lead, 1, "w1", 1.0, 64)] == ["c1-m1", "c1-m0"]


BATCHES = [
    # (name, width, target_s, max_batch, singles, avoid, expected batch)
    (
        "all modes of the config, whatever the budget",
        1,
        0.0,
        64,
        set(),
        None,
        ["c0-m0", "c0-m1", "c0-m2", "c0-m3", "c0-m4"],
    ),
    ("max_batch caps it", 1, 0.0, 3, set(), None, ["c0-m0", "c0-m1", "c0-m2"]),
    ("a single runs alone", 1, 0.0, 64, {"c0-m0"}, None, ["c0-m0"]),
    ("a sibling run alone stays out", 1, 0.0, 64, {"c0-m2"}, None, ["c0-m0", "c0-m1", "c0-m3", "c0-m4"]),
    ("a retry avoiding this worker stays out", 1, 0.0, 64, set(), "c0-m1", ["c0-m0", "c0-m2", "c0-m3", "c0-m4"]),
]


@pytest.mark.parametrize("name,width,target,max_batch,singles,avoid,expected", BATCHES, ids=[b[0] for b in BATCHES])
def test_batch_takes_the_config(name, width, target, max_batch, singles, avoid, expected):
    tasks = _tasks(2)
    cases = {t.id: _case("NONE", seed=i) for i, t in enumerate(tasks)}
    d = Dispatcher(tasks, [4])
    at = Attempts(cases, d, retries=1, unit="GPU")
    at.queue(tasks)
    at.singles |= singles
    if avoid is not None:
        at.first[avoid] = dataclasses.replace(at.first.get(avoid) or _result(avoid), worker="w0")
    first = d.next_for(0, width)
    at.taken(first)
    batch = at.batch(0, first, width, "w0", target, max_batch)
    assert [t.id for t in batch] == expected
    left = set()  # what was not batched is still there to dispatch
    while (t := d.next_for(0, 4)) is not None:
        left.add(t.id)
    assert left == {t.id for t in tasks} - set(expected)


def _result(case_id: str):
    from backend.result import CaseResult

    return CaseResult(case_id=case_id, status=Status.FAIL)


def test_grouped_estimates():
    cases = [_case(m) for m in MODES] + [_case("FULL", seed=1)]
    est = {c.case_id: 1.0 + i for i, c in enumerate(cases)}
    history = {cases[0].case_id: 0.7}
    out = grouped_estimates(cases, est, config_key, history)
    lead = cases[4].case_id  # the longest of seed 0's config pays the shared work
    assert out[lead] == est[lead]
    assert out[cases[0].case_id] == est[cases[0].case_id]  # history says what it cost
    assert [out[c.case_id] for c in cases[1:4]] == [est[c.case_id] * LATER_MODE_FACTOR for c in cases[1:4]]
    assert out[cases[5].case_id] == est[cases[5].case_id]  # alone in its config


@pytest.mark.xdist_group("ray")
def test_a_configs_modes_run_on_one_worker(ray_cluster):
    """4 workers, 4 configs x 5 modes of 0.3 s cases, batches of one case otherwise (target 0):
    every config's modes ran on one worker, and the work was spread over several."""
    cases = [_case(m, seed=s) for s in range(4) for m in MODES]
    config = ExecConfig(runner=RUNNER, poll_s=0.1, setup_timeout_s=60, retries=0, batch_target_s=0.0)
    final = Executor(session_node(4), config).run(cases)
    assert {r.status for r in final.values()} == {Status.PASS}
    workers = defaultdict(set)
    for c in cases:
        workers[config_key(c)].add(final[c.case_id].worker)
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert len(set().union(*workers.values())) > 1


def test_a_task_that_fills_a_batch_brings_its_config():
    """The group fill takes c1's first mode after c0's modes; c1's cheap modes come with it,
    although c2's first mode is longer and would end the fill (budget 10 s)."""
    est = {"c0": (3.0, 1.5, 1.5), "c1": (2.9, 0.1, 0.1), "c2": (2.8, 0.1, 0.1)}
    d, at = _attempts([Task(f"{c}-m{m}", 1, e, G, config=c) for c, es in est.items() for m, e in enumerate(es)], 4)
    first = d.next_for(0, 1)
    at.taken(first)
    batch = at.batch(0, first, 1, "w0", 10.0, 64)
    assert [t.id for t in batch] == ["c0-m0", "c0-m1", "c0-m2", "c1-m0", "c1-m1", "c1-m2"]
