"""The values a FULL graph's padded requests get: seq_len and block-table entries.

vLLM lets each attention builder declare them (`cg_pad_seq_lens`, `cg_pad_block_table`; the base
class's 0 and -1) and its model runner pads with the maximum of each over the builders it holds
(tests/v1/attention/test_cg_padding.py: FlashMLA with an fp8 cache declares 1 and 0, because seq_len
0 made its kernel index block_table[-1]). orch's runner roles pad: PersistentMetadataBuilder (which
is the runner for one group) and GroupedMetadataBuilder (the runner over a family's groups); the
session applies the pair once, from the builders' declarations or from the case (`Case.cg_padding`,
the matrix axis that crosses a backend's values). orch's own builders declare seq_len 0 and the
null block (block 0), which is how orch padded before the capability existed (DESIGN.md §4);
vLLM's runner pads -1, which a matrix can cross them with (`cg_padding: [declared, 0/-1]`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# vLLM's defaults (AttentionMetadataBuilder), for a builder that declares nothing.
DEFAULT = (0, -1)


def declared(builder: Any) -> tuple[int, int]:
    return (
        int(getattr(builder, "cg_pad_seq_lens", DEFAULT[0])),
        int(getattr(builder, "cg_pad_block_table", DEFAULT[1])),
    )


def _all(builder: Any) -> Iterator[Any]:
    """A session's builder and the builders inside it (the backend's behind a one-group wrapper, a
    family's group builders, the runner and vLLM's own builder of an adapter)."""
    yield builder
    inner = vars(builder) if hasattr(builder, "__dict__") else {}
    for b in (inner.get("builder"), *inner.get("builders", ()), inner.get("common"), inner.get("vllm_builder")):
        if b is not None:
            yield from _all(b)


def consolidated(builder: Any) -> tuple[int, int]:
    """vLLM's runner rule: the maximum seq_len and the maximum block-table value over the builders."""
    pairs = [declared(b) for b in _all(builder)]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def apply(builder: Any, pair: tuple[int, int]) -> None:
    """Every runner role inside `builder` pads with `pair` from now on."""
    for b in _all(builder):
        if hasattr(b, "cg_padding"):
            b.cg_padding = tuple(pair)


def parse(value: str) -> tuple[int, int] | None:
    """A matrix value: "declared" (None: the builders' own), or "SEQ_LEN/BLOCK" (e.g. "1/0")."""
    if value == "declared":
        return None
    seq, block = (int(v) for v in value.split("/"))
    return seq, block


def label(pair: tuple[int, int] | None) -> str:
    """The matrix value of a pair (parse's inverse)."""
    return "declared" if pair is None else f"{pair[0]}/{pair[1]}"
