"""Attention backends broken on purpose, one per bug class of DESIGN.md §6.

Each is a small subclass of the correct `torch` provider, loaded by import path
(`tests.mutants.<module>:<Class>`) through backend.attention.registry.get_backend, exactly like
a user plugin. tests/checker/test_mutants.py states, per mutant, where the checker must flag it
(mode, kv dtype, batch kind, tp) and with which status and check, and where it must stay green.
"""
