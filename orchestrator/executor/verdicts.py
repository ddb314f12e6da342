"""What the executor makes of a result: whether it leaves the worker unusable, how a retry's
verdict combines with the first attempt's, and which outcomes are retried at all. Pure functions
over CaseResults (no Ray)."""

from __future__ import annotations

import enum
import re

from backend.result import CaseResult, Status


class ErrorKind(str, enum.Enum):
    """CaseResult.error_kind values (stored as their plain string: `.value`)."""

    CAPTURE = "capture"  # raised between graph capture begin and end (the worker's runner)
    EXCEPTION = "exception"  # any other exception in the case (the worker's runner)
    OOM = "oom"  # out of device memory even alone (backend/harness/memory.py)
    CRASH = "crash"  # the worker process died under the case
    TIMEOUT = "timeout"  # no result by the deadline: the worker was killed
    PLACEMENT = "placement"  # no gang of its tp could be placed (SKIP: never can here; NOT_RUN)
    GANG = "gang"  # its gang twice failed to come up or fell out of step: NOT_RUN


# Text of an exception that leaves the device (and so the process) unusable: recycle the actor.
DEVICE_POISON = re.compile(
    r"CUDA error|HIP error|illegal memory access|device-side assert|cudaError|hipError|NCCL error|ECC error",
    re.IGNORECASE,
)
# Faults that stay with the context once raised, even when they surface inside a capture (a capture
# error whose cause is one of these still recycles the worker; a plain capture error does not).
# Phrased as the CUDA/HIP error strings are, not as words: every torch CUDA error ends with the
# hint "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions", which must not make a
# cudaErrorStreamCaptureUnsupported (AITER pa_decode's k_scale.item() under capture) sticky, which
# would recycle the worker, and rebuild its sessions, after every such capture error.
STICKY_FAULT = re.compile(
    r"illegal memory access|device-side assert triggered|ECC error|uncorrectable ECC|unspecified launch failure"
    r"|misaligned address|illegal instruction|hipErrorIllegalAddress|cudaErrorIllegalAddress|cudaErrorLaunchFailure"
    r"|cudaErrorAssert|hipErrorAssert",
    re.IGNORECASE,
)
# torch's fixed advice lines after a CUDA error: not evidence of anything.
_TORCH_HINTS = re.compile(
    r"^.*(TORCH_USE_CUDA_DSA|CUDA_LAUNCH_BLOCKING|AMD_SERIALIZE_KERNEL|HIP_LAUNCH_BLOCKING"
    r"|might be asynchronously reported).*$",
    re.MULTILINE,
)
# UNVERIFIABLE is not retried: another CPU worker's emulation cannot follow the same graphs any
# better; a GPU decides.
RETRY_STATUSES = (Status.FAIL, Status.ERROR, Status.TIMEOUT)
# A failed graph capture is a property of the code under test (a host sync, an unsupported call),
# the same on every attempt: it is reported once, not retried. (Crashes, hangs and numeric
# failures are retried: those can come from the machine.)
NO_RETRY_KINDS = (ErrorKind.CAPTURE.value,)
# A case that ran out of device memory (backend/harness/memory.py). A tp 1 worker already reran it
# alone on a cleared state before reporting it: final. A gang's ranks cannot rerun alone, and a
# worker that could not give its memory back (memory["unreleased"]) is no clean state: the executor
# recycles it and reruns the case once on a fresh worker or gang.
OOM_KIND = ErrorKind.OOM.value
NODE_DEATH = re.compile(r"its node has died|NodeDiedError|node was terminated", re.IGNORECASE)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")


def first_line(e: BaseException | str) -> str:
    """One line for a reason: Ray's first line without its colour codes and process details
    (pid, ip, actor id, repr), plus the cause where Ray carries a traceback (an actor whose
    constructor raised: "... creation task: RuntimeError: ...")."""
    lines = [ln for ln in _ANSI.sub("", str(e)).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    head = re.sub(r",?\s*ray::\S+\s*\(pid=.*$|\s*\(pid=.*$", "", lines[0]).rstrip(" ,")
    cause = lines[-1].strip()
    if len(lines) > 1 and _EXC_LINE.match(cause):
        return f"{head}: {cause}"
    return head


def poisons_worker(res: CaseResult) -> bool:
    """An ERROR whose text says the device (so the process) is unusable: recycle the worker. A
    capture error names cudaError* too but is not sticky (the runner recovers, the session is
    kept; recycling would lose every captured graph for nothing), unless its cause is a sticky
    fault (STICKY_FAULT)."""
    if res.status != Status.ERROR:
        return False
    if res.error_kind == OOM_KIND:  # only a worker that could not give its memory back
        return bool(res.memory.get("unreleased"))
    text = _TORCH_HINTS.sub("", f"{res.reason}\n{res.log_tail}")
    return bool(STICKY_FAULT.search(text) if res.error_kind == ErrorKind.CAPTURE else DEVICE_POISON.search(text))


def retried(res: CaseResult, tp: int) -> bool:
    """Whether a first attempt runs once more on another worker."""
    if res.status not in RETRY_STATUSES or res.error_kind in NO_RETRY_KINDS:
        return False
    return res.error_kind != OOM_KIND or tp > 1 or bool(res.memory.get("unreleased"))


def two_attempts(first: CaseResult, res: CaseResult) -> CaseResult:
    """The final verdict of a case that ran twice. FLAKY means one attempt passed and one did not;
    two different non-pass verdicts (FAIL then ERROR) stay a failure (the retry's status, if it
    failed), both named in the reason. An attempt that ran out of memory observed nothing of the
    backend: the other attempt's verdict is the case's (never FLAKY for the harness's memory)."""
    both = f"{first.status} on {first.worker} ({first.reason}), then {res.status} on {res.worker}" + (
        f" ({res.reason})" if res.reason else ""
    )
    if (first.error_kind == OOM_KIND) != (res.error_kind == OOM_KIND):
        seen = res if first.error_kind == OOM_KIND else first
        note = f"the other attempt ran out of device memory: {both}"
        return seen.replace(attempts=2, log_tail=(note + "\n" + seen.log_tail).strip())
    if first.status == res.status:
        return res.replace(attempts=2)
    if Status.PASS in (first.status, res.status):
        return res.replace(status=Status.FLAKY, attempts=2, reason=f"retry disagreed: {both}")
    status = res.status if res.status in RETRY_STATUSES else first.status
    return res.replace(status=status, attempts=2, reason=f"failed twice: {both}")
