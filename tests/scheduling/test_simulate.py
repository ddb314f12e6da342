"""The simulator: bounds hold, ours reaches the target, the anchors are worse, and the CLI."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main as orch
from orchestrator.scheduling.policy import POLICIES, Task
from orchestrator.scheduling.simulate import lower_bound, simulate, synthetic_workload

MID = dict(n_cases=2000, seed=7, sigma=0.5)
MID_NODES = [8] * 8  # 64 GPUs


@pytest.fixture(scope="module")
def mid_results():
    tasks, true = synthetic_workload(**MID)
    return {p: simulate(tasks, MID_NODES, p, true) for p in POLICIES}


def test_ours_within_5_percent_of_the_lower_bound(mid_results):
    assert mid_results["ours"].ratio <= 1.05


def test_ours_clearly_beats_both_anchors(mid_results):
    ours = mid_results["ours"].makespan
    assert ours * 1.10 < mid_results["hash"].makespan
    assert ours * 1.10 < mid_results["static-duration"].makespan


@pytest.mark.parametrize(
    "scenario, n_cases, nodes, sigma, seed",
    [
        ("one-node", 200, [8], 0.5, 1),
        ("mixed-nodes", 300, [8, 4, 8, 2], 1.0, 2),
        ("exact-estimates", 300, [8] * 4, 0.0, 3),
        ("single-task", 1, [8, 8], 0.5, 4),
    ],
)
@pytest.mark.parametrize("policy", POLICIES)
def test_makespan_never_below_the_lower_bound(policy, scenario, n_cases, nodes, sigma, seed):
    tasks, true = synthetic_workload(n_cases, seed, sigma, max_tp=max(nodes))
    r = simulate(tasks, nodes, policy, true)
    assert r.makespan >= r.lower_bound * (1 - 1e-9)
    assert 0 < r.gpu_utilisation <= 1 + 1e-9
    # Every GPU-second of work ran: utilisation x capacity = work.
    work = sum(true[t.id] * t.tp for t in tasks)
    assert r.gpu_utilisation * r.makespan * sum(nodes) == pytest.approx(work)


@pytest.mark.parametrize(
    "tasks, nodes, expected",
    [
        ([Task("a", 1, 1.0), Task("b", 1, 1.0)], [2], 1.0),  # area = 2/2, longest = 1
        ([Task("a", 1, 10.0), Task("b", 1, 1.0)], [2], 10.0),  # longest task
        ([Task("a", 4, 3.0), Task("b", 4, 3.0)], [6], 6.0),  # wide: two tp4 never share 6 GPUs
        ([Task("a", 4, 3.0), Task("b", 4, 3.0)], [8], 3.0),  # tp4 pair fits side by side
    ],
    ids=["area", "longest", "wide-gangs-serialise", "narrow-gangs-share"],
)
def test_lower_bound_table(tasks, nodes, expected):
    durations = {t.id: t.est_s for t in tasks}
    assert lower_bound(tasks, nodes, durations) == pytest.approx(expected)


def test_wide_gang_bound_is_achieved_exactly():
    # 6-GPU node: tp4 gangs run one at a time (area bound 4.1, wide bound 6); the tp1 backfills.
    tasks = [Task(f"g{i}", 4, 2.0) for i in range(3)] + [Task("one", 1, 0.5)]
    true = {t.id: t.est_s for t in tasks}
    r = simulate(tasks, [6], "ours", true)
    assert r.lower_bound == pytest.approx(6.0)
    assert r.makespan == pytest.approx(6.0)


def test_workload_is_deterministic_and_has_the_tp_mix():
    a, ta = synthetic_workload(4000, seed=5, sigma=0.5)
    b, tb = synthetic_workload(4000, seed=5, sigma=0.5)
    assert a == b and ta == tb
    share = {tp: sum(t.tp == tp for t in a) / len(a) for tp in (1, 2, 4, 8)}
    assert share[1] == pytest.approx(0.55, abs=0.03) and share[8] == pytest.approx(0.10, abs=0.02)
    exact, true0 = synthetic_workload(50, seed=5, sigma=0.0)
    assert all(true0[t.id] == t.est_s for t in exact)
    assert all(t.tp <= 2 for t in synthetic_workload(200, seed=5, max_tp=2)[0])


def test_cli_json_parses(capsys):
    rc = orch(["simulate", "--gpus", "16", "--nodes", "2", "--cases", "200", "--policy", "all", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(POLICIES)
    for r in out.values():
        assert set(r) == {"makespan", "lower_bound", "ratio", "gpu_utilisation"}
        assert r["ratio"] >= 1.0 - 1e-9


def test_cli_table_names_each_policy(capsys):
    assert orch(["simulate", "--gpus", "8", "--nodes", "1", "--cases", "50", "--policy", "hash"]) == 0
    out = capsys.readouterr().out
    assert "hash" in out and "ours" not in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "65", "--nodes", "8"], "--gpus must be a positive multiple of --nodes"),
        (["--cases", "0"], "--cases must be >= 1"),
        (["--nodes", "0"], "--nodes must be >= 1"),
        (["--sigma", "-1"], "--sigma must be in"),
        (["--policy", "fifo"], "fifo"),
    ],
    ids=["gpus-not-divisible", "zero-cases", "zero-nodes", "negative-sigma", "unknown-policy"],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, args, message):
    assert orch(["simulate", "--cases", "10", *args] if "--cases" not in args else ["simulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_a_configs_modes_kept_together_share_their_work():
    """Configs of 5 modes whose later modes cost half after the first on one worker: ours keeps
    each config together and stays near the bound; without that every mode pays the whole."""
    from orchestrator.scheduling.simulate import config_workload

    tasks, true, alone = config_workload(100, 5, seed=3, sigma=0.5, max_tp=8)
    grouped = simulate(tasks, [8] * 2, "ours", true, alone)
    scattered = simulate(tasks, [8] * 2, "ours", true, alone, group=False)
    assert grouped.ratio <= 1.05
    assert grouped.makespan * 1.3 < scattered.makespan


def test_simulate_cli_models_configs(capsys):
    assert (
        orch(
            [
                "simulate",
                "--gpus",
                "8",
                "--nodes",
                "1",
                "--cases",
                "100",
                "--modes-per-config",
                "5",
                "--policy",
                "ours",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert set(rows) == {"ours", "ours-ungrouped"} and rows["ours"]["makespan"] < rows["ours-ungrouped"]["makespan"]
    assert orch(["simulate", "--cases", "4", "--modes-per-config", "0"]) == 2
    assert "--modes-per-config" in capsys.readouterr().err
