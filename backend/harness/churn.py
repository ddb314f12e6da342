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
  any graph pool are taken, filled with the poison pattern (backend/graphs/freed.py: NaN for
  floats, far out of range for ints) where the replayed graphs may read (what was allocated when
  they were captured: backend/graphs/allocator.py) and given back, so freed memory a graph still
  reads holds it.
  Each block is taken on the stream that owns it: the allocator serves a stream only its own free
  blocks, and what the warm-up before a capture allocated (an lru_cache'd scratch filled on its
  miss) belongs to the capture stream (the runner's, as vLLM's graph_capture stream), which the
  step's work on the current stream never reuses. Taken from the current stream only, such a
  freed block kept its old bytes and a graph reading it was green until a later warm-up on the
  capture stream happened to reuse it (red at a later step, or not at all).
The CPU emulation models the last two without running anything (backend/graphs/freed.py): memory
the graph read that nothing keeps alive is poisoned at replay and the read named; running the
model again on a CPU only to churn would cost the CPU matrix a second eager run per replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.graphs.allocator import Range, blocks, overlap
from backend.graphs.freed import POISON_WORD
from backend.harness.scratch import mark_scratch
from backend.harness.session import Session

# The caching allocator's small pool serves requests up to this (CUDACachingAllocator kSmallSize):
# a free block of a small segment is taken back in pieces of at most this size.
_SMALL = 1 << 20


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
    x = torch.randn(c, session.shape.hidden_size, generator=gen).to(session.device, session.model.dtype)
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
    the poison pattern, or only their parts inside `reads` (the ranges the graphs about to replay
    may read: Session.outside_reads); returns the bytes poisoned. A no-op (0) on the CPU."""
    if device.type != "cuda":
        return 0
    by_stream: dict[int, list[int]] = {}
    for block in blocks(device):
        if block.active:
            continue
        # Every free block is taken, even one no graph may read: a request of a size gets the
        # allocator's choice among the free blocks that fit, so only taking them all reaches each.
        requests = by_stream.setdefault(block.stream, [])
        size = block.size
        while size > 0:  # a small segment's block goes back to a small-pool request
            take = min(size, _SMALL) if block.small else size
            requests.append(take)
            size -= take
    current = torch.cuda.current_stream(device)
    held, filled = [], 0
    for handle, requests in by_stream.items():
        stream = _stream(handle, device, current)
        if stream is None:
            continue
        with torch.cuda.stream(stream):
            for size in sorted(requests, reverse=True):  # best fit: each takes a free block of its size
                t = torch.empty(size, dtype=torch.uint8, device=device)
                held.append(t)
                # Which free block of this size the allocator handed out is its choice: fill by address.
                base = t.data_ptr()
                parts = [(base, base + size)] if reads is None else overlap(base, base + size, reads)
                for start, end in parts:
                    lo, hi = (start - base) // 2 * 2, -(-(end - base) // 2) * 2
                    t[lo : min(hi, size // 2 * 2)].view(torch.int16).fill_(POISON_WORD)
                    filled += end - start
        if stream != current:
            current.wait_stream(stream)  # the replay, on the current stream, reads after the fill
    return filled


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
