"""`orch run`'s options as one value: built once from the command line (`RunRequest.from_cli`,
which checks them: exit 2), then handed down whole. A new option is a field here and a line in
cli.py; the functions between read what they need from the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import InputError
from orchestrator.executor.packing import MemoryOptions
from orchestrator.judging import CLI_KEYS, Judging


@dataclass(frozen=True)
class RunRequest:
    matrix: str | None = None  # None only with --resume (the run's own)
    backend: str | None = None  # --backend: overrides the backend axis
    filter_expr: str | None = None
    db: str | None = None  # None: defaults.db()
    out_dir: str | None = None  # None: defaults.out(), or with --resume the run's own
    junit_path: str | None = None
    summary_path: str | None = None
    address: str = "local"
    devices: str = "auto"
    workers: int | None = None
    timeout_s: float | None = None
    max_gpus: int | None = None
    precompile_jobs: int | None = None
    label: str | None = None
    resume_id: int | None = None  # --resume RUN_ID
    no_progress: bool = False
    verbose: bool = False
    memory: MemoryOptions = field(
        default_factory=MemoryOptions
    )  # --workers-per-gpu, --gpu-memory-utilization, --gpu-memory
    judging: Judging = field(default_factory=Judging)  # what judges the run (judging.py): as asked here

    @classmethod
    def from_cli(cls, options: Mapping[str, Any]) -> RunRequest:
        """From `orch run`'s option names (cli.py; tests pass the same keywords), checked."""
        opts = dict(options)
        judging = Judging.from_cli({k: opts.pop(k) for k in CLI_KEYS if k in opts})
        memory = MemoryOptions.parse(
            opts.pop("workers_per_gpu", "auto"), opts.pop("gpu_memory_utilization", 0.9), opts.pop("gpu_memory", None)
        )
        resume = opts.pop("resume_run", None)
        fields = {f.name for f in dataclasses.fields(cls)} - {"memory", "judging", "resume_id"}
        unknown = set(opts) - fields
        if unknown:
            raise TypeError(f"unknown run options: {', '.join(sorted(unknown))}")
        req = cls(**opts, resume_id=_resume_id(resume), memory=memory, judging=judging)
        req.check()
        return req

    def check(self) -> None:
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InputError(f"--timeout must be > 0, got {self.timeout_s}")
        if self.max_gpus is not None and self.max_gpus < 1:
            raise InputError(f"--max-gpus must be >= 1, got {self.max_gpus}")
        if self.precompile_jobs is not None and self.precompile_jobs < 0:
            raise InputError(f"--precompile-jobs must be >= 0, got {self.precompile_jobs}")
        if self.matrix is None and self.resume_id is None:
            raise InputError("give the MATRIX to run (or --resume RUN_ID to finish a run with its own matrix)")


def _resume_id(resume_run: Any) -> int | None:
    if resume_run is None:
        return None
    try:
        return int(resume_run)
    except (TypeError, ValueError):
        raise InputError(f"--resume must be a run id, got {resume_run!r}") from None
