"""Comparison math for the checks (DESIGN.md §5) and their aggregation over steps.

Outputs are compared on real rows only, as [tokens, heads, head_size] (the model output's hidden
dimension grouped by head_size, so "head" = column // head_size). Closeness is torch.isclose
style: |a - b| <= atol + rtol * |b|, NaN never close. The relative error reported is
|a - b| / max(|b|, atol), so near-zero references do not dominate it.

The reference check (model output vs the fp32 reference) and the replay check (graph vs eager)
scale atol per row by the row's largest expected magnitude (at least 1). The output is a bf16/fp16 residual stream: one rounding step of
an intermediate of magnitude M is M * 2^-8 in bf16, and cancellation can leave it on a small
output element. Seen on the H200 (32 heads x 128, 2 layers, 4096-token context): a 0.0625 error on
an element of 0.04 in a row peaking near 10, identical for every correct provider. A kernel bug
(a dropped or overwritten row, a wrong head) moves values by the row's own scale and is still far
outside. Graph vs eager runs the same kernels, but padded GEMMs (another M) and the capture
stream may round differently by the same one step (H200: 0.047 on one element of 262,144).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from backend.case import Tolerance
from backend.result import CheckOutcome


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    mismatch_frac: float
    first_bad: tuple[int, int] | None
    bitwise: bool
    bad_rows: tuple[int, ...] = ()  # every row with a bad element (read only when there is one)


def compare(
    actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, head_size: int, *, row_scaled_atol: bool = False
) -> Comparison:
    """actual/expected [T, C] (or [T, H, D]) -> Comparison over every element. Computed on
    `expected`'s device; one host sync for all the numbers."""
    device = expected.device
    actual = actual.detach().to(device)
    a = actual.float().reshape(actual.shape[0], -1)
    b = expected.detach().float().reshape(expected.shape[0], -1)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return Comparison(True, 0.0, 0.0, 0.0, None, actual.shape == expected.shape and actual.dtype == expected.dtype)
    diff = (a - b).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    atol = tol.atol * b.abs().amax(dim=1, keepdim=True).clamp_min(1.0) if row_scaled_atol else tol.atol
    close = diff <= atol + tol.rtol * b.abs()
    rel = diff / b.abs().clamp_min(max(tol.atol, 1e-12))
    bad = ~close
    equal = _equal_flag(actual, expected)
    max_abs, max_rel, frac, any_bad, same = torch.stack(
        [diff.max(), rel.max(), bad.float().mean(), bad.any().float(), equal.float()]
    ).tolist()
    bitwise = same == 1.0
    first_bad, bad_rows = None, ()
    if any_bad:
        flat = int(torch.argmax(bad.reshape(-1).to(torch.uint8)))
        row, col = divmod(flat, a.shape[1])
        first_bad = (row, col // head_size)
        bad_rows = tuple(bad.any(dim=1).nonzero().flatten().tolist())
    return Comparison(not any_bad, max_abs, max_rel, frac, first_bad, bitwise, bad_rows)


def rows_by_request(rows: tuple[int, ...], query_lens) -> str:
    """Which requests the bad `rows` (token rows of a step, packed by `query_lens`) belong to:
    "bad rows 14/17 in requests 3 (q 5), 4 (q 9)", or "8 (21 of q 24)" where only some of a
    request's rows are bad. A bug that keeps to one kind of row (prefill, decode, padded) names it.
    "" without rows."""
    if not rows:
        return ""
    per: dict[int | None, int] = {}
    bounds, start = [], 0
    for q in query_lens:
        bounds.append((start, start + q))
        start += q
    for row in rows:
        req = next((i for i, (lo, hi) in enumerate(bounds) if lo <= row < hi), None)
        per[req] = per.get(req, 0) + 1
    parts = [
        f"{i} (q {query_lens[i]})" if n == query_lens[i] else f"{i} ({n} of q {query_lens[i]})"
        for i, n in sorted((i, n) for i, n in per.items() if i is not None)
    ]
    shown = parts[:6] + ([f"... {len(parts) - 6} more"] if len(parts) > 6 else [])
    text = f"bad rows {len(rows)}/{start} in request{'s' if len(parts) > 1 else ''} " + ", ".join(shown)
    return text + (f", {per[None]} past the last request" if None in per else "")


@dataclass(frozen=True)
class HeadComparison:
    """Attention outputs compared head by head, over every layer. `comparison.max_abs` is the
    worst head's RMS error, `max_rel` the worst RMS error relative to the head's RMS (at least
    atol times the row's mean head RMS),
    `mismatch_frac` the fraction of (layer, row, head) outside tolerance, `first_bad` the first
    bad (row, global head) of the first failing layer."""

    comparison: Comparison
    layer: int | None  # the first failing layer
    worst_head: int | None  # the global head with the largest RMS error (any layer, any row)


def compare_heads(
    actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, *, head_offset: int = 0
) -> HeadComparison:
    """Attention outputs [layers, T, H, D], each (row, head) vector judged on its own:

        bad when rms(a - b) > atol * s + rtol * rms(b),   s = mean over the row's heads of rms(b)

    NaN is never close. Scale-free, as the attention output is: a head's output is a weighted mean
    of V rows, whose RMS shrinks with the context it averages over (CPU shape ~0.2-0.5; long GPU
    contexts much less), so a fixed atol would hide a 10% head error there. One head's error is
    not diluted by the others (as it is in the residual stream after the output projection: 1 head
    of 32 at the GPU shape), while a single element off by one fp8 step (a provider attending to a
    prefill's own K/V before quantisation, as AITER's prefill does) stays inside: a wrong head
    (zeroed, scaled, another head's values, a missing key) moves its whole vector.
    `head_offset`: the global index of local head 0 (a tp rank's first head)."""
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch {tuple(actual.shape)} vs {tuple(expected.shape)}")
    _layers, t, h, _d = expected.shape
    if actual.numel() == 0:
        return HeadComparison(Comparison(True, 0.0, 0.0, 0.0, None, True), None, None)
    actual = actual.detach().to(expected.device)
    a = actual.float()
    b = expected.detach().float()
    err = (a - b).pow(2).mean(dim=-1).sqrt()  # [L, T, H]
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    ref = b.pow(2).mean(dim=-1).sqrt()
    floor = tol.atol * ref.mean(dim=-1, keepdim=True).clamp_min(1e-12)  # [L, T, 1]
    bad = ~(err <= floor + tol.rtol * ref)
    rel = err / torch.maximum(ref, floor)
    equal = _equal_flag(actual, expected)
    max_abs, max_rel, frac, any_bad, worst, same = torch.stack(
        [
            err.max(),
            rel.max(),
            bad.float().mean(),
            bad.any().float(),
            err.amax(dim=(0, 1)).argmax().float(),
            equal.float(),
        ]
    ).tolist()
    bitwise = same == 1.0
    first_bad, layer = None, None
    if any_bad:
        flat = int(torch.argmax(bad.reshape(-1).to(torch.uint8)))
        layer, rest = divmod(flat, t * h)
        row, head = divmod(rest, h)
        first_bad = (row, head_offset + head)
    return HeadComparison(
        Comparison(not any_bad, max_abs, max_rel, frac, first_bad, bitwise), layer, head_offset + int(worst)
    )


def all_finite(t: torch.Tensor, head_size: int) -> Comparison:
    flat = t.detach().reshape(t.shape[0], -1)
    if not flat.numel():
        return Comparison(True, 0.0, 0.0, 0.0, None, True)
    bad = ~torch.isfinite(flat.float())
    # One host sync; float64 holds any flat index exactly.
    any_bad, frac, idx = torch.stack(
        [bad.any().double(), bad.double().mean(), torch.argmax(bad.reshape(-1).to(torch.uint8)).double()]
    ).tolist()
    first = None
    if any_bad:
        row, col = divmod(int(idx), flat.shape[1])
        first = (row, col // head_size)
    return Comparison(first is None, 0.0, 0.0, frac, first, True)


def _equal_flag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.equal(a, b) as a 0-d bool tensor on their device (False for another shape or dtype).
    On a GPU it stays there, so several join one host sync (torch.equal computes the same
    eq().all() and reads it back at once); on the CPU torch.equal itself, which needs no temporary."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.zeros((), dtype=torch.bool, device=a.device)
    if a.device.type == "cpu":
        return torch.tensor(torch.equal(a, b))
    return (a == b).all()


def equal_many(pairs) -> list[bool]:
    """torch.equal of each (a, b) pair of one device, with one host sync for all of them."""
    flags = [_equal_flag(a, b) for a, b in pairs]
    return [bool(f) for f in torch.stack(flags).tolist()] if flags else []


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t: torch.Tensor) -> torch.Tensor:
    """Bit view (fp8 -> uint8, bf16 -> int16): byte equality, NaN payloads included."""
    return t.view(_SAME_SIZE_INT[t.element_size()])


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in fp32 (inf where either is NaN; 0 for empty tensors)."""
    if not a.numel():
        return 0.0
    return float(torch.nan_to_num((a.float() - b.float()).abs(), nan=float("inf")).max())


def quant_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of their (same) float dtype lie between a and b, elementwise:
    the distance of their sign-magnitude bit patterns on the number line (+0 and -0 are 0 apart)."""
    bits = a.element_size() * 8

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        r = raw(t).to(torch.int64) & ((1 << bits) - 1)
        sign, mag = r >> (bits - 1), r & ((1 << (bits - 1)) - 1)
        return torch.where(sign.bool(), -mag, mag)

    return (ordinal(a) - ordinal(b)).abs()


def _words(rows: torch.Tensor) -> torch.Tensor:
    """[..., n] integer rows as the widest integer words that tile them (same bytes, 4-8x fewer
    elements to compare: the KV check compares the whole cache every step)."""
    row_bytes = rows.shape[-1] * rows.element_size()
    for dtype, size in ((torch.int64, 8), (torch.int32, 4)):
        if row_bytes % size == 0 and rows.is_contiguous() and rows.element_size() < size:
            try:
                return rows.view(dtype)
            except RuntimeError:  # a storage offset that the wider words do not align with
                continue
    return rows


@dataclass(frozen=True)
class KVComparison:
    ok: bool
    outside_changed: int  # slots outside the step's real slots whose bytes changed
    first_outside: int | None  # first such slot
    real_ok: bool
    real_bitwise: bool
    real_max_abs: float


def real_slot_values(rows: torch.Tensor, real_slots: torch.Tensor) -> torch.Tensor:
    """One layer's cache as [planes, num_slots, row] (AttentionFamily.slot_rows) at `real_slots`:
    [planes, n, row], a copy."""
    return rows[:, real_slots].clone()


def kv_integrity(
    after: torch.Tensor,
    before: torch.Tensor,
    eager_real: torch.Tensor,
    real_slots: torch.Tensor,
    scales: tuple[torch.Tensor, ...],
    tol: Tolerance,
    decode: Callable[[int, torch.Tensor], torch.Tensor | None] | None = None,
) -> KVComparison:
    """One layer's cache as [planes, num_slots, row] (AttentionFamily.slot_rows: GQA K and V, MLA
    the latent row), `scales` the scale tensor of each plane: bytes outside real_slots unchanged
    from `before`; the real slots equal the eager run's `eager_real` (real_slot_values of the
    cache eager left; bitwise, else within tol after dequantising, atol scaled per slot row as the
    replay check scales it: padded graph sizes may round K/V differently by an ulp, and later
    layers' K/V inherit the earlier layers' graph-vs-eager difference).

    `before` is scratch (the step's snapshot, discarded after this): its real slots are
    overwritten with `after`'s, so that one whole-cache equality answers "nothing changed outside
    the real slots" (one pass, one host sync); only a cache that did change is reduced per slot to
    count and locate the writes (the per-slot reduction of every step was the check's cost).

    `decode(plane, rows)`: a byte-format cache's rows as the values a reader gets (the family's
    AttentionFamily.decode_rows; None for a plain dtype): its real slots off eager are compared
    as those values, within tolerance or one fp8 e4m3 step of the value (1/8 of it: the coarsest
    thing such a row holds). Compared as bytes, an amax an ulp off would move its tile's scale
    bytes, and every value of the tile a step at most."""
    from backend.attention.kv_cache import dequantize

    a = _words(raw(after))
    b = _words(raw(before))
    if a.shape != b.shape:  # one tiles into wider words and the other cannot (a strided cache view
        a, b = raw(after), raw(before)  # against its contiguous snapshot): compare both as they are
    b[:, real_slots] = a[:, real_slots]  # a copy of `before` when slot_rows copied: the same verdict
    n_out, first = 0, None
    fa = after[:, real_slots]
    unchanged, real_bitwise = equal_many([(a, b), (raw(fa), raw(eager_real))])
    if not unchanged:
        outside = (a != b).any(dim=-1).any(dim=0)  # [num_slots]; the real slots are equal now
        n_out = int(outside.sum())
        first = int(torch.argmax(outside.to(torch.uint8))) if n_out else None
    real_ok, worst = real_bitwise, 0.0
    decoded = _decoded_close(fa, eager_real, decode, tol) if not real_bitwise and decode is not None else None
    if decoded is not None:
        real_ok, worst = decoded
    elif not real_bitwise:
        da = torch.stack([dequantize(fa[p], scales[p]) for p in range(fa.shape[0])])
        de = torch.stack([dequantize(eager_real[p], scales[p]) for p in range(fa.shape[0])])
        diff = (da - de).abs()
        worst = max_abs_diff(da, de)
        # Within tolerance, or one rounding step of the cache dtype apart: a padded GEMM (another
        # M) may round a K/V element an ulp differently before it is stored, and one fp8 e4m3 step
        # is up to 1/8 of the value, above any tolerance that is sharp for attention outputs.
        # atol scaled by the slot's largest value, as the replay check scales it per row: in the
        # layers after the first, K/V are projections of hidden states that already carry the
        # graph-vs-eager difference the replay check tolerates (swa_sinks on an H100: layer 3 of
        # a FULL decode 0.031 apart from eager in bf16, its outputs within the replay tolerance).
        row_max = de.abs().amax(dim=-1, keepdim=True).clamp_min(1.0)
        close = diff <= tol.atol * row_max + tol.rtol * de.abs()
        real_ok = bool((close | (quant_steps(fa, eager_real) <= 1)).all())
    return KVComparison(n_out == 0 and real_ok, n_out, first, real_ok, real_bitwise, worst)


FP8_STEP = 2.0**-3  # e4m3's step, relative to the value (3 mantissa bits)


def _decoded_close(
    fa: torch.Tensor,
    eager_real: torch.Tensor,
    decode: Callable[[int, torch.Tensor], torch.Tensor | None],
    tol: Tolerance,
) -> tuple[bool, float] | None:
    """kv_integrity's real slots of a byte-format cache, plane by plane (planes may decode to
    different widths): (every value close, the largest difference); None for a plain dtype's."""
    ok, worst = True, 0.0
    for p in range(fa.shape[0]):
        da, de = decode(p, fa[p]), decode(p, eager_real[p])
        if da is None or de is None:
            return None
        diff = (da - de).abs()
        worst = max(worst, max_abs_diff(da, de))
        row_max = de.abs().amax(dim=-1, keepdim=True).clamp_min(1.0)
        ok = ok and bool((diff <= tol.atol * row_max + (tol.rtol + FP8_STEP) * de.abs()).all())
    return ok, worst


class CheckAccumulator:
    """Worst-over-steps aggregation of one check into a CheckOutcome."""

    def __init__(self, name: str):
        self.name = name
        self.failed_step: int | None = None
        self.max_abs: float | None = None
        self.max_rel: float | None = None
        self.mismatch: float | None = None
        self.first_bad: tuple[int, int] | None = None
        self.bitwise: bool | None = None
        self.details: list[str] = []

    def add(
        self,
        step: int,
        ok: bool,
        *,
        max_abs: float | None = None,
        max_rel: float | None = None,
        mismatch: float | None = None,
        first_bad: tuple[int, int] | None = None,
        bitwise: bool | None = None,
        detail: str = "",
    ) -> None:
        if max_abs is not None:
            self.max_abs = max(self.max_abs or 0.0, max_abs)
        if max_rel is not None:
            self.max_rel = max(self.max_rel or 0.0, max_rel)
        if mismatch is not None:
            self.mismatch = max(self.mismatch or 0.0, mismatch)
        if bitwise is not None:
            self.bitwise = bitwise if self.bitwise is None else (self.bitwise and bitwise)
        if not ok and self.failed_step is None:
            self.failed_step = step
            self.first_bad = first_bad
            if detail:
                self.details.append(f"step {step}: {detail}")

    def add_comparison(self, step: int, c: Comparison, *, record_bitwise: bool = False, detail: str = "") -> None:
        self.add(
            step,
            c.ok,
            max_abs=c.max_abs,
            max_rel=c.max_rel,
            mismatch=c.mismatch_frac,
            first_bad=c.first_bad,
            bitwise=c.bitwise if record_bitwise else None,
            detail=detail,
        )

    def outcome(self) -> CheckOutcome:
        return CheckOutcome(
            name=self.name,
            passed=self.failed_step is None,
            step=self.failed_step,
            max_abs_err=self.max_abs,
            max_rel_err=self.max_rel,
            mismatch_frac=self.mismatch,
            first_bad=self.first_bad,
            bitwise=self.bitwise,
            detail="; ".join(self.details),
        )


def failure_reason(outcome: CheckOutcome) -> str:
    """One line naming the check, its step, the first bad (row, head) and the numbers."""
    parts = [f"{outcome.name} check failed at step {outcome.step}"]
    if outcome.first_bad is not None:
        parts.append(f"first bad row {outcome.first_bad[0]} head {outcome.first_bad[1]}")
    if outcome.max_abs_err is not None:
        parts.append(f"max_abs {outcome.max_abs_err:.3g}")
    if outcome.max_rel_err is not None:
        parts.append(f"max_rel {outcome.max_rel_err:.3g}")
    if outcome.mismatch_frac is not None:
        parts.append(f"mismatched {outcome.mismatch_frac:.1%}")
    if outcome.detail:
        parts.append(outcome.detail)
    return ", ".join(parts)
