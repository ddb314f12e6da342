"""orchestrator/executor/verdicts.py as a table: a retry's verdict, device faults that recycle a
worker, the one-line reason of a Ray error. No Ray: the functions are pure."""

from __future__ import annotations

import pytest

from backend.result import CaseResult, Status
from orchestrator.executor.verdicts import first_line, poisons_worker, retried, two_attempts

P, F, E, T = Status.PASS, Status.FAIL, Status.ERROR, Status.TIMEOUT


def _r(status, reason="", worker="w", kind="", log=""):
    return CaseResult("c", status, reason=reason, worker=worker, error_kind=kind, log_tail=log)


# What torch prints after every CUDA error (seen on the H200 after AITER pa_decode's
# k_scale.item() inside a capture): the DSA hint names device-side assertions.
TORCH_CUDA_TAIL = """torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing
Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


@pytest.mark.parametrize(
    "first, retry, want, reason_starts",
    [
        (F, F, F, ""),
        (F, P, Status.FLAKY, "retry disagreed"),
        (E, P, Status.FLAKY, "retry disagreed"),
        (F, E, E, "failed twice"),  # FAIL then a crash of another kind: a failure, not FLAKY
        (E, F, F, "failed twice"),
        (T, E, E, "failed twice"),
    ],
)
def test_two_attempts(first, retry, want, reason_starts):
    got = two_attempts(_r(first, "a", "w1"), _r(retry, "b", "w2"))
    assert got.status == want and got.attempts == 2
    assert got.reason.startswith(reason_starts) if reason_starts else got.reason == "b"


OOM = "oom"


@pytest.mark.parametrize(
    "first, retry, want, want_kind",
    [
        # An attempt that ran out of device memory observed nothing of the backend: the
        # other attempt's verdict is the case's, never FLAKY.
        ((E, OOM), (P, ""), P, ""),
        ((E, OOM), (F, ""), F, ""),
        ((F, ""), (E, OOM), F, ""),
        ((E, OOM), (E, OOM), E, OOM),
    ],
)
def test_two_attempts_with_an_out_of_memory(first, retry, want, want_kind):
    got = two_attempts(_r(first[0], "a", "w1", kind=first[1]), _r(retry[0], "b", "w2", kind=retry[1]))
    assert got.status == want and got.error_kind == want_kind and got.attempts == 2
    assert got.status != Status.FLAKY


@pytest.mark.parametrize(
    "res, tp, want",
    [
        (_r(F), 1, True),
        (_r(E, kind="capture"), 1, False),  # deterministic: reported once
        (_r(E, kind=OOM), 1, False),  # the worker already reran it alone
        (_r(E, kind=OOM), 2, True),  # a gang's ranks could not: a fresh gang reruns it
        (_r(E, kind=OOM).replace(memory={"unreleased": 9 << 30}), 1, True),  # the worker kept its memory: a fresh one
        (_r(P), 1, False),
    ],
)
def test_which_first_attempts_are_retried(res, tp, want):
    assert retried(res, tp) is want


@pytest.mark.parametrize(
    "res, poisons",
    [
        (_r(E, "OutOfMemoryError: CUDA out of memory", kind=OOM), False),  # rerun in the worker, which stays
        (_r(E, "OutOfMemoryError: CUDA out of memory", kind=OOM).replace(memory={"unreleased": 9 << 30}), True),
        (_r(E, "RuntimeError: CUDA error: an illegal memory access"), True),
        (_r(E, "capture failed: cudaErrorStreamCaptureInvalidated", kind="capture"), False),  # not sticky
        (_r(E, "capture failed: an illegal memory access was encountered", kind="capture"), True),
        (
            _r(
                E,
                "capture error: FULL size 64: CUDA error: operation not permitted when stream is capturing",
                kind="capture",
                log=TORCH_CUDA_TAIL,
            ),
            False,
        ),  # torch's DSA hint is not a device-side assert
        (
            _r(E, "capture failed", kind="capture", log="CUDA error: device-side assert triggered\n" + TORCH_CUDA_TAIL),
            True,
        ),
        (_r(E, "RuntimeError: CUDA error: unspecified launch failure", log=TORCH_CUDA_TAIL), True),
        (_r(F, "CUDA error in the reason of a failed check"), False),  # only errors recycle
        (_r(E, "ValueError: shapes"), False),
    ],
)
def test_poisons_worker(res, poisons):
    assert poisons_worker(res) is poisons


@pytest.mark.parametrize(
    "text, want",
    [
        (
            "The actor died because of an error raised in its creation task, \x1b[36mray::W.__init__()\x1b[39m "
            '(pid=1, ip=1.2.3.4, actor_id=ab, repr=<W>)\n  File "x.py", line 1\nRuntimeError: rank 1 cannot start',
            "The actor died because of an error raised in its creation task: RuntimeError: rank 1 cannot start",
        ),
        (
            "The actor died unexpectedly before finishing this task.\n\tclass_name: W",
            "The actor died unexpectedly before finishing this task.",
        ),
        ("plain one line", "plain one line"),
    ],
)
def test_first_line(text, want):
    assert first_line(text) == want
