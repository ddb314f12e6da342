"""Domain errors and the exit codes they map to (the CLI contract).

Anything the user can fix (matrix, CLI, plugin path, impossible combination) is an InputError;
anything about the machinery (cluster unreachable, store unwritable) is an InfraError. The CLI
turns either into one line on stderr and its exit code, never a traceback.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # gate passed
    GATE_FAILED = 1  # a required case failed or regressed
    INPUT_ERROR = 2  # bad input or usage
    INFRA_ERROR = 3  # cluster unreachable, placement impossible, store unwritable
    # 128 + the signal number, as shells and CI runners report a process a signal ended.
    INTERRUPTED = 130  # SIGINT (Ctrl-C)
    TERMINATED = 143  # SIGTERM (a CI runner cancelling the job)


class OrchError(Exception):
    exit_code = ExitCode.INPUT_ERROR

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.source = source
        self.line = line

    def one_line(self) -> str:
        where = ""
        if self.source:
            where = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        return (where + self.message).replace("\n", " ")


class InputError(OrchError):
    exit_code = ExitCode.INPUT_ERROR


class InfraError(OrchError):
    exit_code = ExitCode.INFRA_ERROR
