"""Cudagraph-mode semantics against vLLM v1: resolution, padding, dispatch, capture plan."""

from __future__ import annotations

import pytest

from backend.attention.interface import AttentionCGSupport as S
from backend.case import default_capture_sizes
from backend.harness.modes import (
    CaptureItem,
    Dispatch,
    UnsupportedModeError,
    capture_plan,
    decode_capture_sizes,
    dispatch,
    is_uniform_decode,
    pad_to_capture_size,
    resolve_mode,
)
from backend.harness.modes import CUDAGraphMode as M

ERR = "error"

# (requested, support) -> resolved mode or ERR, with piecewise available (our test model).
RESOLUTION = {
    (M.NONE, S.NEVER): M.NONE,
    (M.NONE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.NONE,
    (M.NONE, S.UNIFORM_BATCH): M.NONE,
    (M.NONE, S.ALWAYS): M.NONE,
    (M.PIECEWISE, S.NEVER): M.PIECEWISE,
    (M.PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.PIECEWISE,
    (M.PIECEWISE, S.UNIFORM_BATCH): M.PIECEWISE,
    (M.PIECEWISE, S.ALWAYS): M.PIECEWISE,
    (M.FULL, S.NEVER): ERR,
    (M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE): M.FULL_AND_PIECEWISE,
    (M.FULL, S.UNIFORM_BATCH): M.FULL_AND_PIECEWISE,  # mixed batches are not uniform
    (M.FULL, S.ALWAYS): M.FULL,
    (M.FULL_DECODE_ONLY, S.NEVER): M.PIECEWISE,
    (M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE): M.FULL_DECODE_ONLY,
    (M.FULL_DECODE_ONLY, S.UNIFORM_BATCH): M.FULL_DECODE_ONLY,
    (M.FULL_DECODE_ONLY, S.ALWAYS): M.FULL_DECODE_ONLY,
    (M.FULL_AND_PIECEWISE, S.NEVER): M.PIECEWISE,
    (M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.FULL_AND_PIECEWISE,
    (M.FULL_AND_PIECEWISE, S.UNIFORM_BATCH): M.FULL_AND_PIECEWISE,
    (M.FULL_AND_PIECEWISE, S.ALWAYS): M.FULL_AND_PIECEWISE,
}

# Same, when attention cannot be split out of the graph (no piecewise graphs).
RESOLUTION_NO_PIECEWISE = {
    (M.PIECEWISE, S.ALWAYS): M.NONE,
    (M.FULL, S.UNIFORM_BATCH): M.FULL_DECODE_ONLY,
    (M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE): M.FULL_DECODE_ONLY,
    (M.FULL, S.NEVER): ERR,
    (M.FULL_DECODE_ONLY, S.NEVER): M.NONE,
    (M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE): M.FULL_DECODE_ONLY,
    (M.FULL_AND_PIECEWISE, S.NEVER): M.NONE,
    (M.FULL, S.ALWAYS): M.FULL,
}


def test_every_mode_support_pair_is_in_the_table():
    assert set(RESOLUTION) == {(m, s) for m in M for s in S}


def test_mode_pairs_match_vllm():
    pairs = {m: (m.decode_mode(), m.mixed_mode()) for m in M}
    assert pairs == {
        M.NONE: (M.NONE, M.NONE),
        M.PIECEWISE: (M.PIECEWISE, M.PIECEWISE),
        M.FULL: (M.FULL, M.FULL),
        M.FULL_DECODE_ONLY: (M.FULL, M.NONE),
        M.FULL_AND_PIECEWISE: (M.FULL, M.PIECEWISE),
    }
    assert [m for m in M if m.separate_routine()] == [M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE]
    assert [m for m in M if m.has_full()] == [M.FULL, M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE]
    assert [m for m in M if m.has_piecewise()] == [M.PIECEWISE, M.FULL_AND_PIECEWISE]


@pytest.mark.parametrize(
    "table,piecewise", [(RESOLUTION, True), (RESOLUTION_NO_PIECEWISE, False)], ids=["piecewise", "no-piecewise"]
)
def test_resolution_table(table, piecewise):
    for (mode, support), expected in table.items():
        if expected == ERR:
            with pytest.raises(UnsupportedModeError) as info:
                resolve_mode(mode, support, piecewise_available=piecewise)
            assert "\n" not in str(info.value) and "NEVER" in str(info.value)
            continue
        r = resolve_mode(mode.name.lower(), support, piecewise_available=piecewise)
        assert (r.requested, r.resolved) == (mode, expected), (mode, support)
        assert r.downgraded == (expected != mode)
        # A downgrade is shown: the message names both the request and the mode set.
        assert (f"setting cudagraph_mode={expected.name}" in r.message) == r.downgraded
        assert bool(r.message) == r.downgraded


def test_unknown_mode_is_one_line_error():
    with pytest.raises(UnsupportedModeError, match="unknown cudagraph mode 'FULLISH'"):
        resolve_mode("FULLISH", S.ALWAYS)


def test_padding_to_capture_sizes():
    sizes = default_capture_sizes(512)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-1] == 512
    cases = {1: 1, 3: 4, 4: 4, 5: 8, 9: 16, 248: 248, 249: 256, 257: 272, 512: 512, 513: None}
    assert {n: pad_to_capture_size(n, sizes) for n in cases} == cases
    assert pad_to_capture_size(3, [8, 2, 4]) == 4  # order of the given sizes does not matter


def test_decode_graphs_keyed_by_requests_first_size_above_the_limit_lands_on_it():
    # vLLM (V1 _dummy_run, V2 CudaGraphManager.capture_graph): num_reqs = min(cdiv(s, q), max_num_seqs)
    assert decode_capture_sizes([1, 2, 4, 8, 16, 24], max_num_seqs=16) == [1, 2, 4, 8, 16]
    # 16 and 24 both give 12 requests: captured at the limit (ours once dropped them)
    assert decode_capture_sizes([1, 2, 4, 8, 16, 24], max_num_seqs=12) == [1, 2, 4, 8, 12]
    assert is_uniform_decode([1, 1, 1]) and not is_uniform_decode([1, 3]) and not is_uniform_decode([])


SIZES = (1, 2, 4, 8, 16, 24, 32)
MAX_SEQS = 12

# (mode, num_tokens, uniform_decode) -> Dispatch, with SIZES and max_num_seqs = 12.
DISPATCH = {
    # decode batches at / between capture sizes
    (M.FULL_AND_PIECEWISE, 4, True): Dispatch("FULL", 4, True),
    (M.FULL_AND_PIECEWISE, 3, True): Dispatch("FULL", 4, True),
    (M.FULL_DECODE_ONLY, 7, True): Dispatch("FULL", 8, True),
    # decode batch padding above max_num_seqs: the decode graph captured at the limit (12 requests)
    (M.FULL_AND_PIECEWISE, 10, True): Dispatch("FULL", 12, True),
    (M.FULL_DECODE_ONLY, 10, True): Dispatch("FULL", 12, True),
    (M.FULL_AND_PIECEWISE, 12, True): Dispatch("FULL", 12, True),
    # mixed batches
    (M.FULL_AND_PIECEWISE, 5, False): Dispatch("PIECEWISE", 8, False),
    (M.FULL_DECODE_ONLY, 5, False): Dispatch("NONE", 5, False),
    (M.FULL, 5, False): Dispatch("FULL", 8, False),
    (M.FULL, 3, True): Dispatch("FULL", 4, False),  # FULL mode: one graph set, no decode key
    (M.PIECEWISE, 3, True): Dispatch("PIECEWISE", 4, False),
    (M.PIECEWISE, 17, False): Dispatch("PIECEWISE", 24, False),
    (M.NONE, 3, True): Dispatch("NONE", 3, False),
    # above the largest capture size: eager, unpadded
    (M.FULL, 33, False): Dispatch("NONE", 33, False),
    (M.FULL_AND_PIECEWISE, 40, False): Dispatch("NONE", 40, False),
    (M.PIECEWISE, 32, False): Dispatch("PIECEWISE", 32, False),
}


def test_dispatch_table():
    got = {key: dispatch(key[0], key[1], key[2], SIZES, MAX_SEQS) for key in DISPATCH}
    assert got == DISPATCH


def test_dispatch_lands_on_a_captured_graph():
    # Whatever dispatch picks must be in the capture plan (else replay would find no graph).
    for mode in M:
        plan = set(capture_plan(mode, SIZES, MAX_SEQS))
        for n in range(1, 40):
            for uniform in (True, False):
                d = dispatch(mode, n, uniform, SIZES, MAX_SEQS)
                if d.runtime_mode == "NONE":
                    assert d.padded_tokens == n
                else:
                    assert CaptureItem(d.runtime_mode, d.padded_tokens, d.uniform_decode) in plan


def test_capture_plan_largest_first():
    assert capture_plan(M.NONE, SIZES, MAX_SEQS) == []
    assert capture_plan(M.PIECEWISE, [4, 1, 2], MAX_SEQS) == [
        ("PIECEWISE", 4, False),
        ("PIECEWISE", 2, False),
        ("PIECEWISE", 1, False),
    ]
    assert capture_plan(M.FULL, [1, 2, 4], MAX_SEQS) == [("FULL", 4, False), ("FULL", 2, False), ("FULL", 1, False)]
    assert capture_plan(M.FULL_DECODE_ONLY, SIZES, MAX_SEQS) == [
        ("FULL", 12, True),
        ("FULL", 8, True),
        ("FULL", 4, True),
        ("FULL", 2, True),
        ("FULL", 1, True),
    ]
    fap = capture_plan(M.FULL_AND_PIECEWISE, SIZES, MAX_SEQS)
    assert [i.size for i in fap if i.runtime_mode == "PIECEWISE"] == sorted(SIZES, reverse=True)
    assert [i.size for i in fap if i.runtime_mode == "FULL"] == [12, 8, 4, 2, 1]
    assert all(i.uniform_decode == (i.runtime_mode == "FULL") for i in fap)
