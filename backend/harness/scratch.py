"""The step's KV-cache snapshot (scratch buffers refilled in place; a partial refill when the
scratch still equals the caches), and the check of what making a graph writes to the caches
(capture_checked: warm-up and capture run on slots of -1, so any write is a bug)."""

from __future__ import annotations

import weakref

import torch

from backend.harness.checks import raw
from backend.harness.session import GraphKey, Session

# The step's cache snapshot is scratch (restored from by the eager side, consumed by kv_integrity,
# discarded after the step): one set of per-layer buffers per process, refilled in place each step
# instead of a fresh clone (half the cost on the CPU, where a fresh allocation of this size is
# page-faulted in every time; no allocator churn of GBs per step on a GPU). Keyed by the caches'
# shapes, dtypes and device: a session of another shape or kv dtype replaces it.
SCRATCH: dict[tuple, list[torch.Tensor]] = {}


# The session whose caches the scratch equals byte for byte (a weak reference), or None. A step
# that passes kv_integrity's "nothing changed outside the real slots" leaves the scratch equal to
# the caches (kv_integrity copies the real slots into it and compares the rest), so the next
# step's snapshot only needs the slots its context fill wrote, not a whole-cache copy (4.3 GB
# a step at full.yaml's GPU shape). Anything else that may write the caches (a capture, a step
# that wrote outside its slots, an exception, another session on the same buffers) leaves None.
SCRATCH_OWNER: list = [None]


# Above this fraction of the cache's slots, one contiguous copy is cheaper than gather + scatter.
PARTIAL_SNAPSHOT_MAX = 0.25


def scratch_in_sync(session: Session) -> bool:
    owner = SCRATCH_OWNER[0]
    return owner is not None and owner() is session


def mark_scratch(session: Session | None) -> None:
    SCRATCH_OWNER[0] = weakref.ref(session) if session is not None else None


def _key(caches: list[torch.Tensor]) -> tuple:
    return tuple((tuple(c.shape), c.dtype, str(c.device)) for c in caches)


def take_snapshot(
    caches: list[torch.Tensor], session: Session | None = None, written: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """The caches' state now, in the scratch buffers. With `session` whose caches the scratch
    still equals but for the slots `written` (int64, on the caches' device), only those are copied."""
    key = _key(caches)
    bufs = SCRATCH.get(key)
    in_sync = session is not None and written is not None and scratch_in_sync(session) and bufs is not None
    mark_scratch(None)  # until the step that uses it has verified it again
    if bufs is None:
        SCRATCH.clear()  # before allocating: one copy of the caches at a time
        bufs = SCRATCH[key] = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in caches]
    partial = False
    # A family with state slots (StepState) writes them outside `written`: a whole copy then.
    if (
        in_sync
        and session is not None
        and written is not None
        and session.family.step_state() is None
        and all(c.is_contiguous() for c in caches)
    ):
        num_slots = session.family.slot_rows(caches[0]).shape[1]
        partial = written.numel() <= PARTIAL_SNAPSHOT_MAX * num_slots
    for b, c in zip(bufs, caches):
        if partial and session is not None and written is not None:
            if written.numel():  # [planes, num_slots, row] views of both (contiguous)
                rows = session.family.slot_rows(b)
                rows[:, written] = session.family.slot_rows(c)[:, written]
        else:
            b.copy_(c)
    return bufs


def capture_checked(session: Session, keys: set[GraphKey]) -> float:
    """Capture the keys the session lacks, checking that making each graph (its eager warm-up and
    the capture itself, on vLLM's dummy batch of slot -1 tokens) writes nothing to the KV cache:
    a write there lands before any step's snapshot, so kv_integrity could not see it (vLLM #39444:
    a warm-up write to slot 0), and it can pre-write the very bytes a later stray write repeats
    What a key wrote is kept in session.capture_writes; every step that replays that graph
    fails kv_integrity with it. Returns the seconds spent capturing."""
    missing = [k for k in keys if k not in session.graphs]
    if not missing:
        return 0.0
    family = session.family
    # The scratch as "before": already equal to the caches when the last step left it so (no copy),
    # else refilled whole.
    bufs = SCRATCH.get(_key(session.kv_caches)) if scratch_in_sync(session) else None
    if bufs is None:
        bufs = take_snapshot(session.kv_caches)
    mark_scratch(None)  # until every capture below has been compared
    before = [family.slot_rows(b) for b in bufs]  # views of the scratch (contiguous caches)
    spent, wrote = 0.0, False
    for key in sorted(missing, key=lambda k: (k.uniform_decode, -k.size, k.runtime_mode)):  # capture_plan order
        spent += session.ensure_graphs({key})
        for layer, (cache, was) in enumerate(zip(session.kv_caches, before)):
            now = family.slot_rows(cache)
            if torch.equal(raw(now), raw(was)):
                continue
            wrote = True
            changed = (raw(now) != raw(was)).reshape(now.shape[0], now.shape[1], -1).any(dim=-1).any(dim=0)
            n = int(changed.sum())
            session.capture_writes.setdefault(
                key,
                f"layer {layer}: {n} slot{'s' if n != 1 else ''} written during its warm-up and capture "
                f"(first slot {int(torch.argmax(changed.to(torch.uint8)))}); capture runs on slots of -1",
            )
            was.copy_(now)
    # Nothing written: the scratch still equals the caches byte for byte, so the next step's
    # snapshot copies only the slots it fills (as after a step that passed kv_integrity).
    mark_scratch(session if not wrote else None)
    return spent
