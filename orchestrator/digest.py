"""Long lists folded to fit a CI log: skips grouped by reason, mode downgrades grouped by what
happened to which backends, case ids sampled with how many were left out.

One module so that `orch plan`, the last lines of `orch run`, `orch gate`, `orch report` and
summary.md word a fold the same way (a CI log of full.yaml on a CPU had 702 lines of missing
cases and 74 identical downgrade warnings). Pure functions over plain values: no torch, no Ray.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Ids shown in a folded line before "and N more".
SAMPLE = 3


@dataclass(frozen=True)
class Group:
    """`count` cases that share `what` (a skip reason, a downgrade), over `backends`."""

    what: str
    count: int
    backends: tuple[str, ...]

    def named(self) -> str:
        """The backends, at most SAMPLE of them: "aiter-triton, aiter-triton-pa"."""
        more = len(self.backends) - SAMPLE
        return ", ".join(self.backends[:SAMPLE]) + (f" and {more} more" if more > 0 else "")


def plural(n: int, word: str, many: str | None = None) -> str:
    """ "1 case", "2 cases", "1 new failure", "0 flaky" (`many` where "s" is not the plural)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _groups(pairs: Iterable[tuple[str, str]]) -> list[Group]:
    """(what, backend) pairs -> groups, most cases first, then by text (a stable order)."""
    counts: Counter[str] = Counter()
    backends: dict[str, dict[str, None]] = {}
    for what, backend in pairs:
        counts[what] += 1
        backends.setdefault(what, {})[backend] = None
    return [Group(w, n, tuple(sorted(backends[w]))) for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def skip_groups(skips: Iterable[tuple[str, str]]) -> list[Group]:
    """(reason, backend) per skipped case -> one group per reason."""
    return _groups(skips)


def skip_lines(skips: Iterable[tuple[str, str]]) -> list[str]:
    """One line per reason: "670 unavailable: needs a CUDA/ROCm GPU (Triton) (aiter-triton, ...)"."""
    return [f"{g.count} {g.what} ({g.named()})" for g in skip_groups(skips)]


def _support(backend: str, family: str = "gqa") -> str | None:
    """A builtin's declared cudagraph support (torch-free); None for a plugin (reading it would
    import the plugin, and torch with it, into a report)."""
    from backend.attention.capabilities import BUILTIN_CAPABILITIES

    caps = BUILTIN_CAPABILITIES.get((backend, family))
    return caps.cudagraph_support.name if caps is not None else None


def downgrade_groups(downgrades: Iterable[tuple[str, ...]]) -> list[Group]:
    """(requested mode, resolved mode, backend[, attention family]) per downgraded case -> one group per downgrade,
    support level and family: "FULL downgraded to FULL_AND_PIECEWISE for UNIFORM_BATCH mla backends" (mla's
    torch is UNIFORM_BATCH, gqa's ALWAYS: the family says which torch)."""

    def what(req: str, res: str, backend: str, family: str = "gqa") -> str:
        support = _support(backend, family)  # a provider's support is its family's: name the family
        return f"{req} downgraded to {res}" + (f" for {support} {family} backends" if support else "")

    return _groups((what(*d), d[2]) for d in downgrades)


def downgrade_lines(downgrades: Iterable[tuple[str, ...]]) -> list[str]:
    """One warning line per group: "74 cases: FULL downgraded to ... (aiter-emulated)"."""
    return [f"{plural(g.count, 'case')}: {g.what} ({g.named()})" for g in downgrade_groups(downgrades)]


def sample(ids: Sequence[str], n: int = SAMPLE) -> str:
    """ "a, b, c and 679 more": the first `n` ids and how many were left out."""
    shown = ", ".join(ids[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")


def class_ids(classification: Mapping[str, str], cls: str) -> list[str]:
    return sorted(cid for cid, c in classification.items() if c == cls)


def gate_lines(classification: Mapping[str, str], classes: Sequence[str]) -> list[str]:
    """One line per class that has cases, in `classes` order: "missing 682: a, b, c and 679 more"."""
    out = []
    for cls in classes:
        ids = class_ids(classification, cls)
        if ids:
            out.append(f"{cls} {len(ids)}: {sample(ids)}")
    return out
