"""Adapters that put a third party's own attention backend behind our interface, unchanged, so the
checker, the graph modes, the reference and the reports test their code, not a re-implementation.
Each adapter is the only module that imports its third party."""
