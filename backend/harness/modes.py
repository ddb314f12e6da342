"""Cudagraph modes with vLLM v1 semantics (DESIGN.md §4, §4a, §4b): resolution against the
backend's support level, capture sizes and padding, the per-batch dispatch, and what must be
captured, for decode query len q = 1 + k (k speculative tokens; q = 1 without spec decode).

Facts carried over from vLLM (vllm/config/compilation.py CUDAGraphMode and the resolution in
GPUModelRunner.initialize_cudagraph_capture / CompilationConfig; vllm/config/vllm.py
_set_cudagraph_sizes; vllm/v1/cudagraph_dispatcher.py; V2: vllm/v1/worker/gpu/cudagraph_utils.py
CudaGraphManager, get_cudagraph_sizes, get_cudagraph_runtime_mode):
- Composite modes are (decode, mixed) pairs; only NONE, PIECEWISE, FULL are runtime modes.
- Mixed FULL needs ALWAYS. UNIFORM_BATCH is not enough (a mixed batch is not uniform), so FULL
  with UNIFORM_BATCH is downgraded exactly like UNIFORM_SINGLE_TOKEN_DECODE.
- uniform_decode_query_len = 1 + k; a batch is uniform decode when every request has exactly that
  query len (V2 get_cudagraph_runtime_mode: max_query_len == q and num_tokens == q * num_reqs).
  With k > 0 a backend at UNIFORM_SINGLE_TOKEN_DECODE cannot take a FULL decode graph.
- Default capture sizes (vllm/config/vllm.py VllmConfig._set_cudagraph_sizes): [1, 2, 4] +
  range(8, 256, 8) + range(256, max + 1, 16) with max = min(2 * max_num_seqs * q, 512) (q counts
  the speculative tokens already here) capped at max_num_batched_tokens; max_num_batched_tokens is
  appended when it fits under that cap (read from the 0.33/0.34 wheels, DESIGN.md §4a).
- Spec decode and the sizes (vllm/config/compilation.py
  CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, called from the mode resolution
  resolve_cudagraph_mode_and_sizes, formerly GPUModelRunner._check_and_update_cudagraph_mode):
  only after resolution, only when the resolved decode mode is FULL and q > 1, and only in the V1
  model runner (V2 keys its decode graphs by request count and leaves the sizes alone): every size
  rounds up to a multiple of q, a rounded size above the largest configured size is dropped, [q]
  when nothing is left but q fits, an error when not even q fits.
- Split modes add FULL decode graphs keyed by request count: each capture size s >= q gives
  min(cdiv(s, q), max_num_seqs) requests (V1/V2 _dummy_run / capture_graph: num_reqs =
  min(cdiv(num_tokens, q), max_num_reqs)), so the first size above max_num_seqs * q is captured at
  that limit instead of being dropped; its token size is requests * q (a multiple of q).
- Dispatch pads to the smallest capture size >= N; above the largest, or when nothing matches,
  it runs eager at the unpadded size.
Not settled: the vLLM source read then (vllm/config/vllm.py _set_cudagraph_sizes,
vllm/v1/cudagraph_dispatcher.py initialize_cudagraph_keys) neither appends max_num_batched_tokens
nor keeps a decode key above q * max_num_seqs; both come from the 0.33/0.34 wheels and stay.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, cast

from backend.attention.support import AttentionCGSupport

RuntimeMode = Literal["NONE", "PIECEWISE", "FULL"]


class UnsupportedModeError(ValueError):
    """The requested cudagraph mode cannot run with this backend (one line, names both)."""


class CUDAGraphMode(enum.Enum):
    """Requested/resolved cudagraph mode. Tuple values are (decode mode, mixed mode)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True for the composite modes: decode and mixed batches use different graphs."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        """Runtime mode for uniform-decode batches."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """Runtime mode for every other batch (prefill, mixed, or decode above the decode sizes)."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        if mode.separate_routine():
            raise ValueError(f"has_mode takes a runtime mode, got {mode.name}")
        return mode.value in self.value if self.separate_routine() else self == mode

    def has_full(self) -> bool:
        return self.has_mode(CUDAGraphMode.FULL)

    def has_piecewise(self) -> bool:
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def is_runtime_mode(self) -> bool:
        return not self.separate_routine()

    @classmethod
    def parse(cls, value: str | CUDAGraphMode) -> CUDAGraphMode:
        if isinstance(value, cls):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            names = ", ".join(m.name for m in cls)
            raise UnsupportedModeError(f"unknown cudagraph mode {value!r} (one of {names})") from None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ModeResolution:
    requested: CUDAGraphMode
    resolved: CUDAGraphMode
    downgraded: bool
    message: str  # the warning for a downgrade; "" when the request stands

    def to_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested.name,
            "resolved": self.resolved.name,
            "downgraded": self.downgraded,
            "message": self.message,
        }


def resolve_mode(
    requested: str | CUDAGraphMode,
    support: AttentionCGSupport,
    *,
    piecewise_available: bool = True,
    backend_name: str = "attention",
    spec_tokens: int = 0,
) -> ModeResolution:
    """Resolve `requested` against `support` (the minimum over layers), as vLLM does at startup.

    piecewise_available: attention can be split out of the graph (vLLM: attention in
    splitting_ops under VLLM_COMPILE). Our test model always can; False models a model that can't,
    where PIECEWISE falls to NONE and FULL_AND_PIECEWISE to FULL_DECODE_ONLY.
    """
    req = CUDAGraphMode.parse(requested)
    support = AttentionCGSupport(support)
    mode = req
    notes: list[str] = []

    def unsupported(m: CUDAGraphMode) -> str:
        return f"CUDAGraphMode.{m.name} is not supported with {backend_name} backend (support: {support.name})"

    if not piecewise_available and mode.has_piecewise():
        target = CUDAGraphMode.FULL_DECODE_ONLY if mode.has_full() else CUDAGraphMode.NONE
        notes.append(
            f"CUDAGraphMode.{mode.name} needs attention split out of the graph, which is "
            f"unavailable; setting cudagraph_mode={target.name}"
        )
        mode = target

    # 1. Full graphs for mixed batches need ALWAYS; UNIFORM_BATCH does not cover mixed batches.
    if mode.mixed_mode() == CUDAGraphMode.FULL and support != AttentionCGSupport.ALWAYS:
        if support == AttentionCGSupport.NEVER:
            raise UnsupportedModeError(unsupported(mode) + "; please try cudagraph_mode=PIECEWISE")
        target = CUDAGraphMode.FULL_AND_PIECEWISE if piecewise_available else CUDAGraphMode.FULL_DECODE_ONLY
        notes.append(unsupported(mode) + f"; setting cudagraph_mode={target.name}")
        mode = target

    # 2. Full decode graphs need at least UNIFORM_SINGLE_TOKEN_DECODE.
    if mode.decode_mode() == CUDAGraphMode.FULL and support == AttentionCGSupport.NEVER:
        target = CUDAGraphMode.PIECEWISE if piecewise_available else CUDAGraphMode.NONE
        why = "attention is split out of the graph" if piecewise_available else "attention cannot be split out"
        notes.append(unsupported(mode) + f"; setting cudagraph_mode={target.name} because {why}")
        mode = target

    # 2b. Spec decode: a FULL decode graph replays verify batches of q = 1 + k > 1 tokens per
    # request, which support below UNIFORM_BATCH does not cover. vLLM: CompilationConfig.
    # resolve_cudagraph_mode_and_sizes (vllm/config/compilation.py; before it GPUModelRunner.
    # _check_and_update_cudagraph_mode) checks decode_mode() == FULL, uniform_decode_query_len > 1
    # and min_cg_support < UNIFORM_BATCH, and drops to PIECEWISE when attention is a splitting op,
    # else NONE, with the warning below (its wording). Only NEVER or UNIFORM_SINGLE_TOKEN_DECODE
    # can get here, and NEVER has no FULL decode mode left after rule 2.
    if spec_tokens > 0 and mode.decode_mode() == CUDAGraphMode.FULL and support < AttentionCGSupport.UNIFORM_BATCH:
        target = CUDAGraphMode.PIECEWISE if piecewise_available else CUDAGraphMode.NONE
        notes.append(
            f"CUDAGraphMode.{mode.name} is not supported with spec-decode for attention backend "
            f"{backend_name} (support: AttentionCGSupport.{support.name}); "
            f"setting cudagraph_mode={target.name}"
        )
        mode = target

    # 3. Nothing above can leave FULL with NEVER; kept as vLLM's final guard.
    if mode.has_full() and support == AttentionCGSupport.NEVER:
        raise UnsupportedModeError(unsupported(mode) + "; please try cudagraph_mode=PIECEWISE")

    return ModeResolution(req, mode, mode != req, "; ".join(notes))


def pad_to_capture_size(num_tokens: int, sizes: Sequence[int]) -> int | None:
    """Smallest capture size >= num_tokens; None above the largest (run eager, unpadded)."""
    ordered = sorted(set(sizes))
    i = bisect.bisect_left(ordered, num_tokens)
    return ordered[i] if i < len(ordered) else None


def uniform_decode_query_len(spec_tokens: int = 0) -> int:
    """Query len of every request in a uniform-decode (verify) batch: 1 + k."""
    if spec_tokens < 0:
        raise ValueError(f"spec_tokens must be >= 0, got {spec_tokens}")
    return 1 + spec_tokens


def vllm_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, spec_tokens: int = 0, limit: int = 512
) -> tuple[int, ...]:
    """vLLM's default capture sizes as configured, before the backend is known (vllm/config/vllm.py
    VllmConfig._set_cudagraph_sizes): the default grid up to min(2 * max_num_seqs * q, limit)
    capped at max_num_batched_tokens, max_num_batched_tokens appended when it fits under that cap.
    q = 1 + k widens the grid only; the rounding to multiples of q happens at resolution
    (`resolve_capture_sizes`). `limit` is 512 (1024 on SM100)."""
    q = uniform_decode_query_len(spec_tokens)
    top = min(2 * max_num_seqs * q, limit, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)) if s <= top}
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


def spec_decode_capture_sizes(capture_sizes: Sequence[int], spec_tokens: int) -> tuple[int, ...]:
    """vllm/config/compilation.py CompilationConfig.adjust_cudagraph_sizes_for_spec_decode
    (sequence parallelism left out: our model has none): each size rounded up to a multiple of
    q = 1 + k, rounded sizes above the largest configured size dropped; [q] when that leaves
    nothing but q fits; UnsupportedModeError when not even q fits. q = 1 changes nothing."""
    q = uniform_decode_query_len(spec_tokens)
    sizes = sorted(set(capture_sizes))
    if not sizes or q <= 1:
        return tuple(sizes)
    top = sizes[-1]
    rounded = sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= top})
    if not rounded and q <= top:
        rounded = [q]
    if not rounded:
        raise UnsupportedModeError(
            f"no valid cudagraph sizes after rounding to multiples of {q} (num_speculative_tokens + 1): "
            f"lower spec_tokens ({spec_tokens}) or raise the capture sizes (largest {top})"
        )
    return tuple(rounded)


@dataclass(frozen=True)
class CaptureSizes:
    sizes: tuple[int, ...]  # what the runner captures and pads to
    note: str  # "" when the configured sizes stand; else what changed and why (shown with the mode)


def resolve_capture_sizes(
    configured: Sequence[int], resolved: str | CUDAGraphMode, spec_tokens: int = 0, capture_style: str = "v2"
) -> CaptureSizes:
    """The capture sizes a resolved mode runs with (vLLM's resolve_cudagraph_mode_and_sizes, after
    the downgrades): the V1 model runner ("v1") rounds them to multiples of q = 1 + k when the
    resolved decode mode is FULL and k > 0 (its dispatcher keys decode graphs by token count and
    asserts num_tokens % q == 0); the V2 runner ("v2") keeps them and keys decode graphs by request
    count instead (decode_graph_requests). A PIECEWISE/NONE result (a downgrade included) never
    rounds."""
    mode = CUDAGraphMode.parse(resolved)
    sizes = tuple(sorted(set(configured)))
    if capture_style != "v1" or spec_tokens <= 0 or mode.decode_mode() != CUDAGraphMode.FULL:
        return CaptureSizes(sizes, "")
    rounded = spec_decode_capture_sizes(sizes, spec_tokens)
    if rounded == sizes:
        return CaptureSizes(sizes, "")
    q = uniform_decode_query_len(spec_tokens)
    return CaptureSizes(
        rounded, f"capture sizes rounded to multiples of {q} (num_speculative_tokens + 1, V1 runner): {list(rounded)}"
    )


def decode_graph_requests(capture_sizes: Sequence[int], max_num_seqs: int, query_len: int = 1) -> list[int]:
    """Request counts that get a FULL uniform-decode graph in split modes: min(cdiv(s, q),
    max_num_seqs) per capture size s >= q (the first size above the limit lands on the limit)."""
    return sorted({min(-(-s // query_len), max_num_seqs) for s in capture_sizes if s >= query_len})


def decode_capture_sizes(capture_sizes: Sequence[int], max_num_seqs: int, query_len: int = 1) -> list[int]:
    """Token sizes of the FULL uniform-decode graphs: requests * q, multiples of q, at most
    max_num_seqs * q."""
    return [r * query_len for r in decode_graph_requests(capture_sizes, max_num_seqs, query_len)]


def is_uniform_decode(query_lens: Sequence[int], query_len: int = 1) -> bool:
    """Every request has exactly the uniform-decode query len (1, or 1 + k under spec decode)."""
    return len(query_lens) > 0 and all(q == query_len for q in query_lens)


@dataclass(frozen=True)
class Dispatch:
    runtime_mode: RuntimeMode
    padded_tokens: int  # tokens the step runs with: a capture size, or num_tokens when eager
    uniform_decode: bool = False  # key of the graph used: True only for a split-mode decode graph


def _keys(
    mode: CUDAGraphMode, capture_sizes: Sequence[int], max_num_seqs: int, query_len: int = 1
) -> dict[str, set[tuple[int, bool]]]:
    keys: dict[str, set[tuple[int, bool]]] = {"FULL": set(), "PIECEWISE": set()}
    mixed = mode.mixed_mode()
    if mixed != CUDAGraphMode.NONE:
        keys[mixed.name].update((s, False) for s in capture_sizes)
    if mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine():
        keys["FULL"].update((s, True) for s in decode_capture_sizes(capture_sizes, max_num_seqs, query_len))
    return keys


def dispatch(
    mode: CUDAGraphMode,
    num_tokens: int,
    uniform_decode: bool,
    capture_sizes: Sequence[int],
    max_num_seqs: int,
    query_len: int = 1,
) -> Dispatch:
    """Pick the graph for one batch (vLLM's CudagraphDispatcher.dispatch). `mode` is resolved;
    `uniform_decode` means every request has query len `query_len` (1 + k)."""
    mode = CUDAGraphMode.parse(mode)
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if uniform_decode and mode.separate_routine() and mode.decode_mode() == CUDAGraphMode.FULL:
        # Decode graphs are keyed by request count: pad the requests, not the tokens.
        reqs = -(-num_tokens // query_len)
        for r in decode_graph_requests(capture_sizes, max_num_seqs, query_len):
            if r >= reqs:
                return Dispatch("FULL", r * query_len, True)
    padded = pad_to_capture_size(num_tokens, capture_sizes) if capture_sizes else None
    if mode == CUDAGraphMode.NONE or padded is None:
        return Dispatch("NONE", num_tokens)
    mixed = mode.mixed_mode()
    if mixed == CUDAGraphMode.NONE:
        return Dispatch("NONE", num_tokens)
    return Dispatch(cast(RuntimeMode, mixed.name), padded, False)


class CaptureItem(NamedTuple):
    runtime_mode: RuntimeMode
    size: int  # tokens
    uniform_decode: bool  # True: size / q requests of q tokens; False: min(size, max_num_seqs) requests


def capture_plan(
    mode: CUDAGraphMode, capture_sizes: Sequence[int], max_num_seqs: int, query_len: int = 1
) -> list[CaptureItem]:
    """What to capture for a resolved mode, in vLLM's order (V2 CudaGraphManager.capture: phase 1
    the mixed-mode graphs, phase 2 the split-mode decode graphs), each group largest-first so later
    (smaller) captures reuse the shared pool the largest one grew."""
    mode = CUDAGraphMode.parse(mode)
    plan: list[CaptureItem] = []
    mixed = mode.mixed_mode()
    if mixed != CUDAGraphMode.NONE:
        plan += [CaptureItem(cast(RuntimeMode, mixed.name), s, False) for s in sorted(set(capture_sizes), reverse=True)]
    if mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine():
        plan += [
            CaptureItem("FULL", s, True)
            for s in sorted(decode_capture_sizes(capture_sizes, max_num_seqs, query_len), reverse=True)
        ]
    return plan
