"""Cudagraph modes with vLLM v1 semantics (DESIGN.md §4): resolution against the backend's
support level, capture sizes and padding, the per-batch dispatch, and what must be captured.

Facts carried over from vLLM (vllm/config/compilation.py CUDAGraphMode, the resolution in
GPUModelRunner.initialize_cudagraph_capture / CompilationConfig, vllm/v1/cudagraph_dispatcher.py):
- Composite modes are (decode, mixed) pairs; only NONE, PIECEWISE, FULL are runtime modes.
- Mixed FULL needs ALWAYS. UNIFORM_BATCH is not enough (a mixed batch is not uniform), so FULL
  with UNIFORM_BATCH is downgraded exactly like UNIFORM_SINGLE_TOKEN_DECODE.
- Split modes add FULL keys for uniform decode only at capture sizes <= max_num_seqs (q = 1, so
  max_num_seqs tokens at most); a decode batch that pads above that falls back to the mixed key.
- Dispatch pads to the smallest capture size >= N; above the largest, or when nothing matches,
  it runs eager at the unpadded size.
Speculative decode (uniform query len > 1) is out of scope: uniform decode here means q = 1.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence

from backend.attention.interface import AttentionCGSupport

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
        return {"requested": self.requested.name, "resolved": self.resolved.name,
                "downgraded": self.downgraded, "message": self.message}


def resolve_mode(requested: str | CUDAGraphMode, support: AttentionCGSupport, *,
                 piecewise_available: bool = True, backend_name: str = "attention") -> ModeResolution:
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
        notes.append(f"CUDAGraphMode.{mode.name} needs attention split out of the graph, which is "
                     f"unavailable; setting cudagraph_mode={target.name}")
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

    # 3. Nothing above can leave FULL with NEVER; kept as vLLM's final guard.
    if mode.has_full() and support == AttentionCGSupport.NEVER:
        raise UnsupportedModeError(unsupported(mode) + "; please try cudagraph_mode=PIECEWISE")

    return ModeResolution(req, mode, mode != req, "; ".join(notes))


def pad_to_capture_size(num_tokens: int, sizes: Sequence[int]) -> int | None:
    """Smallest capture size >= num_tokens; None above the largest (run eager, unpadded)."""
    ordered = sorted(set(sizes))
    i = bisect.bisect_left(ordered, num_tokens)
    return ordered[i] if i < len(ordered) else None


def decode_capture_sizes(capture_sizes: Sequence[int], max_num_seqs: int) -> list[int]:
    """Sizes that get a FULL uniform-decode graph in split modes: q = 1, so at most max_num_seqs."""
    return sorted({s for s in capture_sizes if 1 <= s <= max_num_seqs})


def is_uniform_decode(query_lens: Sequence[int]) -> bool:
    return len(query_lens) > 0 and all(q == 1 for q in query_lens)


@dataclass(frozen=True)
class Dispatch:
    runtime_mode: RuntimeMode
    padded_tokens: int  # tokens the step runs with: a capture size, or num_tokens when eager
    uniform_decode: bool = False  # key of the graph used: True only for a split-mode decode graph


def _keys(mode: CUDAGraphMode, capture_sizes: Sequence[int], max_num_seqs: int) -> dict[str, set[tuple[int, bool]]]:
    keys: dict[str, set[tuple[int, bool]]] = {"FULL": set(), "PIECEWISE": set()}
    mixed = mode.mixed_mode()
    if mixed != CUDAGraphMode.NONE:
        keys[mixed.name].update((s, False) for s in capture_sizes)
    if mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine():
        keys["FULL"].update((s, True) for s in decode_capture_sizes(capture_sizes, max_num_seqs))
    return keys


def dispatch(mode: CUDAGraphMode, num_tokens: int, uniform_decode: bool,
             capture_sizes: Sequence[int], max_num_seqs: int) -> Dispatch:
    """Pick the graph for one batch (vLLM's CudagraphDispatcher.dispatch). `mode` is resolved."""
    mode = CUDAGraphMode.parse(mode)
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    padded = pad_to_capture_size(num_tokens, capture_sizes) if capture_sizes else None
    if mode == CUDAGraphMode.NONE or padded is None:
        return Dispatch("NONE", num_tokens)
    keys = _keys(mode, capture_sizes, max_num_seqs)
    # Decode-graph key only in a mode with FULL decode graphs; otherwise a decode batch is "mixed".
    exact = (padded, uniform_decode and mode.has_full())
    relaxed = (padded, False)
    if exact in keys["FULL"]:
        return Dispatch("FULL", padded, exact[1])
    if relaxed in keys["FULL"]:
        return Dispatch("FULL", padded, False)
    if relaxed in keys["PIECEWISE"]:
        return Dispatch("PIECEWISE", padded, False)
    return Dispatch("NONE", num_tokens)


class CaptureItem(NamedTuple):
    runtime_mode: RuntimeMode
    size: int  # tokens
    uniform_decode: bool  # True: dummy batch of `size` decode requests; False: min(size, max_num_seqs) requests


def capture_plan(mode: CUDAGraphMode, capture_sizes: Sequence[int], max_num_seqs: int) -> list[CaptureItem]:
    """What to capture for a resolved mode, in vLLM's order: the mixed-mode graphs, then the
    split-mode decode graphs, each group largest-first so later (smaller) captures reuse the
    shared pool the largest one grew."""
    mode = CUDAGraphMode.parse(mode)
    plan: list[CaptureItem] = []
    mixed = mode.mixed_mode()
    if mixed != CUDAGraphMode.NONE:
        plan += [CaptureItem(mixed.name, s, False) for s in sorted(set(capture_sizes), reverse=True)]
    if mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine():
        plan += [CaptureItem("FULL", s, True)
                 for s in sorted(decode_capture_sizes(capture_sizes, max_num_seqs), reverse=True)]
    return plan
