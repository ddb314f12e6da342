"""orch: a distributed test-matrix orchestrator for graph-captured attention backends."""

from backend import __version__  # noqa: F401  (one place: backend/__init__.py)
