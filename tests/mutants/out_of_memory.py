"""Not a bug of the backend: the harness's own device memory running out inside a case.

On an 80 GB H100 the families' tp 1 slice ran out of memory ~170 times because the worker had
cached too many sessions, and the gate reported it as the backends' failures and flakes. These
backends raise the allocator's own error (torch.OutOfMemoryError, what CUDA raises) from inside
the attention op, so the path runs on a CPU worker exactly as on a GPU:

- OnceBackend: out of memory on the first forward of the process only (the worker's cached
  sessions were the problem): the checker clears the worker and reruns the case, which passes.
- AlwaysBackend: out of memory on every forward: the case does not fit even alone (ERROR kind
  `oom`, an infrastructure outcome: never FAIL, never FLAKY).
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl

_RAISED = {"done": False}  # per process: a worker's first forward


def _oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB (injected by tests/mutants/out_of_memory.py)"
    )


class OnceImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        if not _RAISED["done"]:
            _RAISED["done"] = True
            raise _oom()
        return super().attend(query, kv_cache, metadata, k_scale, v_scale, output)


class AlwaysImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        raise _oom()


class OnceBackend(TorchBackend):
    name = "mutant-oom-once"
    impl_cls = OnceImpl


class AlwaysBackend(TorchBackend):
    name = "mutant-oom-always"
    impl_cls = AlwaysImpl
