"""The cudagraph support level a backend declares (vLLM's AttentionCGSupport). Torch-free, so the
matrix, the planner and backend.harness.modes can reason about support without importing torch."""

from __future__ import annotations

import enum


def unavailable(why: str) -> str:
    """A backend's unavailable_reason as a skip reason: every reason starts "unavailable: " once
    (builtin providers already say it; a plugin's bare reason gets the prefix)."""
    return why if why.startswith("unavailable") else f"unavailable: {why}"


class AttentionCGSupport(enum.IntEnum):
    """How far a backend's forward can be captured in a FULL graph. Ordered: min() over layers."""

    NEVER = 0
    """Not capturable in a full graph at all (PIECEWISE only)."""
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    """Full graphs only for pure-decode batches (every request has query len 1)."""
    UNIFORM_BATCH = 2
    """Full graphs for batches whose requests all have the same query len (spec-decode verify
    batches of q = 1 + k included)."""
    ALWAYS = 3
    """Full graphs for any batch, mixed prefill + decode included."""
