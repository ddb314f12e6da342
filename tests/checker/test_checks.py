"""The comparison math and the gang merge, on hand-made tensors."""

from __future__ import annotations

import pytest
import torch

from backend.case import Tolerance
from backend.families import family
from backend.harness.checker import merge_rank_results
from backend.harness.checks import (
    CheckAccumulator,
    compare,
    compare_heads,
    failure_reason,
    kv_integrity,
    quant_steps,
    raw,
    real_slot_values,
)
from backend.result import CaseResult, Status


def _rows(cache: torch.Tensor) -> torch.Tensor:
    """A gqa cache [2, blocks, block_size, Hkv, D] as kv_integrity takes it: [planes, slots, row]."""
    return family("gqa").slot_rows(cache)


TOL = Tolerance(0.1, 0.1)


def _pair(change):
    ref = torch.ones(4, 2 * 8)  # 4 rows, 2 heads of size 8
    out = ref.clone()
    change(out)
    return out, ref


COMPARE_SCENARIOS = {
    # name: (mutation, ok, first_bad, max_abs, mismatch_frac)
    "identical": (lambda t: None, True, None, 0.0, 0.0),
    "within atol+rtol": (lambda t: t.add_(0.19), True, None, 0.19, 0.0),
    "one element out, row 2 head 1": (lambda t: t[2, 9].add_(0.5), False, (2, 1), 0.5, 1 / 64),
    "nan is never close": (lambda t: t[3, 0].fill_(float("nan")), False, (3, 0), float("inf"), 1 / 64),
    "first bad is row-major first": (lambda t: (t[1, 12].add_(1), t[3, 0].add_(1)), False, (1, 1), 1.0, 2 / 64),
}


@pytest.mark.parametrize("name", COMPARE_SCENARIOS)
def test_compare(name):
    change, ok, first_bad, max_abs, frac = COMPARE_SCENARIOS[name]
    out, ref = _pair(change)
    c = compare(out, ref, TOL, head_size=8)
    assert (c.ok, c.first_bad, c.mismatch_frac) == (ok, first_bad, pytest.approx(frac))
    assert c.max_abs == pytest.approx(max_abs)
    assert c.bitwise == (name == "identical")


def _cache(dtype=torch.bfloat16):
    return torch.randn(2, 4, 4, 1, 2, generator=torch.Generator().manual_seed(0)).to(dtype)  # 16 slots


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_kv_integrity_flags_writes_outside_real_slots_only(dtype):
    before = _cache(dtype)
    real = torch.tensor([5, 6])
    scales = (torch.ones(1), torch.ones(1))
    after = before.clone()
    after[0, 1, 1] = torch.full((1, 2), 3.0).to(dtype)  # slot 5: a real slot
    eager = real_slot_values(_rows(after), real)
    assert kv_integrity(_rows(after), _rows(before), eager, real, scales, TOL).ok
    after[1, 3, 3] = torch.full((1, 2), -2.0).to(dtype)  # slot 15: outside (a wrapped -1)
    k = kv_integrity(_rows(after), _rows(before), eager, real, scales, TOL)
    assert not k.ok and k.outside_changed == 1 and k.first_outside == 15
    ok_outside = before.clone()
    ok_outside[0, 1, 1] = torch.full((1, 2), 3.0).to(dtype)
    ok_outside[0, 1, 2] = torch.full((1, 2), 9.0).to(dtype)  # slot 6 differs from eager
    k = kv_integrity(_rows(ok_outside), _rows(before), eager, real, scales, TOL)
    assert not k.ok and k.outside_changed == 0 and not k.real_ok


@pytest.mark.parametrize("outside", [False, True])
def test_kv_integrity_compares_a_strided_cache_with_its_contiguous_snapshot(outside):
    """A backend whose cache view is strided (vllm:FLEX_ATTENTION's at tp 2) against the step's
    contiguous snapshot: the snapshot tiles into int64 words and the cache cannot, yet both are
    compared byte for byte (a shape mismatch ERRORed every such FULL case)."""
    before = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    after = torch.empty(8, 16, 2, dtype=torch.bfloat16).permute(2, 1, 0)  # same shape, strided
    after.copy_(before)
    real = torch.tensor([3, 4])
    after[:, 3] = 1.0  # the real slots' new rows
    if outside:
        after[1, 9, 0] = 7.0  # a write outside them
    eager = real_slot_values(after, real)
    assert not after.is_contiguous() and before.is_contiguous()
    k = kv_integrity(after, before.clone(), eager, real, (torch.ones(1), torch.ones(1)), TOL)
    assert (k.ok, k.outside_changed, k.first_outside) == ((False, 1, 9) if outside else (True, 0, None))


def _outside_by_slot(after, before, real):
    """The check's answer worked out the slow way: per slot, any byte changed, real slots excluded."""
    n = after.shape[1] * after.shape[2]
    changed = (raw(after).reshape(2, n, -1) != raw(before).reshape(2, n, -1)).any(dim=-1).any(dim=0)
    changed[real] = False
    idx = changed.nonzero().flatten().tolist()
    return len(idx), (idx[0] if idx else None)


# (name, writes as (kv, block, offset, value)): kv_integrity's one-equality fast path must give the
# per-slot reduction's answer, whether or not anything outside the real slots changed.
_WRITES = [
    ("real slots only", [(0, 1, 1, 3.0), (1, 1, 2, -1.0)]),
    ("same bytes outside", [(0, 2, 0, None)]),  # rewritten with its own value: no change
    ("V outside", [(0, 1, 1, 3.0), (1, 0, 3, 7.0)]),
    ("K outside, two slots", [(0, 3, 3, -2.0), (0, 2, 1, 5.0)]),
    ("NaN payload outside", [(1, 3, 0, float("nan"))]),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("name,writes", _WRITES, ids=[w[0] for w in _WRITES])
def test_kv_integrity_fast_path_equals_per_slot_reduction(dtype, name, writes):
    before = _cache(dtype)
    real = torch.tensor([5, 6])
    after = before.clone()
    for kv, block, off, value in writes:
        if value is not None:
            after[kv, block, off] = torch.full((1, 2), value).to(dtype)
    eager = real_slot_values(_rows(after), real)
    expected = _outside_by_slot(after, before, real)
    scratch = before.clone()
    k = kv_integrity(_rows(after), _rows(scratch), eager, real, (torch.ones(1), torch.ones(1)), TOL)
    assert (k.outside_changed, k.first_outside) == expected
    assert k.ok == (expected[0] == 0)
    assert (name in ("real slots only", "same bytes outside")) == k.ok  # the table's own claim
    # `before` is scratch: only its real slots may have been overwritten
    n = before.shape[1] * before.shape[2]
    keep = torch.ones(n, dtype=torch.bool)
    keep[real] = False
    assert torch.equal(raw(scratch).reshape(2, n, -1)[:, keep], raw(before).reshape(2, n, -1)[:, keep])


def _step(t: torch.Tensor, n: int) -> torch.Tensor:
    """t moved n representable values up (positive t): its bit pattern + n."""
    return (raw(t).to(torch.int64) + n).to(raw(t).dtype).view(t.dtype)


@pytest.mark.parametrize(
    "dtype,steps,ok",
    [
        # A padded GEMM may round K/V one representable value apart from eager: not a failure...
        (torch.float8_e4m3fn, 1, True),
        (torch.bfloat16, 1, True),
        # ...two or more steps are a different value, even where the first step would fit the tolerance.
        (torch.float8_e4m3fn, 2, False),
        (torch.float8_e4m3fn, 5, False),
        (torch.bfloat16, 8, False),
    ],
)
def test_kv_integrity_real_slots_allow_one_rounding_step_only(dtype, steps, ok):
    real = torch.tensor([5, 6])
    scales = (torch.ones(1), torch.ones(1))
    before = _cache(dtype)
    eager_cache = before.clone()
    eager_cache[0, 1, 1] = torch.full((1, 2), 2.5).to(dtype)  # slot 5, K: e4m3 steps of 0.25 here
    eager = real_slot_values(_rows(eager_cache), real)
    after = eager_cache.clone()
    after[0, 1, 1] = _step(after[0, 1, 1], steps)
    tight = Tolerance(atol=1e-4, rtol=1e-4)  # below one step of either dtype at 2.5
    k = kv_integrity(_rows(after), _rows(before), eager, real, scales, tight)
    assert (k.ok, k.real_ok, k.real_bitwise) == (ok, ok, False)
    assert k.real_max_abs > 0


def test_quant_steps_counts_representable_values_across_zero():
    a = torch.tensor([0.0, -0.0, 2.5, 2.5, -2.5]).to(torch.float8_e4m3fn)
    b = torch.tensor([-0.0, 0.0, 2.75, 2.0, -2.75]).to(torch.float8_e4m3fn)
    assert quant_steps(a, b).tolist() == [0, 0, 1, 2, 1]
    tiny = torch.tensor([2.0**-9, -(2.0**-9)]).to(torch.float8_e4m3fn)  # smallest subnormals
    assert quant_steps(tiny[:1], tiny[1:]).tolist() == [2]


def test_accumulator_keeps_first_failing_step_and_worst_numbers():
    acc = CheckAccumulator("replay")
    out, ref = _pair(lambda t: None)
    acc.add_comparison(0, compare(out, ref, TOL, 8), record_bitwise=True)
    bad, _ = _pair(lambda t: t[1, 3].add_(2.0))
    acc.add_comparison(1, compare(bad, ref, TOL, 8), record_bitwise=True)
    worse, _ = _pair(lambda t: t[0, 0].add_(5.0))
    acc.add_comparison(2, compare(worse, ref, TOL, 8), record_bitwise=True)
    o = acc.outcome()
    assert (o.passed, o.step, o.first_bad, o.bitwise) == (False, 1, (1, 0), False)
    assert o.max_abs_err == pytest.approx(5.0)
    assert "replay check failed at step 1" in failure_reason(o)


def _r(status, reason="", worker=""):
    return CaseResult(case_id="c", status=status, reason=reason, worker=worker, timings={"total_s": 1.0})


MERGE_SCENARIOS = {
    "all pass": ([Status.PASS, Status.PASS], Status.PASS, ""),
    "one rank fails": ([Status.PASS, Status.FAIL], Status.FAIL, "rank 1: bad [ranks [1] fail]"),
    "error beats fail": ([Status.FAIL, Status.ERROR], Status.ERROR, "rank 1: bad [ranks [1] error]"),
    "all fail": ([Status.FAIL, Status.FAIL], Status.FAIL, "rank 0: bad [all ranks fail]"),
    "flaky beats pass": ([Status.FLAKY, Status.PASS], Status.FLAKY, "rank 0: bad [ranks [0] flaky]"),
}


@pytest.mark.parametrize("name", MERGE_SCENARIOS)
def test_merge_rank_results_takes_the_worst_rank(name):
    statuses, status, reason = MERGE_SCENARIOS[name]
    merged = merge_rank_results([_r(s, "" if s == Status.PASS else "bad", f"rank{i}") for i, s in enumerate(statuses)])
    assert merged.status == status and merged.reason == reason
    assert merged.worker == "rank0,rank1"


ROW_SCALED_SCENARIOS = {
    # name: (mutation of a row peaking at 10, ok with row_scaled_atol, ok without)
    "one bf16 rounding step of the row's peak on a small element": (lambda t: t[1, 3].add_(0.06), True, False),
    "heads swapped move values by the row's scale": (lambda t: t[1].copy_(t[1].roll(8)), False, False),
    "error just above the scaled atol": (lambda t: t[1, 3].add_(0.25), False, False),
    "rows peaking below 1 keep the plain atol": (lambda t: t[2, 3].add_(0.06), False, False),
}


@pytest.mark.parametrize("name", ROW_SCALED_SCENARIOS)
def test_compare_row_scaled_atol(name):
    """The atol the reference and replay checks use: tol.atol * max(1, row peak)."""
    change, ok_scaled, ok_plain = ROW_SCALED_SCENARIOS[name]
    tol = Tolerance(0.02, 0.02)
    ref = torch.full((4, 2 * 8), 0.04)
    ref[1, 0] = 10.0  # row 1 peaks at 10: scaled atol 0.2
    ref[2, 8:] = 0.5  # row 2 peaks at 0.5: atol stays 0.02
    out = ref.clone()
    change(out)
    assert compare(out, ref, tol, head_size=8, row_scaled_atol=True).ok == ok_scaled
    assert compare(out, ref, tol, head_size=8).ok == ok_plain


def _heads(layers=2, rows=3, heads=32, d=16):
    gen = torch.Generator().manual_seed(1)
    return (0.5 * torch.randn(layers, rows, heads, d, generator=gen)).to(torch.bfloat16)


HEAD_SCENARIOS = {
    # name: (mutation of [layers, rows, heads, d] attention outputs, ok, first_bad, layer)
    "identical": (lambda t: None, True, None, None),
    "one head of 32 zeroed, layer 1": (lambda t: t[1, 2, 5].zero_(), False, (2, 5 + 4), 1),
    "one head 10% low": (lambda t: t[0, 1, 7].mul_(0.9), False, (1, 7 + 4), 0),
    "one element off by an fp8 step of the head's scale stays inside": (
        lambda t: t[0, 0, 3, 2].add_(0.0625 * t[0, 0, 3].float().pow(2).mean().sqrt()),
        True,
        None,
        None,
    ),
    "nan is never close": (lambda t: t[1, 0, 0, 0].fill_(float("nan")), False, (0, 0 + 4), 1),
    "every head off by one bf16 rounding step stays inside": (lambda t: t.mul_(1 + 2**-8), True, None, None),
    # Scale-free: a long context averages V down to a small RMS; 10% of one head is still out.
    "small outputs (long-context scale), one head 10% low": (
        lambda t: (t.mul_(0.01), t[0, 2, 9].mul_(0.9)),
        False,
        (2, 9 + 4),
        0,
    ),
    "small outputs, one bf16 rounding step everywhere": (lambda t: (t.mul_(0.01), t.mul_(1 + 2**-8)), True, None, None),
}


@pytest.mark.parametrize("name", HEAD_SCENARIOS)
def test_compare_heads(name):
    """Per (row, head) RMS error: a wrong head fails however many heads there are; a one-element
    rounding flip does not. first_bad names the global head (offset 4: a tp rank's first head)."""
    change, ok, first_bad, layer = HEAD_SCENARIOS[name]
    ref = _heads()
    if name.startswith("small outputs"):
        ref.mul_(0.01)  # the expected side at the same scale; the change scales `out` alike
    out = _heads()
    change(out)
    h = compare_heads(out, ref, Tolerance(2e-2, 2e-2), head_offset=4)
    assert (h.comparison.ok, h.comparison.first_bad, h.layer) == (ok, first_bad, layer)
    if not ok:
        assert h.worst_head == first_bad[1]
        # the same error in the residual-style comparison of all 32 heads would be 1 of 32 heads
        assert h.comparison.mismatch_frac == pytest.approx(1 / (2 * 3 * 32))


@pytest.mark.parametrize(
    "offset, ok",
    [
        (0.3, True),  # within atol x the slot row's largest value (0.02 x 40 = 0.8)
        (1.5, False),  # beyond it: a wrong K element, not an inherited difference
    ],
)
def test_kv_integrity_real_slots_scale_atol_by_the_slot_row(offset, ok):
    """Later layers' K/V inherit the graph-vs-eager difference of the layers before them; the
    real-slot check holds them to the replay check's row-scaled tolerance, no sharper."""
    real = torch.tensor([5])
    scales = (torch.ones(1), torch.ones(1))
    before = _cache(torch.float32)
    eager_cache = before.clone()
    eager_cache[0, 1, 1] = 0.5
    eager_cache[0, 1, 1, 0, 0] = 40.0  # slot 5's K row: one large value
    eager = real_slot_values(_rows(eager_cache), real)
    after = eager_cache.clone()
    after[0, 1, 1, 0, 1] += offset  # the small element of the same row
    k = kv_integrity(_rows(after), _rows(before), eager, real, scales, Tolerance(atol=0.02, rtol=0.02))
    assert (k.ok, k.real_ok) == (ok, ok)
    assert k.real_max_abs == pytest.approx(offset, rel=1e-4)
