"""orch: a distributed test-matrix orchestrator for graph-captured attention backends."""

__version__ = "0.1.0"
