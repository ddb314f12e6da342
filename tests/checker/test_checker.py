"""run_case end to end on the real providers, graph runner and checks (tiny shapes, CPU)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from backend.case import BatchSpec
from backend.harness import checker, step_data  # tests patch their internals
from backend.harness.checker import PHASES, SessionCache, run_case
from backend.harness.timing import NAMED, finish_timings
from backend.result import CORE_CHECKS, Status
from tests.checker.conftest import DECODE, MIXED, TINY, make_case

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@pytest.mark.parametrize("backend", ["torch", "aiter-emulated"])
@pytest.mark.parametrize("mode", MODES)
def test_correct_providers_are_green_everywhere(backend, mode, sessions):
    """3 seeds x {decode, mixed} x {auto, fp8} through one session per (mode, kv): all pass."""
    for kv in ("auto", "fp8"):
        for batch in (DECODE, MIXED):
            for seed in (0, 1, 2):
                r = run_case(make_case(backend, mode, kv, batch, seed=seed), sessions=sessions)
                assert r.status == Status.PASS, (kv, batch.name, seed, r.reason, r.log_tail[-1500:])
                names = [c.name for c in r.checks]
                assert names == list(CORE_CHECKS)  # no family checks for gqa


def test_result_records_everything():
    case = make_case("torch", "FULL_AND_PIECEWISE", "auto", MIXED)
    # Its own sessions: in the shared ones an earlier PIECEWISE case of the same batch may have run
    # these steps down the same graphs; then every step is shared and no dummy step runs (churn_s 0).
    r = run_case(case, sessions=SessionCache())
    assert r.status == Status.PASS
    on_gpu = torch.cuda.is_available()
    graph_kind = ("hip" if torch.version.hip else "cuda") if on_gpu else "emulated"
    assert (r.requested_mode, r.resolved_mode, r.downgraded, r.graph_kind) == (
        "FULL_AND_PIECEWISE",
        "FULL_AND_PIECEWISE",
        False,
        graph_kind,
    )
    assert r.provider == "torch"
    assert (r.device.startswith("NVIDIA") or "cuda" in r.device) if on_gpu else r.device == "cpu", r.device
    assert r.capture_sizes_used[0] == 8 and len(r.capture_sizes_used) == case.steps
    assert set(r.timings) == {
        "capture_s",
        "eager_step_s",
        "replay_step_s",
        "total_s",
        "other_s",
        "eager_shared_steps",
        "graph_shared_steps",
        *PHASES,
        *(("device_s",) if on_gpu else ()),  # the device time its events measured (a GPU's busy share)
    }
    if on_gpu:  # the dummy step before each replay is timed apart from the step's inputs
        assert r.timings["churn_s"] > 0, r.timings
    assert {"torch", "python", "orch"} <= set(r.versions)
    assert r.repro == case.repro_command() and r.axes == case.axes
    replay = next(c for c in r.checks if c.name == "replay")
    assert replay.bitwise is not None and replay.max_abs_err is not None


def test_none_mode_has_no_graph_and_eager_sizes(sessions):
    r = run_case(make_case("torch", "NONE", "auto", DECODE), sessions=sessions)
    assert r.status == Status.PASS and r.graph_kind == "none" and set(r.capture_sizes_used) == {0}


def test_batch_above_the_largest_capture_size_runs_eager():
    big = BatchSpec("big", (1, 40), (50, 60))
    r = run_case(make_case("torch", "FULL", "auto", big))
    assert r.status == Status.PASS and r.capture_sizes_used[0] == 0


def test_sessions_are_reused_across_seeds():
    cache = SessionCache(capacity=2)
    first = run_case(make_case("torch", "FULL", "auto", DECODE, seed=5), sessions=cache)
    second = run_case(make_case("torch", "FULL", "auto", DECODE, seed=6), sessions=cache)
    assert first.status == second.status == Status.PASS
    assert (cache.misses, cache.hits, len(cache)) == (1, 1, 1)
    assert first.timings["capture_s"] > 0
    # seed 6 plans other steps: it may add a size, but never re-captures seed 5's graphs
    assert second.timings["capture_s"] < first.timings["capture_s"] or set(second.capture_sizes_used) - set(
        first.capture_sizes_used
    )


def test_session_cache_is_bounded():
    cache = SessionCache(capacity=2)
    for backend, kv in (("torch", "auto"), ("torch", "fp8"), ("aiter-emulated", "auto")):
        run_case(make_case(backend, "FULL", kv, DECODE), sessions=cache)
    assert len(cache) == 2 and cache.misses == 3


def test_modes_share_one_session_and_its_graphs():
    cache = SessionCache(capacity=4)
    results = [
        run_case(make_case("torch", mode, "auto", DECODE), sessions=cache)
        for mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "PIECEWISE")
    ]
    assert all(r.status == Status.PASS for r in results), [r.reason for r in results]
    assert (cache.misses, len(cache)) == (1, 1)
    # FULL replays decode batches through its mixed FULL graphs; FULL_DECODE_ONLY captures the
    # uniform-decode FULL graphs, which FULL_AND_PIECEWISE then reuses without capturing.
    assert results[0].timings["capture_s"] > 0 and results[1].timings["capture_s"] > 0
    assert results[2].timings["capture_s"] == 0


def test_modes_share_the_eager_side_and_give_the_verdicts_of_a_lone_run(monkeypatch):
    from backend.harness.session import LRU

    monkeypatch.setattr(step_data, "REFERENCES", LRU(64))
    cache = SessionCache(capacity=1)
    first = run_case(make_case("torch", "FULL", "auto", MIXED, seed=3), sessions=cache)
    shared = run_case(make_case("torch", "PIECEWISE", "auto", MIXED, seed=3), sessions=cache)
    other_seed = run_case(make_case("torch", "PIECEWISE", "auto", MIXED, seed=4), sessions=cache)
    alone = run_case(make_case("torch", "PIECEWISE", "auto", MIXED, seed=3))
    steps = len(first.capture_sizes_used)
    assert (
        first.timings["eager_shared_steps"],
        shared.timings["eager_shared_steps"],
        other_seed.timings["eager_shared_steps"],
        alone.timings["eager_shared_steps"],
    ) == (0, steps, 0, 0)
    assert shared.timings["reference_s"] == 0 < first.timings["reference_s"]
    assert shared.status == alone.status == Status.PASS
    for a, b in zip(shared.checks, alone.checks):
        assert (a.name, a.passed, a.max_abs_err, a.bitwise) == (b.name, b.passed, b.max_abs_err, b.bitwise)


def _same_checks(a, b) -> bool:
    return [
        (c.name, c.passed, c.step, c.max_abs_err, c.max_rel_err, c.first_bad, c.bitwise, c.detail) for c in a.checks
    ] == [(c.name, c.passed, c.step, c.max_abs_err, c.max_rel_err, c.first_bad, c.bitwise, c.detail) for c in b.checks]


# (backend, batch, mode that runs first, mode that reuses its graph side): decode steps go through
# the one uniform-decode FULL graph in FULL_DECODE_ONLY and FULL_AND_PIECEWISE; a mixed step runs
# eagerly in NONE and FULL_DECODE_ONLY; the padded-NaN mutant is red through the shared FULL graph.
GRAPH_SHARING = [
    ("torch", DECODE, "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", Status.PASS),
    ("torch", MIXED, "NONE", "FULL_DECODE_ONLY", Status.PASS),
    ("aiter-emulated", MIXED, "PIECEWISE", "FULL_AND_PIECEWISE", Status.PASS),
    ("tests.mutants.padded_nan:Backend", DECODE, "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", Status.FAIL),
]


@pytest.mark.parametrize("backend, batch, first_mode, mode, status", GRAPH_SHARING)
def test_modes_that_dispatch_a_step_alike_share_its_graph_side(monkeypatch, backend, batch, first_mode, mode, status):
    from backend.harness.session import LRU

    monkeypatch.setattr(step_data, "REFERENCES", LRU(64))
    cache = SessionCache(capacity=1)
    first = run_case(make_case(backend, first_mode, "auto", batch, seed=3), sessions=cache)
    shared = run_case(make_case(backend, mode, "auto", batch, seed=3), sessions=cache)
    alone = run_case(make_case(backend, mode, "auto", batch, seed=3))
    steps = len(shared.capture_sizes_used)
    assert (
        first.timings["graph_shared_steps"],
        shared.timings["graph_shared_steps"],
        alone.timings["graph_shared_steps"],
    ) == (0, steps, 0)
    # nothing of the step ran again: no inputs written, no snapshot, no checks
    assert shared.timings["inputs_s"] == shared.timings["checks_s"] == 0
    assert shared.status == alone.status == status, (shared.reason, alone.reason)
    assert shared.reason == alone.reason and shared.capture_sizes_used == alone.capture_sizes_used
    assert _same_checks(shared, alone)


def test_a_mode_that_dispatches_otherwise_runs_its_own_graph_side():
    cache = SessionCache(capacity=1)
    run_case(make_case("torch", "FULL", "auto", DECODE, seed=3), sessions=cache)  # mixed FULL graphs
    own = run_case(make_case("torch", "FULL_DECODE_ONLY", "auto", DECODE, seed=3), sessions=cache)
    assert own.timings["graph_shared_steps"] == 0 < own.timings["eager_shared_steps"]


def test_a_case_run_again_runs_its_graph_side_again():
    """The executor retries a failed case on the same worker when there is no other (one GPU): a
    retry exists to see another outcome, so it reuses no graph side, not even one another mode made."""
    cache = SessionCache(capacity=1)
    run_case(make_case("torch", "FULL_DECODE_ONLY", "auto", DECODE, seed=3), sessions=cache)
    first = run_case(make_case("torch", "FULL_AND_PIECEWISE", "auto", DECODE, seed=3), sessions=cache)
    retry = run_case(make_case("torch", "FULL_AND_PIECEWISE", "auto", DECODE, seed=3), sessions=cache)
    assert first.timings["graph_shared_steps"] > 0
    assert retry.timings["graph_shared_steps"] == 0 and retry.timings["checks_s"] > 0
    assert _same_checks(first, retry)


def test_nothing_memoised_in_one_gang_is_reused_in_another(monkeypatch):
    """A reuse skips the step's collectives, so every rank of a gang must reuse alike: what a rank
    memoised counts only in the gang (backend.harness.distributed.gang_id) it memoised it in."""

    cache = SessionCache(capacity=1)
    monkeypatch.setattr(checker, "gang_id", lambda: "127.0.0.1:1111")
    run_case(make_case("torch", "FULL_DECODE_ONLY", "auto", DECODE, seed=3), sessions=cache)
    monkeypatch.setattr(checker, "gang_id", lambda: "127.0.0.1:2222")
    other = run_case(make_case("torch", "FULL_AND_PIECEWISE", "auto", DECODE, seed=3), sessions=cache)
    assert other.timings["graph_shared_steps"] == other.timings["eager_shared_steps"] == 0
    again = run_case(make_case("torch", "FULL", "auto", DECODE, seed=3), sessions=cache)
    assert again.timings["eager_shared_steps"] > 0  # the same gang: its own eager side is reused


def test_backends_share_the_reference_but_not_the_eager_side(monkeypatch):
    from backend.harness.session import LRU

    monkeypatch.setattr(step_data, "REFERENCES", LRU(64))
    calls = []
    real = step_data.compute_reference
    monkeypatch.setattr(step_data, "compute_reference", lambda *a: calls.append(a[0].backend) or real(*a))
    cache = SessionCache(capacity=2)
    torch_r = run_case(make_case("torch", "FULL", "fp8", MIXED, seed=8), sessions=cache)
    emu = run_case(make_case("aiter-emulated", "FULL", "fp8", MIXED, seed=8), sessions=cache)
    broken = run_case(make_case("tests.mutants.wrong_prefill:Backend", "FULL", "fp8", MIXED, seed=8), sessions=cache)
    assert calls == ["torch"] * len(torch_r.capture_sizes_used)  # one per step, none for the others
    assert emu.timings["eager_shared_steps"] == 0
    assert torch_r.status == emu.status == Status.PASS
    # the reference came from the torch case's steps, and still catches a wrong eager output
    assert broken.status == Status.FAIL and broken.reason.startswith("reference check failed")


def test_step_inputs_drawn_once_per_batch_step_and_equal_to_a_fresh_draw(monkeypatch):
    """Inputs depend on (plan, shape, seed, device) only: every mode, kv dtype and backend of a
    batch reads one draw per step, equal to a fresh draw after the cases used it."""
    from backend.harness.steps import make_step_inputs

    monkeypatch.setattr(step_data, "INPUTS", step_data.new_inputs_cache())
    drawn = []
    monkeypatch.setattr(step_data, "make_step_inputs", lambda p, *a: drawn.append(p.index) or make_step_inputs(p, *a))
    cache = SessionCache(capacity=2)
    results = [
        run_case(make_case(b, m, kv, MIXED, seed=5), sessions=cache)
        for b, m, kv in (("torch", "FULL", "auto"), ("torch", "NONE", "fp8"), ("aiter-emulated", "PIECEWISE", "auto"))
    ]
    steps = len(results[0].capture_sizes_used)
    assert sorted(drawn) == list(range(steps))  # one draw per step for the three cases
    # another seed draws its own, step 0 included (whose plan, the spec as written, is the same)
    other = run_case(make_case("torch", "FULL", "auto", MIXED, seed=6), sessions=cache)
    assert sorted(drawn) == sorted(list(range(steps)) * 2) and other.status == Status.PASS
    assert all(r.status == Status.PASS for r in results)
    for key, cached in step_data.INPUTS.items():
        plan, shape, seed, device = key
        fresh = make_step_inputs(plan, shape, seed, device)
        assert torch.equal(cached.x, fresh.x) and torch.equal(cached.batch.slot_mapping, fresh.batch.slot_mapping)
        assert all(
            torch.equal(a, b)
            for a, b in zip([t for p in cached.ctx_flat for t in p], [t for p in fresh.ctx_flat for t in p])
        )


def test_step_inputs_cache_is_bounded_by_bytes(monkeypatch):
    from backend.harness.steps import plan_steps

    keys = [(p, seed) for seed in range(4) for p in plan_steps(MIXED, TINY, (1, 2, 4, 8, 16, 32), 6, seed)]
    biggest = max(step_data.make_step_inputs(p, TINY, seed, "cpu").nbytes for p, seed in keys)
    monkeypatch.setattr(step_data, "INPUTS", step_data.new_inputs_cache(8 * biggest))  # every entry fits; 24 do not
    for p, seed in keys:
        step_data.step_inputs(p, TINY, seed, torch.device("cpu"))
    assert sum(v.nbytes for v in step_data.INPUTS.values()) <= 8 * biggest
    assert 0 < len(step_data.INPUTS) < len(keys)
    assert list(step_data.INPUTS)[-1][:3] == (keys[-1][0], TINY, keys[-1][1])  # the newest is kept, the oldest went


def test_a_capture_error_keeps_the_session():
    cache = SessionCache(capacity=2)
    ok = run_case(make_case("torch", "FULL", "auto", DECODE), sessions=cache)
    bad = run_case(make_case("tests.mutants.host_sync:Backend", "FULL", "auto", DECODE), sessions=cache)
    again = run_case(make_case("tests.mutants.host_sync:Backend", "PIECEWISE", "auto", MIXED), sessions=cache)
    assert ok.status == Status.PASS and bad.error_kind == "capture" and len(cache) == 2
    assert again.status == Status.PASS and (cache.misses, cache.hits) == (2, 1)  # the same session, reused


VERDICT_SCENARIOS = {
    # name: (case changes, status, error_kind, reason prefix)
    "unknown backend": (dict(backend="no.such.module:Backend"), Status.ERROR, "exception", "backend: "),
    "case tp differs from the gang size": (dict(tp=3), Status.ERROR, "exception", "invalid case: tp 3"),
    "more requests than max_num_seqs": (
        dict(batch=BatchSpec("wide", (1,) * 9, (10,) * 9)),
        Status.ERROR,
        "exception",
        "invalid case: ",
    ),
    "host sync under FULL capture": (
        dict(backend="tests.mutants.host_sync:Backend"),
        Status.ERROR,
        "capture",
        "capture error (tests/mutants/host_sync.py, line 15, in forward): FULL size 8",
    ),
    "kv dtype the backend lacks": (
        dict(backend="tests.checker.test_checker:NoFp8Backend", kv_cache_dtype="fp8"),
        Status.SKIP,
        "",
        "unsupported: kv_cache_dtype fp8",
    ),
    "FULL with a NEVER backend": (
        dict(backend="tests.checker.test_checker:NeverBackend"),
        Status.SKIP,
        "",
        "unsupported: CUDAGraphMode.FULL",
    ),
}


from backend.attention.interface import AttentionCGSupport  # noqa: E402 - beside the tests that use it
from backend.providers.torch_backend import TorchBackend  # noqa: E402 - beside the tests that use it


class NoFp8Backend(TorchBackend):
    name = "no-fp8"
    supported_kv_cache_dtypes = ("auto",)


class NeverBackend(TorchBackend):
    name = "never"
    cudagraph_support = AttentionCGSupport.NEVER


@pytest.mark.parametrize("name", VERDICT_SCENARIOS)
def test_honest_verdicts_never_raise(name):
    changes, status, error_kind, prefix = VERDICT_SCENARIOS[name]
    case = dataclasses.replace(make_case("torch", "FULL", "auto", MIXED), **changes)
    r = run_case(case)  # world_size 1: a tp 3 case is refused, not run
    assert r.status == status, r.reason
    assert r.error_kind == error_kind
    assert r.reason.startswith(prefix), r.reason
    if status == Status.ERROR and error_kind == "capture":
        assert "Traceback" in r.log_tail and r.resolved_mode == "FULL"


LAYOUT_SCENARIOS = {
    # (num_heads, num_kv_heads, tp, rank): (q heads, kv heads) of that rank, or None if unshardable
    (4, 2, 1, 0): ((0, 1, 2, 3), (0, 1)),
    (4, 2, 2, 1): ((2, 3), (1,)),
    (8, 2, 4, 1): ((2, 3), (0,)),  # kv heads replicated: ranks 0-1 share head 0
    (8, 2, 4, 2): ((4, 5), (1,)),
    (6, 3, 2, 0): None,  # 3 kv heads over 2 ranks
    (4, 2, 3, 0): None,
}


@pytest.mark.parametrize("key", LAYOUT_SCENARIOS)
def test_tp_layout(key):
    from backend.harness.model import TPLayout, layout_reasons

    heads, kv, tp, rank = key
    shape = dataclasses.replace(TINY, num_heads=heads, num_kv_heads=kv)
    expected = LAYOUT_SCENARIOS[key]
    assert bool(layout_reasons(shape, tp)) == (expected is None)
    if expected is not None:
        lay = TPLayout(tp, rank, heads, kv, 16)
        assert (tuple(lay.q_heads), tuple(lay.kv_heads)) == expected


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_spec_decode_graph_above_the_largest_capture_size_runs(mode):
    """k = 2 on 11 decode rows (33 tokens): the decode graph of the largest capture size 32 has
    cdiv(32, 3) = 11 requests = 33 tokens, one more row than max(capture_sizes); the session's
    static buffers must hold the largest captured graph (an ERROR otherwise: 'size of tensor a
    (33) must match ... (32)'; decode_64 k2 cells on CPU: 86 x 3 = 258 > 256)."""
    batch = BatchSpec("decode11", (1,) * 11, (40,) * 11)
    case = make_case(mode=mode, batch=batch, spec_tokens=2, model=dataclasses.replace(TINY, max_num_seqs=16))
    result = run_case(case, device=torch.device("cpu"))
    assert result.status == Status.PASS, (result.reason, result.log_tail[-1500:])
    assert 33 in result.capture_sizes_used


def test_our_providers_share_sessions_across_spec_tokens():
    """Only a backend that sizes by k (`sizes_by_spec_tokens`, vLLM's) gets k in its config and
    a session per k; ours share the session (its KV cache is GBs on a GPU)."""
    from backend.harness.checker import SessionCache

    sessions = SessionCache(capacity=4)
    for k in (0, 2):
        assert (
            run_case(make_case("torch", "NONE", "auto", DECODE, spec_tokens=k), sessions=sessions).status == Status.PASS
        )
    assert len(sessions._sessions) == 1
    (session,) = sessions._sessions.values()
    assert session.config.spec_tokens == 0


def _attn_reference_error(backend: str, kv: str) -> float:
    from backend.result import CHECK_ATTN_REFERENCE

    r = run_case(make_case(backend, "NONE", kv, MIXED, seed=3), sessions=SessionCache(capacity=1))
    check = next(c for c in r.checks if c.name == CHECK_ATTN_REFERENCE)
    return check.max_abs_err


def test_reference_rounds_the_query_of_a_backend_that_declares_an_fp8_query():
    """A backend whose layer hands its kernel an fp8 query (vLLM: supports_quant_query_input)
    declares the scale; the reference then attends with the same rounded query, so the reference
    checks measure the kernel, not the quantisation. Undeclared, the same rounding is error."""
    declared = _attn_reference_error("tests.mutants.fp8_query:QueryFp8Declared", "fp8")
    undeclared = _attn_reference_error("tests.mutants.fp8_query:QueryFp8Undeclared", "fp8")
    plain = _attn_reference_error("torch", "fp8")
    # As close as a provider with a bf16 query: both outputs are bf16, so at most a rounding flip
    # of one output element apart (one bf16 ulp below magnitude 1, 2^-8) beyond the plain error.
    assert declared <= plain + 2.0**-8
    assert undeclared > 2 * declared  # the rounding the reference no longer sees is large
    # kv auto: nothing is rounded, nothing is declared
    assert _attn_reference_error("tests.mutants.fp8_query:QueryFp8Declared", "auto") == _attn_reference_error(
        "torch", "auto"
    )


@pytest.mark.parametrize("mode", ["NONE", "FULL_AND_PIECEWISE"])
def test_the_phases_name_every_millisecond(mode):
    """A case's total is its named phases plus other_s, and other_s is a small rest: a fresh
    session (built, captured) and the next mode of the config (memoised eager and reference)."""
    cache = SessionCache(capacity=1)
    for m in (mode, "FULL"):
        t = run_case(make_case("torch", m, "auto", MIXED), sessions=cache).timings
        named = sum(t[k] for k in NAMED)
        assert abs(named + t["other_s"] - t["total_s"]) < 1e-9, t
        assert 0 <= t["other_s"] <= 0.1 * t["total_s"] + 0.005, t


def test_the_graph_runner_made_on_a_sessions_first_graph_mode_is_session_time(monkeypatch):
    """The runner is made lazily, on the session's first graph mode (here FULL after NONE): its
    making is timed in session_s, not left in no phase."""
    import backend.graphs

    real = backend.graphs.make_graph_runner

    def slow(device):
        time.sleep(0.05)
        return real(device)

    monkeypatch.setattr(backend.graphs, "make_graph_runner", slow)
    cache = SessionCache(capacity=1)
    assert run_case(make_case("torch", "NONE", "auto", MIXED), sessions=cache).status == Status.PASS
    t = run_case(make_case("torch", "FULL", "auto", MIXED), sessions=cache).timings
    assert t["session_s"] >= 0.05 and t["other_s"] < 0.05, t


FINISH = [
    # (name, named phases, total, other_s)
    ("the rest is other", {"capture_s": 0.1, "eager_s": 0.2}, 0.4, 0.1),
    ("nothing named", {}, 0.3, 0.3),
    ("device phases past the host's total: 0", {"replay_s": 0.5}, 0.4, 0.0),
    ("unnamed keys are not phases", {"eager_step_s": 0.3, "checks_s": 0.1}, 0.2, 0.1),
]


@pytest.mark.parametrize("name,timings,total,other", FINISH, ids=[f[0] for f in FINISH])
def test_finish_timings(name, timings, total, other):
    out = finish_timings(timings, total)
    assert out["total_s"] == total and out["other_s"] == pytest.approx(other)
