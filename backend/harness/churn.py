"""What a busy engine does to memory between a graph's capture and its replay, done before every
replay the checker makes, so that a graph reading memory it does not own is seen.

Before, orch replayed right after capturing with little allocated in between: a graph holding the
pointer of a tensor that a per-call cache had evicted (AITER's `mla_decode_fwd` split indptr in an
`lru_cache`, ROCm/aiter#5193: gsm8k 0.032 on MI355X) still read the right bytes, and a kernel that
left rows of its output unwritten showed the previous replay's right values.

- `poison_outputs`: NaN into the real rows of the static attention outputs the replay writes
  (every replay, every device): a real row a kernel does not write stays NaN, and the finite
  checks see it. Padded rows are left as they are: vLLM's backends write `output[:num_actual_tokens]`
  and leave the rest to whatever the buffer held (its seed backend, ROCM_AITER_FA 0.10.2/0.11.0,
  among them); what they hold is padded_finite's business.
- `churn` (GPU): the model run eagerly on a small batch of another shape (no KV slot: slot -1), so
  per-call caches keyed by shape evict what the graph was captured with; before the step's
  snapshot (backend/harness/checker.py), so nothing it could write is blamed on the step: it is
  the harness's own step, and what a backend writes on slots of -1 is capture_checked's finding,
  in the modes that capture (docs/CHECKER.md: what the other placement turned red).
- `poison_free_memory` (GPU): right before the replay, the caching allocator's free blocks outside
  any graph pool are filled with the poison pattern (backend/graphs/freed.py: NaN for floats, far
  out of range for ints) where the replayed graphs may read (what was allocated when they were
  captured: backend/graphs/allocator.py), so freed memory a graph still reads holds it.
  Each block is filled on the stream that owns it: the allocator serves a stream only its own free
  blocks, and what the warm-up before a capture allocated (an lru_cache'd scratch filled on its
  miss) belongs to the capture stream (the runner's, as vLLM's graph_capture stream), which the
  step's work on the current stream never reuses. Poisoned for the current stream only, such a
  freed block kept its old bytes and a graph reading it was green until a later warm-up on the
  capture stream happened to reuse it (red at a later step, or not at all).
The CPU emulation models the last two without running anything (backend/graphs/freed.py): memory
the graph read that nothing keeps alive is poisoned at replay and the read named; running the
model again on a CPU only to churn would cost the CPU matrix a second eager run per replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.graphs.allocator import Range, overlap, segments
from backend.graphs.freed import POISON_WORD
from backend.harness.scratch import mark_scratch
from backend.harness.session import Session
from backend.host_copy import to_device


def poison_outputs(session: Session, n: int) -> None:
    """NaN into the real rows [layers, :n] of the static attention outputs a replay writes."""
    session.static_attn[:, :n].fill_(float("nan"))


def churn(session: Session, n: int, size: int) -> None:
    """GPU: dummy_step (small: it runs before every replay). A no-op on the CPU."""
    if session.device.type == "cuda":
        dummy_step(session, n, size)
        # The dummy step ran the backend on slots of -1: what it wrote (a backend that writes padded
        # slots) is not the next step's, so the next snapshot copies the whole cache.
        mark_scratch(None)


def dummy_step(session: Session, n: int, size: int) -> None:
    """Run the model eagerly on vLLM's uniform decode dummy batch (1, 2 or 3 requests of 1 + k
    tokens, slots -1), neither the step's `n` tokens nor the graph's `size`, so a per-call cache
    keyed by shape evicts what the graph was captured with. A decode batch because every family
    builds one (MLA asserts decode-only for a capture batch; a spec-decode family's verify reads
    1 + k tokens a request)."""
    q = 1 + session.config.spec_tokens
    c = next(r * q for r in (1, 2, 3) if r * q not in (n, size))
    md = session.builder.build_for_capture(c, q, session.shape.capture_style)  # the step's build() rewrites it
    # Its own generator: a capturing or guarded default generator is not the dummy step's to advance.
    gen = torch.Generator().manual_seed(c)
    x = to_device(torch.randn(c, session.shape.hidden_size, generator=gen).to(session.model.dtype), session.device)
    attn = torch.empty(
        session.shape.num_layers,
        c,
        session.layout.local_heads,
        session.family.out_head_size(session.shape),
        dtype=session.model.dtype,
        device=session.device,
    )
    session.model.forward(x, md, attn, [])


def poison_free_memory(device: torch.device, reads: Sequence[Range] | None = None) -> int:
    """GPU: fill the caching allocator's free blocks (outside graph pools, on every stream) with
    the poison pattern where the graphs about to replay may read (`reads`: Session.outside_reads;
    None: every free byte); returns the bytes of `reads` poisoned. A no-op (0) on the CPU.

    Free memory is written in place, through a view of its segment's addresses: the allocator
    hands a block to its own stream only, so the fill is queued on that stream and a later
    allocation there runs after it. One fill per free block, from its first byte the graphs may
    read to its last: the gap between is free memory too. (Taking every free block from the
    allocator to fill it cost a tensor per block, thousands before every replay.)"""
    if device.type != "cuda":
        return 0
    current = torch.cuda.current_stream(device)
    pattern = _pattern(device)  # before the snapshot: its block is no free block to fill
    streams: dict[int, torch.cuda.Stream | None] = {}
    by_stream: dict[int, list[torch.Tensor]] = {}
    filled = 0
    for seg in segments(device):
        spans, nbytes = [], 0
        for start, end in seg.free:
            parts = [(start, end)] if reads is None else overlap(start, end, reads)
            if parts:
                nbytes += sum(b - a for a, b in parts)
                spans.append((parts[0][0], parts[-1][1]))
        if not spans:
            continue
        if seg.stream not in streams:
            streams[seg.stream] = _stream(seg.stream, device, current)
        stream = streams[seg.stream]
        if stream is None:
            continue
        filled += nbytes
        words = _words_at(seg.address, seg.size, device)
        # block addresses are 512-byte aligned: whole 16-bit words
        by_stream.setdefault(seg.stream, []).extend(
            words[(start - seg.address) // 2 : -(-(end - seg.address) // 2)] for start, end in spans
        )
    for handle, views in by_stream.items():
        with torch.cuda.stream(streams[handle]):
            _fill(views, pattern)
    for stream in streams.values():
        if stream is not None and stream != current:
            current.wait_stream(stream)  # the replay, on the current stream, reads after the fill
    return filled


# Spans up to this many 16-bit words are filled together, copied from a pattern buffer of this
# size by torch's multi-tensor copy (a few launches for hundreds of spans: a replay reads around
# hundreds of small free blocks, and a fill of each was a launch and ~3 us of device time apiece);
# longer spans get a fill of their own.
BATCH_WORDS = 1 << 19
_PATTERNS: dict[torch.device, torch.Tensor] = {}


def _pattern(device: torch.device) -> torch.Tensor:
    """BATCH_WORDS of the poison pattern on `device`, made once per process and kept (never freed,
    so no stream's later allocation can reuse it while another stream's copy still reads it)."""
    key = torch.device(device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _PATTERNS:
        words = torch.full((BATCH_WORDS,), POISON_WORD, dtype=torch.int16, device=key)
        torch.cuda.current_stream(key).synchronize()  # filled before any other stream reads it
        _PATTERNS[key] = words
    return _PATTERNS[key]


def _fill(views: list[torch.Tensor], pattern: torch.Tensor) -> None:
    """Fill `views` (1-D int16) with the poison pattern on the current stream: the short ones in
    one multi-tensor copy from `pattern`, the long ones each with a fill."""
    short = [v for v in views if v.numel() <= pattern.numel()]
    for v in views:
        if v.numel() > pattern.numel():
            v.fill_(POISON_WORD)
    if short:
        torch._foreach_copy_(short, [pattern[: v.numel()] for v in short])  # torch's optimizers' multi-tensor copy


class _DeviceWords:
    """Device memory the caching allocator holds, as 16-bit words, for torch.as_tensor (CUDA array
    interface): a tensor that owns nothing and frees nothing."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes // 2,),
            "typestr": "<i2",
            "data": (address, False),
            "version": 2,
        }


def _words_at(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(_DeviceWords(address, nbytes), device=device)


def _stream(handle: int, device: torch.device, current: torch.cuda.Stream) -> torch.cuda.Stream | None:
    """The stream a segment belongs to, or None for one that is capturing (a failed capture's
    abandoned stream: nothing may be queued on it)."""
    if handle in (0, current.cuda_stream):
        return current if handle == current.cuda_stream else torch.cuda.default_stream(device)
    stream = torch.cuda.ExternalStream(handle, device=device)
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():
            return None
    return stream
