"""pytest plugin: a matrix as pytest items, the single-node path (one xdist worker per GPU).

    pytest -p orchestrator.pytest_plugin --orch-matrix matrices/smoke.yaml -n 8 matrices/

Registers its machinery only when --orch-matrix is given. One item per case, node id = case id
(the same ids `orch run` stores); cases the matrix skips become pytest skips with the reason.
Each item runs `backend.harness.checker.run_case_local` in the worker process and fails with the check
numbers. Under xdist, worker gwN sees one GPU (N modulo the GPUs here) through
CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, set in pytest_configure before torch touches CUDA.
`--orch-results PATH` writes {case_id: status} as JSON, from the controller only.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from backend.harness.session_cache import SessionCache

STATUS_PROP = "orch_status"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("orch", "orch matrix as pytest items")
    group.addoption("--orch-matrix", default=None, metavar="PATH", help="Run the cases of this matrix as tests.")
    group.addoption("--orch-filter", default=None, help="Select cases (as `orch run --filter`).")
    group.addoption("--orch-backend", default=None, help="Override the backend axis.")
    group.addoption("--orch-devices", default="auto", choices=["auto", "cpu", "gpu"])
    group.addoption(
        "--orch-results", default=None, metavar="PATH", help="Write {case_id: status} JSON (controller only)."
    )


def _gpu_ids() -> list[str]:
    """GPUs this process may use, without initialising CUDA (an existing mask wins)."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        mask = os.environ.get(var)
        if mask:
            return [x for x in mask.split(",") if x.strip()]
    nvidia = glob.glob("/proc/driver/nvidia/gpus/*")
    if nvidia:
        return [str(i) for i in range(len(nvidia))]
    amd = [
        p
        for p in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/gpu_id")
        if Path(p).read_text().strip() not in ("", "0")
    ]
    return [str(i) for i in range(len(amd))]


def pin_worker_gpu(worker: str | None, environ: dict | None = None) -> str | None:
    """gwN -> one GPU id (round robin); sets the visibility masks in `environ`. None: nothing to pin."""
    env = os.environ if environ is None else environ
    if not worker or not worker.startswith("gw"):
        return None
    ids = _gpu_ids()
    if not ids:
        return None
    chosen = ids[int(worker[2:]) % len(ids)]
    env["CUDA_VISIBLE_DEVICES"] = chosen
    env["HIP_VISIBLE_DEVICES"] = chosen
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("orch_matrix", None):
        return
    pin_worker_gpu(os.environ.get("PYTEST_XDIST_WORKER"))
    config.pluginmanager.register(OrchMatrixPlugin(config), "orch-matrix")


class CaseFailed(Exception):
    pass


class CaseItem(pytest.Item):
    def __init__(self, *, case, skip_reason: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.skip_reason = skip_reason

    def runtest(self) -> None:
        from backend.harness.checker import run_case, run_case_local
        from backend.result import Status

        if self.skip_reason is not None:
            self.user_properties.append((STATUS_PROP, "skip"))
            pytest.skip(self.skip_reason)
        plugin = self.config.pluginmanager.get_plugin("orch-matrix")
        assert plugin is not None, "registered by pytest_configure before any item runs"
        if self.case.tp == 1:  # what run_case_local does for tp 1, plus graph reuse across items
            result = run_case(self.case, sessions=plugin.sessions())
        else:
            result = run_case_local(self.case)
        self.user_properties.append((STATUS_PROP, result.status.value))
        if result.status == Status.SKIP:
            pytest.skip(result.reason)
        if result.status != Status.PASS:
            lines = [f"{result.status.value.upper()}: {result.reason}"]
            lines += [f"  {c.summary()}" for c in result.checks]
            if result.log_tail and result.status != Status.FAIL:
                lines.append(result.log_tail[-1500:])
            lines.append(f"repro: {result.repro}")
            raise CaseFailed("\n".join(lines))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.case.matrix or "matrix", None, self.case.case_id


class MatrixCollector(pytest.Collector):
    def collect(self):
        return []


class OrchMatrixPlugin:
    """State for one session: the matrix's items, and (controller) the verdicts seen."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.statuses: dict[str, str] = {}
        self.is_worker = hasattr(config, "workerinput")
        self._sessions: SessionCache | None = None

    def sessions(self):
        """One SessionCache per worker process, as each Ray actor keeps one."""
        if self._sessions is None:
            import torch

            from backend.harness.checker import SessionCache

            if not torch.cuda.is_available():
                torch.set_num_threads(1)  # one xdist worker per core; no oversubscription
            self._sessions = SessionCache()
        return self._sessions

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        from orchestrator.errors import OrchError
        from orchestrator.filters import select
        from orchestrator.matrix import load_matrix

        path = config.getoption("orch_matrix")
        try:
            m = load_matrix(
                path, devices=config.getoption("orch_devices"), backend_override=config.getoption("orch_backend")
            )
            flt = config.getoption("orch_filter")
            cases, skipped = select(m.cases, flt), select(m.skipped, flt)
        except OrchError as e:
            raise pytest.UsageError(f"--orch-matrix: {e.one_line()}") from None
        parent = MatrixCollector.from_parent(session, name=os.path.basename(path), nodeid="")
        for c in cases:
            items.append(CaseItem.from_parent(parent, name=c.case_id, nodeid=c.case_id, case=c))
        for s in skipped:
            items.append(
                CaseItem.from_parent(
                    parent, name=s.case.case_id, nodeid=s.case.case_id, case=s.case, skip_reason=s.reason
                )
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        status = dict(report.user_properties).get(STATUS_PROP)
        if status and (report.when == "call" or status == "skip"):
            self.statuses[report.nodeid] = str(status)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        out = self.config.getoption("orch_results")
        if out and not self.is_worker:  # only the controller writes files (as junitxml does)
            Path(out).write_text(json.dumps(self.statuses, indent=1, sort_keys=True))
