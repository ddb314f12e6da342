"""Kernel providers: implementations of the attention families behind the backend interface."""
