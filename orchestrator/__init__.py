"""orch: a distributed test-matrix orchestrator for graph-captured attention backends."""

from backend import __version__ as __version__  # re-exported; one place: backend/__init__.py
