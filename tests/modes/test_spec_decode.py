"""Speculative decoding under graphs (DESIGN.md §4b): vLLM's rules for k > 0, as
scenario tables. Sources: V2 vllm/v1/worker/gpu/cudagraph_utils.py (uniform_decode_query_len =
1 + num_speculative_tokens; get_cudagraph_sizes keeps decode sizes <= max_num_reqs * q and >= q;
get_cudagraph_runtime_mode: uniform when max_query_len == q and num_tokens == q * num_reqs), V1
gpu_model_runner._dummy_run (cdiv(num_tokens, q) requests of q), vllm/config/compilation.py (the
spec-decode downgrade and its warning)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from backend.attention.interface import AttentionCGSupport as S
from backend.case import BatchSpec
from backend.harness.checker import SessionCache, run_case
from backend.harness.modes import CUDAGraphMode as M
from backend.harness.modes import (
    Dispatch,
    UnsupportedModeError,
    capture_plan,
    decode_capture_sizes,
    dispatch,
    is_uniform_decode,
    resolve_capture_sizes,
    resolve_mode,
    spec_decode_capture_sizes,
    uniform_decode_query_len,
    vllm_capture_sizes,
)
from backend.harness.steps import plan_steps, verify_rows
from backend.result import Status
from tests.checker.conftest import CAPTURE_SIZES, DECODE, MIXED, TINY, make_case

# (requested, support) -> resolved, for k > 0 with piecewise available. Differs from k = 0 only
# where a FULL decode graph would need more than UNIFORM_SINGLE_TOKEN_DECODE.
SPEC_RESOLUTION = {
    (M.FULL, S.ALWAYS): M.FULL,
    (M.FULL, S.UNIFORM_BATCH): M.FULL_AND_PIECEWISE,
    (M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE): M.PIECEWISE,  # k = 0: FULL_AND_PIECEWISE
    (M.FULL_DECODE_ONLY, S.UNIFORM_BATCH): M.FULL_DECODE_ONLY,
    (M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE): M.PIECEWISE,  # k = 0: FULL_DECODE_ONLY
    (M.FULL_AND_PIECEWISE, S.UNIFORM_BATCH): M.FULL_AND_PIECEWISE,
    (M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.PIECEWISE,  # k = 0: FULL_AND_PIECEWISE
    (M.FULL_AND_PIECEWISE, S.NEVER): M.PIECEWISE,
    (M.PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.PIECEWISE,
    (M.NONE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.NONE,
}


@pytest.mark.parametrize("key", SPEC_RESOLUTION, ids=lambda k: f"{k[0].name}-{k[1].name}")
def test_spec_decode_resolution(key):
    mode, support = key
    r = resolve_mode(mode, support, backend_name="X", spec_tokens=2)
    assert r.resolved == SPEC_RESOLUTION[key] and r.downgraded == (r.resolved != mode)
    if support == S.UNIFORM_SINGLE_TOKEN_DECODE and mode.has_full():
        assert (
            "is not supported with spec-decode for attention backend X (support: "
            "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=PIECEWISE"
        ) in r.message


def test_spec_decode_without_piecewise_falls_to_none():
    r = resolve_mode(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, piecewise_available=False, spec_tokens=1)
    assert r.resolved == M.NONE and "setting cudagraph_mode=NONE" in r.message
    # k = 0 keeps the decode graph: the rule is about q > 1 only
    assert resolve_mode(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, spec_tokens=0).resolved == M.FULL_DECODE_ONLY


# (configured sizes, k) -> sizes after vllm/config/compilation.py
# CompilationConfig.adjust_cudagraph_sizes_for_spec_decode: round up to multiples of 1 + k, drop a
# rounded size above the largest configured one, [q] when nothing is left but q fits.
ROUNDING = {
    ((1, 2, 4, 8, 16, 24), 2): (3, 6, 9, 18, 24),  # 1, 2 -> 3; 4 -> 6; 8 -> 9; 16 -> 18; 24 stays
    ((1, 2, 4, 8, 16, 32, 64, 128, 256), 2): (3, 6, 9, 18, 33, 66, 129),  # 256 -> 258 > 256: dropped
    ((1, 2, 4, 8, 16), 1): (2, 4, 8, 16),
    ((*range(8, 256, 8), *range(256, 513, 16)), 2): tuple(
        sorted({-(-s // 3) * 3 for s in (*range(8, 256, 8), *range(256, 513, 16))} - {513})
    ),  # 512 -> 513 dropped, 510 is the top
    ((4,), 3): (4,),
    ((1, 2), 1): (2,),
    ((3,), 2): (3,),
    ((2,), 2): None,  # q = 3 > largest size 2: vLLM raises "No valid cudagraph sizes ..."
    ((1, 2, 4), 0): (1, 2, 4),  # q = 1: unchanged
}


@pytest.mark.parametrize("key", ROUNDING, ids=lambda k: f"{len(k[0])}sizes-max{max(k[0])}-k{k[1]}")
def test_spec_decode_rounding(key):
    sizes, k = key
    if ROUNDING[key] is None:
        with pytest.raises(UnsupportedModeError, match="no valid cudagraph sizes after rounding to multiples of 3"):
            spec_decode_capture_sizes(sizes, k)
        return
    got = spec_decode_capture_sizes(sizes, k)
    assert got == ROUNDING[key]
    assert all(s % (1 + k) == 0 and s <= max(sizes) for s in got)


CPU_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# (resolved mode, k, capture style) -> rounded? V1 rounds only when the resolved decode mode is FULL
# and k > 0 (resolve_cudagraph_mode_and_sizes: `not use_v2_model_runner and decode_mode() == FULL
# and uniform_decode_query_len > 1`); V2 never does (decode graphs keyed by request count).
RESOLVED_SIZES = {
    (M.FULL_DECODE_ONLY, 2, "v1"): True,
    (M.FULL_AND_PIECEWISE, 2, "v1"): True,
    (M.FULL, 2, "v1"): True,
    (M.PIECEWISE, 2, "v1"): False,  # e.g. the spec-decode downgrade of a single-token backend
    (M.NONE, 2, "v1"): False,
    (M.FULL_DECODE_ONLY, 0, "v1"): False,
    (M.FULL_DECODE_ONLY, 2, "v2"): False,
    (M.FULL, 3, "v2"): False,
}


@pytest.mark.parametrize("key", RESOLVED_SIZES, ids=lambda k: f"{k[0].name}-k{k[1]}-{k[2]}")
def test_sizes_settle_with_the_resolved_mode(key):
    mode, k, style = key
    got = resolve_capture_sizes(CPU_SIZES, mode, k, style)
    if RESOLVED_SIZES[key]:
        assert got.sizes == spec_decode_capture_sizes(CPU_SIZES, k) != CPU_SIZES
        assert f"rounded to multiples of {1 + k}" in got.note
    else:
        assert got.sizes == CPU_SIZES and got.note == ""


def test_downgrade_then_sizes_as_vllm_orders_them():
    """A single-token backend under k > 0: FULL -> FULL_AND_PIECEWISE -> PIECEWISE, and then (the
    sizes step runs after the downgrades) no rounding even in V1."""
    r = resolve_mode(M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE, backend_name="X", spec_tokens=2)
    assert r.resolved == M.PIECEWISE
    assert resolve_capture_sizes(CPU_SIZES, r.resolved, 2, "v1").sizes == CPU_SIZES
    u = resolve_mode(M.FULL, S.UNIFORM_BATCH, backend_name="X", spec_tokens=2)
    assert u.resolved == M.FULL_AND_PIECEWISE
    assert resolve_capture_sizes(CPU_SIZES, u.resolved, 2, "v1").sizes == (3, 6, 9, 18, 33, 66, 129)


def test_configured_default_sizes_grow_with_k_only_below_the_cap():
    # max = min(2 * max_num_seqs * (1 + k), 512, max_num_batched_tokens) (vllm/config/vllm.py)
    assert max(vllm_capture_sizes(8, 8192, 0)) == 16 and max(vllm_capture_sizes(8, 8192, 3)) == 64
    assert vllm_capture_sizes(256, 8192, 2) == vllm_capture_sizes(256, 8192, 0)  # both at 512
    assert max(vllm_capture_sizes(8, 40, 3)) == 40  # the token budget caps (and is appended)


def test_uniform_decode_query_len_and_uniformity():
    assert [uniform_decode_query_len(k) for k in (0, 1, 3)] == [1, 2, 4]
    with pytest.raises(ValueError):
        uniform_decode_query_len(-1)
    assert is_uniform_decode([3, 3, 3], 3) and not is_uniform_decode([3, 1, 3], 3)
    assert not is_uniform_decode([1, 1], 3), "a q = 1 batch is not uniform decode when k = 2"


SIZES = (1, 2, 4, 8, 16, 24, 32)
MAX_SEQS = 8


def test_decode_graph_sizes_are_multiples_of_q_up_to_max_num_seqs_times_q():
    # q = 3: requests min(cdiv(s, 3), 8) for s >= 3 -> {2, 3, 6, 8} -> tokens {6, 9, 18, 24}
    assert decode_capture_sizes(SIZES, MAX_SEQS, 3) == [6, 9, 18, 24]
    assert decode_capture_sizes(SIZES, MAX_SEQS, 4) == [4, 8, 16, 24, 32]
    assert all(s % 4 == 0 and s <= MAX_SEQS * 4 for s in decode_capture_sizes(SIZES, MAX_SEQS, 4))


# (mode, num_tokens, uniform) -> Dispatch, with q = 3 (k = 2), SIZES and max_num_seqs 8.
SPEC_DISPATCH = {
    (M.FULL_AND_PIECEWISE, 9, True): Dispatch("FULL", 9, True),  # 3 verify rows
    (M.FULL_AND_PIECEWISE, 12, True): Dispatch("FULL", 18, True),  # 4 rows pad to 6 requests
    (M.FULL_DECODE_ONLY, 24, True): Dispatch("FULL", 24, True),  # 8 rows: the limit
    (M.FULL_AND_PIECEWISE, 13, False): Dispatch("PIECEWISE", 16, False),  # verify + prefill
    (M.FULL_DECODE_ONLY, 13, False): Dispatch("NONE", 13, False),
    (M.FULL, 9, True): Dispatch("FULL", 16, False),  # FULL: one graph set, the mixed key
}


def test_spec_dispatch_table():
    got = {key: dispatch(key[0], key[1], key[2], SIZES, MAX_SEQS, 3) for key in SPEC_DISPATCH}
    assert got == SPEC_DISPATCH


def test_spec_capture_plan_decode_graphs():
    plan = capture_plan(M.FULL_DECODE_ONLY, SIZES, MAX_SEQS, 3)
    assert plan == [("FULL", 24, True), ("FULL", 18, True), ("FULL", 9, True), ("FULL", 6, True)]


def test_verify_rows_and_accepted_lengths():
    spec = BatchSpec("m", (1, 5, 1), (40, 20, 70))
    assert verify_rows(spec, TINY, 2) == ((3, 5, 3), (42, 20, 72))
    plans = plan_steps(spec, TINY, CAPTURE_SIZES, 4, seed=0, spec_tokens=2)
    assert plans[0].query_lens == (3, 5, 3)
    # step 1: same query lens, each verify row grew by its accepted length 1..k+1
    assert plans[1].query_lens == plans[0].query_lens
    growth = [b - a for a, b, q in zip(plans[0].seq_lens, plans[1].seq_lens, plans[0].query_lens) if q == 3]
    assert all(1 <= g <= 3 for g in growth) and plans[1].seq_lens[1] == 20
    # step 2: another request count (a verify row added or dropped), still mixed verify + prefill
    assert len(plans[2].query_lens) != 3 and 5 in plans[2].query_lens and 3 in plans[2].query_lens
    assert all(q in (3, 5) for p in plans for q in p.query_lens)


def test_uniform_verify_steps_pad_and_grow():
    plans = plan_steps(DECODE, TINY, CAPTURE_SIZES, 5, seed=1, spec_tokens=3)
    assert all(set(p.query_lens) == {4} for p in plans), "verify batches stay uniform"
    assert plans[2].num_tokens not in CAPTURE_SIZES, "step 2 prefers a padded token count"
    steps = set()
    for a, b in itertools.pairwise(plans[2:]):
        steps |= {y - x for x, y in zip(a.seq_lens, b.seq_lens)}
    assert steps and steps <= {1, 2, 3, 4}
    assert plan_steps(DECODE, TINY, CAPTURE_SIZES, 3, seed=1) == plan_steps(DECODE, TINY, CAPTURE_SIZES, 3, 1, 0)


def test_case_id_gains_k_only_when_positive():
    assert make_case("torch", "FULL", "auto", DECODE).case_id == "tp1-FULL-auto-decode3-torch-s0"
    assert make_case("torch", "FULL", "auto", DECODE, spec_tokens=2).case_id == "tp1-FULL-auto-k2-decode3-torch-s0"
    c = make_case("torch", "FULL", "auto", DECODE, spec_tokens=2)
    assert type(c).from_dict(c.to_dict()) == c


@pytest.fixture(scope="module")
def sessions() -> SessionCache:
    return SessionCache(capacity=16)


# Correct providers under k > 0 on CPU: (backend, requested) -> resolved; every cell must PASS.
PROVIDERS = {
    ("torch", "FULL"): "FULL",
    ("torch", "FULL_DECODE_ONLY"): "FULL_DECODE_ONLY",
    ("torch", "FULL_AND_PIECEWISE"): "FULL_AND_PIECEWISE",
    ("torch", "PIECEWISE"): "PIECEWISE",
    ("aiter-emulated", "FULL"): "FULL_AND_PIECEWISE",  # UNIFORM_BATCH: mixed batches are not uniform
    ("aiter-emulated", "FULL_DECODE_ONLY"): "FULL_DECODE_ONLY",
    ("aiter-emulated", "FULL_AND_PIECEWISE"): "FULL_AND_PIECEWISE",
    # same wrapper code declaring only single-token decode: no FULL decode graph with k > 0
    ("tests.mutants.seed_aiter_fa:FixedBackend", "FULL_DECODE_ONLY"): "PIECEWISE",
}


@pytest.mark.parametrize("key", PROVIDERS, ids=lambda k: f"{k[0].rsplit(':', 1)[-1]}-{k[1]}")
@pytest.mark.parametrize("k", [1, 3])
def test_correct_providers_pass_with_spec_tokens(key, k, sessions):
    backend, mode = key
    for kv in ("auto", "fp8"):
        for batch in (DECODE, MIXED):
            r = run_case(make_case(backend, mode, kv, batch, spec_tokens=k), sessions=sessions)
            assert r.status == Status.PASS, f"{backend} {mode} {kv} {batch.name} k{k}: {r.reason}"
            assert r.resolved_mode == PROVIDERS[key] and r.downgraded == (PROVIDERS[key] != mode)
            if PROVIDERS[key] == "PIECEWISE" and mode != "PIECEWISE":
                assert "spec-decode" in r.log_tail
            if mode == "FULL_DECODE_ONLY" and batch is DECODE and PROVIDERS[key] == mode:
                # the verify batch ran through FULL decode graphs of multiples of q
                assert all(u and u % (1 + k) == 0 for u in r.capture_sizes_used), r.capture_sizes_used


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "PIECEWISE"])
def test_v1_runner_replays_verify_batches_at_rounded_sizes(mode, sessions):
    """The worker settles the sizes with the mode: V1 + a FULL decode mode + k = 2 runs on the
    rounded sizes (every padded size a multiple of 3, the note in the log); PIECEWISE keeps them."""
    model = dataclasses.replace(TINY, capture_style="v1")
    r = run_case(make_case("torch", mode, "auto", DECODE, spec_tokens=2, model=model), sessions=sessions)
    assert r.status == Status.PASS, r.reason
    rounded = set(spec_decode_capture_sizes(CAPTURE_SIZES, 2))
    used = [u for u in r.capture_sizes_used if u]
    assert used, r.capture_sizes_used
    if mode == "PIECEWISE":
        assert set(used) <= set(CAPTURE_SIZES) and "rounded" not in r.log_tail
    else:
        assert set(used) <= rounded and "rounded to multiples of 3" in r.log_tail, (used, r.log_tail[:300])


def test_decode_graph_above_the_largest_capture_size_fits_the_static_buffers(sessions):
    """V2 keys decode graphs by request count: with sizes up to 32, max_num_seqs 16 and q = 3 the
    size 32 gives cdiv(32, 3) = 11 requests = 33 tokens, above every capture size. full.yaml hit it
    on CPU (64 verify rows -> 86 requests = 258 tokens > 256): the session's static buffers were
    sized max(capture_sizes) and the replay raised a size mismatch."""
    model = dataclasses.replace(TINY, max_num_seqs=16)
    assert max(decode_capture_sizes(CAPTURE_SIZES, 16, 3)) == 33 > max(CAPTURE_SIZES)
    batch = BatchSpec("decode10", (1,) * 10, (40,) * 10)  # 10 verify rows = 30 tokens -> 11 requests
    r = run_case(make_case("torch", "FULL_DECODE_ONLY", "auto", batch, spec_tokens=2, model=model), sessions=sessions)
    assert r.status == Status.PASS, r.reason
    assert 33 in r.capture_sizes_used, r.capture_sizes_used


def _pads_after_larger(counts, keys) -> bool:
    """Some step replays a padded decode graph (fewer requests than the graph holds) after a step
    with more requests: padded rows whose per-request buffers a larger batch wrote last."""
    return any(c < max(counts[:i]) and c not in keys and any(r > c for r in keys) for i, c in enumerate(counts) if i)


def test_verify_steps_replay_a_padded_decode_graph_after_a_larger_step():
    """FULL decode graphs are keyed by request count: at k > 0 a uniform verify batch's step 2 drops
    to fewer requests that pad one, where one or two fewer can (decode_7 at k = 2 went to 6, which
    fills the 6-request graph exactly: a stale per-request tail was never replayed). Every family's
    planner, every k > 0 decode batch of full.yaml on both device shapes, and the tiny shape."""
    from backend.harness.modes import decode_graph_requests
    from orchestrator.matrix import load_matrix

    seen = {}
    for devices in ("cpu", "gpu"):
        m = load_matrix("matrices/full.yaml", devices=devices)
        for c in [*m.cases, *(s.case for s in m.skipped)]:
            if c.spec_tokens and c.batch.kind == "decode":
                seen.setdefault((c.model, c.batch, c.capture_sizes, c.steps, c.seed, c.spec_tokens), c.case_id)
    seen[(TINY, DECODE, CAPTURE_SIZES, 3, 0, 2)] = "tiny decode3 k2"
    reached = 0
    for (model, batch, sizes, steps, seed, k), name in seen.items():
        counts = [len(p.query_lens) for p in plan_steps(batch, model, sizes, steps, seed, k)]
        keys = decode_graph_requests(sizes, model.max_num_seqs, 1 + k)
        n = batch.num_reqs
        possible = any(m >= 1 and m not in keys and any(r > m for r in keys) for m in (n - 1, n - 2))
        assert _pads_after_larger(counts, keys) == possible, (name, counts, keys)
        reached += possible
        if batch.name == "decode_7" and k == 2:
            assert counts == [7, 7, 5], (name, counts)
    assert reached >= 4 and {"gqa", "mla", "hybrid_gdn"} <= {key[0].attention for key in seen}
    assert [len(p.query_lens) for p in plan_steps(DECODE, TINY, CAPTURE_SIZES, 3, 0, 2)] == [3, 3, 1]
