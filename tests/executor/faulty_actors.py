"""Worker actors whose tp gang cannot come up, on purpose (tests/executor/test_gang_setup.py):
one rank's actor fails in its constructor, or the process group cannot initialise."""

from __future__ import annotations

from orchestrator.executor.actors import CaseWorker


class Rank1CannotStart(CaseWorker):
    def __init__(self, *, label: str, **kw):
        if label.endswith("r1"):
            raise RuntimeError("rank 1 cannot start: no device memory")
        super().__init__(label=label, **kw)


class ProcessGroupCannotInit(CaseWorker):
    def setup_gang(self, rank, world_size, master_addr, master_port, timeout_s):
        raise RuntimeError(f"process group cannot initialise: connect to {master_addr}:{master_port} refused")
