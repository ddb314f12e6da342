"""A family from outside orch's tree: multi-query attention, every query head over ONE kv
head, registered with no edit to backend/: the matrix names this spec by import path
(`attention: [tests.families.plugin_mqa:SPEC]`), or an installed distribution by an
`orch.families` entry point. Torch-free, as a spec must be (the planner reads it); the family and
its provider are in plugin_mqa_impl.py. docs/BACKENDS.md "A family of your own" is this file."""

from backend.families.specs import FamilySpec


def _layout(shape, tp):
    """Query heads split by tp; the one kv head replicated on every rank (vLLM's rule)."""
    return [f"num_heads {shape.num_heads} not divisible by tp {tp}"] if shape.num_heads % tp else []


SPEC = FamilySpec(
    name="mqa",
    description="multi-query attention: K and V caches [blocks, block_size, 1, head_size]",
    impl="tests.families.plugin_mqa_impl:MQA",
    derive=lambda dims: {"num_kv_heads": 1},  # never written in a matrix: the family fixes it
    layout_reasons=_layout,
)
