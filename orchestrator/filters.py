"""Case filters: `--filter 'tp=2,4 mode=FULL* fp8'`.

Terms are separated by spaces and must all match. A term is either
- `key=v1,v2`: the case's axis value equals one of the values (case-insensitive; values may be
  globs, `batch=decode_*`). Keys: tp, cudagraph_mode (or mode), kv_cache_dtype (or kv), batch,
  backend (the name as given, or the class name of an import path), seed, spec_tokens (or k),
  attention (or family: gqa, mla, ...), cg_padding (or pad: declared, 1/0 ...); or
- anything else: a glob (if it has * ? or [) or a substring of the case id.
Unknown keys and impossible axis values are an InputError, so a typo cannot silently select
nothing.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from backend.case import CUDAGRAPH_MODES, KV_CACHE_DTYPES, TP_SIZES, Case
from backend.families.contract import FAMILY_NAMES, UnknownFamily
from backend.families.contract import spec as family_spec
from backend.result import CaseResult
from orchestrator.errors import InputError

KEYS = {
    "attention": "attention",
    "family": "attention",
    "tp": "tp",
    "cudagraph_mode": "cudagraph_mode",
    "mode": "cudagraph_mode",
    "kv_cache_dtype": "kv_cache_dtype",
    "kv": "kv_cache_dtype",
    "batch": "batch",
    "backend": "backend",
    "seed": "seed",
    "spec_tokens": "spec_tokens",
    "k": "spec_tokens",
    "cg_padding": "cg_padding",
    "pad": "cg_padding",
}
_KNOWN_VALUES = {
    "tp": tuple(str(t) for t in TP_SIZES),
    "cudagraph_mode": tuple(m.lower() for m in CUDAGRAPH_MODES),
    "kv_cache_dtype": KV_CACHE_DTYPES,
}
_GLOB = set("*?[")
# Axis values of results stored before their axis existed (CaseResult.axes lacks the key).
_DEFAULTS = {"attention": "gqa", "spec_tokens": 0}

T = TypeVar("T")


@dataclass(frozen=True)
class Term:
    key: str | None  # canonical axis name; None = case-id pattern
    values: tuple[str, ...]  # lower-case patterns

    def matches(self, case: Case | CaseResult) -> bool:
        """A Case, or a stored CaseResult (the gate's `--require` slices): both carry case_id and axes."""
        if self.key is None:
            cid = case.case_id.lower()
            pat = self.values[0]
            return fnmatch.fnmatchcase(cid, pat) if _GLOB & set(pat) else pat in cid
        value = case.axes.get(self.key, _DEFAULTS.get(self.key))
        actual = [str(value).lower()]
        if self.key == "backend":  # the class name of an import path, as ids show it
            actual.append(str(value).rsplit(":", 1)[-1].lower())
        return any(fnmatch.fnmatchcase(a, v) for a in actual for v in self.values)


@dataclass(frozen=True)
class Filter:
    terms: tuple[Term, ...]

    def matches(self, case: Case | CaseResult) -> bool:
        return all(t.matches(case) for t in self.terms)


def parse_filter(expr: str | None) -> Filter:
    terms = []
    for raw in (expr or "").split():
        if "=" not in raw:
            terms.append(Term(None, (raw.lower(),)))
            continue
        key, _, values = raw.partition("=")
        canonical = KEYS.get(key.lower())
        if canonical is None:
            raise InputError(f"unknown filter key {key!r} in {raw!r}; keys: {', '.join(KEYS)}", source="--filter")
        parts = tuple(v.lower() for v in values.split(",") if v)
        if not parts:
            raise InputError(f"{raw!r}: no value after '='", source="--filter")
        for v in parts:
            _check_value(canonical, v, raw)
        if canonical in ("seed", "spec_tokens"):  # `k=02` means 2, as the id writes it
            parts = tuple(v if _GLOB & set(v) else str(int(v)) for v in parts)
        terms.append(Term(canonical, parts))
    return Filter(tuple(terms))


def _check_value(key: str, value: str, raw: str) -> None:
    if _GLOB & set(value):
        return
    if key == "attention":  # a builtin family or a plugin's (loaded by the matrix, or an entry point)
        try:
            family_spec(value)
        except UnknownFamily:
            raise InputError(
                f"{raw!r}: {value!r} is not an attention family ({', '.join(FAMILY_NAMES)}, or a plugin's)",
                source="--filter",
            ) from None
        return
    known = _KNOWN_VALUES.get(key)
    if known is not None and value not in known:
        raise InputError(f"{raw!r}: {value!r} is not a {key} value ({', '.join(known)})", source="--filter")
    if key in ("seed", "spec_tokens") and not value.isdigit():
        raise InputError(f"{raw!r}: {key} must be a non-negative integer", source="--filter")


def _case_of(item: Any) -> Case:
    return item.case if hasattr(item, "case") and isinstance(item.case, Case) else item


def select(cases: Sequence[T], filter_expr: str | None) -> list[T]:
    """The cases matching every term, in order. Accepts Case or SkippedCase items (a SkippedCase
    is matched on its case), so the plan filters skipped cases the same way."""
    flt = parse_filter(filter_expr)
    return [c for c in cases if flt.matches(_case_of(c))]
