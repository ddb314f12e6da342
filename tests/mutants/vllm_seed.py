"""The seed's own code with its one bug taken out, to show that the bug is what turns it red:
vLLM 0.10.2's ROCM_AITER_FA (`vllm:ROCM_AITER_FA` under ORCH_VLLM=0.10.2, backend/adapters/vllm/old.py)
with the prefill branch's `cu_seq_lens` written into a persistent buffer, instead of the fresh
tensor its build() allocates every step (#22721's structure; DESIGN.md §4a). Everything else is
vLLM's: the builder's other fields, the Impl, its branch on max_query_len, the kernels' arguments.

    ORCH_VLLM=0.10.2 orch run matrices/seed.yaml --backend tests.mutants.vllm_seed:CuSeqLensPersistent

A FULL mixed graph then reads each step's K/V lengths at replay: green where the released code is
red. (num_actual_kv_tokens, which sizes the gather, stays the capture's: num_reqs x max_model_len
under capture_style v1, an upper bound of every replay.) Under 0.11.0 it is as green as the base.
"""

from __future__ import annotations

import torch

from backend.attention.registry import get_backend

_AITER_FA = get_backend("vllm:ROCM_AITER_FA")


class _PersistentCuSeqLensBuilder(_AITER_FA.builder_cls):
    def __init__(self, config):
        super().__init__(config)
        self.cu_seq_lens = torch.zeros(config.max_num_seqs + 1, dtype=torch.int32, device=config.device)

    def _wrap(self, md, capture):
        out = super()._wrap(md, capture)
        fresh = getattr(out.vllm, "cu_seq_lens", None)
        if fresh is not None:  # the prefill branch's metadata: into the persistent buffer
            n = fresh.shape[0]
            self.cu_seq_lens[:n].copy_(fresh)
            self.cu_seq_lens[n:].copy_(fresh[-1:].expand(self.cu_seq_lens.shape[0] - n))  # padded requests: no keys
            out.vllm.cu_seq_lens = self.cu_seq_lens[:n]
        return out


class CuSeqLensPersistent(_AITER_FA):
    name = "control-vllm:ROCM_AITER_FA-cu_seq_lens-persistent"
    builder_cls = _PersistentCuSeqLensBuilder
