"""Speculative decoding under graphs (DESIGN.md §4b, issue #12): vLLM's rules for k > 0, as
scenario tables. Sources: V2 vllm/v1/worker/gpu/cudagraph_utils.py (uniform_decode_query_len =
1 + num_speculative_tokens; get_cudagraph_sizes keeps decode sizes <= max_num_reqs * q and >= q;
get_cudagraph_runtime_mode: uniform when max_query_len == q and num_tokens == q * num_reqs), V1
gpu_model_runner._dummy_run (cdiv(num_tokens, q) requests of q), vllm/config/compilation.py (the
spec-decode downgrade and its warning)."""

from __future__ import annotations

import dataclasses

import pytest

from backend.attention.interface import AttentionCGSupport as S
from backend.case import BatchSpec
from backend.checker import SessionCache, run_case
from backend.modes import (CUDAGraphMode as M, Dispatch, capture_plan, decode_capture_sizes, dispatch,
                           is_uniform_decode, resolve_mode, uniform_decode_query_len)
from backend.result import Status
from backend.steps import plan_steps, verify_rows
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
        assert ("is not supported with spec-decode for attention backend X (support: "
                "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=PIECEWISE") in r.message


def test_spec_decode_without_piecewise_falls_to_none():
    r = resolve_mode(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, piecewise_available=False, spec_tokens=1)
    assert r.resolved == M.NONE and "setting cudagraph_mode=NONE" in r.message
    # k = 0 keeps the decode graph: the rule is about q > 1 only
    assert resolve_mode(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, spec_tokens=0).resolved == M.FULL_DECODE_ONLY


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
    for a, b in zip(plans[2:], plans[3:]):
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
