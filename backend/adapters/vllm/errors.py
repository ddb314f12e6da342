"""Lookup errors, shared by both interfaces: every way a `vllm:NAME` cannot be used here is one line
starting `unavailable:` (a skip with the reason, as for the builtin providers), never a traceback;
and vLLM's import noise kept off stderr, where `orch doctor` and every bad-input message promise
one line."""

from __future__ import annotations

import contextlib
import logging
import os


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def vllm_import_failed(exc: BaseException) -> str:
    return f"unavailable: vllm does not import: {one_line(exc)}"


def no_such_backend(name: str, release: str | None = None) -> str:
    where = f" {release}" if release else ""
    return f"unavailable: vLLM{where} has no attention backend {name!r}"


def backend_import_failed(name: str, exc: BaseException) -> str:
    return f"unavailable: vllm backend {name} does not import here: {one_line(exc)}"


def no_support_attribute(name: str, attribute: str) -> str:
    """A builder that does not state its support level: never read as NEVER (that would hide a
    backend's FULL graphs behind a silent downgrade)."""
    return f"unavailable: vllm backend {name}'s metadata builder has no {attribute} attribute"


@contextlib.contextmanager
def quiet_vllm_import():
    """vLLM logs a warning per compiled module it cannot load ("Failed to import from vllm._C")
    and torch one for a missing Triton, on stderr. vLLM's logger, where nothing configured it (no
    handler, no level: Python's last-resort handler would print its warnings), is set to ERROR for
    the process; VLLM_LOGGING_LEVEL too, unless the user set it (read when vLLM configures its
    logging). torch's Triton notice is raised to ERROR for the import."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    vlog = logging.getLogger("vllm")
    if not vlog.handlers and vlog.level == logging.NOTSET:
        vlog.setLevel(logging.ERROR)
    log = logging.getLogger("torch._library.triton")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
