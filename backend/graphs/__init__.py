"""Graph runners: real CUDA/HIP graphs (cuda.py) and the CPU emulation (emulated.py)."""

from backend.graphs.base import CapturedGraph, GraphCaptureError, GraphRunner, is_capturing
from backend.graphs.select import make_graph_runner

__all__ = ["CapturedGraph", "GraphCaptureError", "GraphRunner", "is_capturing", "make_graph_runner"]
