"""The store's rows as frozen dataclasses: RunInfo (a run with its counts), and the conversions
from a database row back to RunInfo and CaseResult (orchestrator/store/api.py writes them).
file_sha and device_model are the two derived values a run row keeps (its matrix's hash, the
device model most of its cases ran on).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.result import CaseResult, CheckOutcome, Status
from orchestrator.store.options import RunOptions


@dataclass(frozen=True)
class RunInfo:
    id: int
    matrix: str
    matrix_sha: str
    git_sha: str
    started_at: float
    finished_at: float | None
    status: str
    cluster: str
    devices: str
    versions: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    baseline: str | None = None
    num_cases: int = 0  # planned
    num_results: int = 0  # final verdicts recorded so far
    label: str = ""  # `orch run --label` (e.g. the branch): `--baseline LABEL` finds runs by it
    device_model: str = ""  # the device most of its cases ran on ("NVIDIA H100 80GB HBM3", "cpu")
    options: RunOptions = field(default_factory=RunOptions)  # how `orch run` was asked for it

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def file_sha(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def device_model(device: str) -> str:
    """The model in a result's device label: "NVIDIA H100 80GB HBM3 (cuda:0)" -> "NVIDIA H100 80GB HBM3"."""
    d = (device or "").strip()
    if d.endswith(")") and " (" in d:
        d = d[: d.rfind(" (")]
    return d


def result_from_row(row: Any) -> CaseResult:
    checks = tuple(
        CheckOutcome(**{**c, "first_bad": tuple(c["first_bad"]) if c.get("first_bad") is not None else None})
        for c in json.loads(row["checks"])
    )
    return CaseResult(
        case_id=row["case_id"],
        status=Status(row["status"]),
        reason=row["reason"],
        checks=checks,
        requested_mode=row["requested_mode"],
        resolved_mode=row["resolved_mode"],
        downgraded=bool(row["downgraded"]),
        graph_kind=row["graph_kind"],
        provider=row["provider"],
        capture_sizes_used=tuple(json.loads(row["capture_sizes"])),
        error_kind=row["error_kind"],
        timings=json.loads(row["timings"]),
        device=row["device"],
        versions=json.loads(row["versions"]),
        log_tail=row["log_tail"],
        repro=row["repro"],
        attempts=row["attempts"],
        worker=row["worker"],
        axes=json.loads(row["axes"]),
        memory=json.loads(row["memory"]),
    )


def run_from_row(r: Any) -> RunInfo:
    return RunInfo(
        id=r["id"],
        matrix=r["matrix"],
        matrix_sha=r["matrix_sha"],
        git_sha=r["git_sha"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        status=r["status"],
        cluster=r["cluster"],
        devices=r["devices"],
        versions=json.loads(r["versions"]),
        argv=json.loads(r["argv"]),
        baseline=r["baseline"],
        num_cases=r["num_cases"],
        num_results=r["num_results"],
        label=r["label"],
        device_model=r["device_model"],
        options=RunOptions.from_json(r["options"]),
    )
