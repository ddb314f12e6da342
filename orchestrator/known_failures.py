"""Known failures: a YAML list of case-id glob patterns with a reason, turned into xfail by the gate.

    - case: "tp2-FULL-fp8-*-aiter*"       # fnmatch glob on the case id
      reason: "fp8 KV wrong under FULL (vLLM #49010)"
      link: https://github.com/vllm-project/vllm/issues/49010   # required: the ticket
      until: 2026-03-01                     # required: after this date the entry gates again
      mute: true                            # optional: report the real status, never gate

An entry without `mute` is an xfail: a failing case is `known-fail`, a passing one `fixed`
("remove the entry"). A muted case (Buildkite's muted tests) is `muted` whatever it did, its real
status shown: for a case that fails now and then, where "fixed" would be noise. Every entry needs
a ticket and an expiry, so none outlives its reason unnoticed; an expired entry no longer applies
and the gate names it beside the cases it would have covered.

Every bad entry is an InputError naming file:line (from the YAML node marks), so a typo in CI
fails loudly instead of silently gating nothing.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from orchestrator.errors import InputError

_KEYS = ("case", "reason", "link", "until", "mute")
_REQUIRED = ("case", "reason", "link", "until")


@dataclass(frozen=True)
class KnownFailure:
    pattern: str
    reason: str
    link: str = ""
    until: dt.date | None = None
    line: int = 0  # 1-based line of the entry in its file
    mute: bool = False  # run and report, never gate (and never "fixed")
    source: str = ""  # its file

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source else f"line {self.line}"

    def matches(self, case_id: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.pattern)

    def expired(self, today: dt.date | None = None) -> bool:
        return self.until is not None and (today or dt.date.today()) > self.until


@dataclass(frozen=True)
class KnownFailures:
    entries: tuple[KnownFailure, ...] = ()
    source: str = ""
    today: dt.date | None = None  # fixed "today" for tests; None = the real date

    def match(self, case_id: str) -> KnownFailure | None:
        """First entry that matches and has not expired."""
        for e in self.entries:
            if not e.expired(self.today) and e.matches(case_id):
                return e
        return None

    def expired_match(self, case_id: str) -> KnownFailure | None:
        """An expired entry that would have matched (and no live one does): the case gates again."""
        if self.match(case_id) is not None:
            return None
        return next((e for e in self.entries if e.expired(self.today) and e.matches(case_id)), None)

    @property
    def expired(self) -> tuple[KnownFailure, ...]:
        return tuple(e for e in self.entries if e.expired(self.today))

    def unused(self, case_ids: Sequence[str]) -> tuple[KnownFailure, ...]:
        """Live entries that match no case of the run: probably stale or mistyped."""
        return tuple(e for e in self.entries if not e.expired(self.today) and not any(e.matches(c) for c in case_ids))


def _err(source: str, node: yaml.Node, msg: str) -> InputError:
    return InputError(msg, source=source, line=node.start_mark.line + 1)


def _scalar(source: str, node: yaml.Node, key: str) -> str:
    if not isinstance(node, yaml.ScalarNode) or str(node.value).strip() == "":
        raise _err(source, node, f"known failure '{key}' must be a non-empty string")
    return str(node.value).strip()


def _bool(source: str, node: yaml.Node, key: str) -> bool:
    value = str(getattr(node, "value", "")).strip().lower()
    if not isinstance(node, yaml.ScalarNode) or value not in ("true", "false"):
        raise _err(source, node, f"known failure '{key}' must be true or false")
    return value == "true"


def parse(text: str, source: str = "<known-failures>") -> KnownFailures:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"invalid YAML: {problem}", source=source, line=mark.line + 1 if mark else None) from None
    if root is None:
        return KnownFailures((), source)
    if not isinstance(root, yaml.SequenceNode):
        raise _err(source, root, "known failures must be a YAML list of {case, reason, link, until, mute}")
    entries = []
    for item in root.value:
        if not isinstance(item, yaml.MappingNode):
            raise _err(source, item, "each known failure must be a mapping with 'case' and 'reason'")
        fields: dict[str, yaml.Node] = {}
        for k, v in item.value:
            key = str(k.value)
            if key not in _KEYS:
                raise _err(source, k, f"unknown key '{key}' in known failure (allowed: {', '.join(_KEYS)})")
            if key in fields:
                raise _err(source, k, f"duplicate key '{key}' in known failure")
            fields[key] = v
        for required in _REQUIRED:
            if required not in fields:
                why = {
                    "link": " (the ticket that tracks it)",
                    "until": " (a date YYYY-MM-DD after which it gates again)",
                }
                raise _err(source, item, f"known failure is missing '{required}'{why.get(required, '')}")
        raw = _scalar(source, fields["until"], "until")
        try:
            until = dt.date.fromisoformat(raw)
        except ValueError:
            raise _err(source, fields["until"], f"'until' must be a date YYYY-MM-DD, got {raw!r}") from None
        entries.append(
            KnownFailure(
                pattern=_scalar(source, fields["case"], "case"),
                reason=_scalar(source, fields["reason"], "reason"),
                link=_scalar(source, fields["link"], "link"),
                until=until,
                line=item.start_mark.line + 1,
                mute=_bool(source, fields["mute"], "mute") if "mute" in fields else False,
                source=source,
            )
        )
    return KnownFailures(tuple(entries), source)


def load(path: str | None) -> KnownFailures | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read known-failures file: {e.strerror}", source=path) from None
    return parse(text, path)
