"""The unit under test: a graph-enabled paged attention backend (four roles, several kernel
providers), the graph runners (real CUDA/HIP graphs and CPU emulation), the test model and the
checker. Free of Ray: a case runs the same in a plain process, under pytest or in an actor."""

# orch's version, in one place: pyproject.toml reads it (setuptools dynamic version),
# orchestrator/ re-exports it, and every result records it (harness/environment.py versions), also when the
# worker runs from a source tree on PYTHONPATH with no installed distribution to ask.
__version__ = "0.1.0"
