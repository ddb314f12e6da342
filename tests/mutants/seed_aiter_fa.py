"""The seed bug as it was (vLLM 0.10.2 ROCM_AITER_FA after #22721; DESIGN.md §4a).

Written by us from the published structure of that backend, not copied, and held to the released
code (docs/VLLM.md "The seed, replayed": `vllm:ROCM_AITER_FA` under 0.10.2 is red in exactly the
cells this model is):
- it declares ALWAYS, so FULL mixed graphs are captured;
- Impl.forward branches in Python on metadata.max_query_len > 1;
- the builder's build() makes the prefill branch's metadata per step: a fresh `cu_seq_lens`
  tensor (not a persistent buffer), the number of K/V tokens from `.item()`, and gather buffers
  sized num_reqs x max_model_len;
- on the prefill branch two kernels run, as in vLLM's forward: the varlen prefill kernel for the
  rows of requests with query len > 1 (min_seqlen_q=1 skips the others), reading K/V lengths from
  `cu_seq_lens`, then the paged decode kernel for the rows of query len 1 (it returns early for
  the others), reading the persistent seq_lens.
Because vLLM captures a mixed graph of N tokens with host max_query_len = N, every FULL mixed
graph of N > 1 tokens is captured on the prefill branch: its replays read the capture-time
`cu_seq_lens` (the dummy batch's), not the step's, so the prefill rows are wrong. The decode rows
of the same replay read live buffers and are right, as is the decode branch (q = 1 graphs).

`Backend` is red in FULL on batches with prefill rows, on those rows (a pure decode batch that
FULL replays through a mixed graph is right: its rows all take the decode kernel). `FixedBackend`
is the same code at UNIFORM_SINGLE_TOKEN_DECODE, as #25104 (vLLM 0.11.0) lowered it: FULL
resolves to FULL_AND_PIECEWISE, mixed batches run attention eagerly, and it is green everywhere.

Until the released code was run through orch, the model's prefill branch attended every
row with the per-step lengths, so its decode rows were wrong too and FULL decode batches were red:
vLLM 0.10.2 is green there (docs/VLLM.md "Where the model differed").
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import AttentionCGSupport, AttentionMetadata
from backend.providers.torch_backend import TorchBackend, TorchImpl, paged_causal_attention
from tests.mutants._common import token_query_len


@dataclass
class SeedMetadata(AttentionMetadata):
    cu_seq_lens: torch.Tensor | None = None  # [num_reqs + 1] int32, allocated per build
    num_actual_kv_tokens: int = 0  # host, from .item()


class SeedBuilder(PersistentMetadataBuilder):
    def _prefill_extras(self, md: AttentionMetadata) -> SeedMetadata:
        out = SeedMetadata(**{f.name: getattr(md, f.name) for f in fields(AttentionMetadata)})
        if md.max_query_len > 1:
            # Fresh every step (the bug): a graph holds the capture-time tensor.
            cu = torch.zeros(md.num_padded_reqs + 1, dtype=torch.int32, device=md.seq_lens.device)
            torch.cumsum(md.seq_lens, 0, out=cu[1:])
            out.cu_seq_lens = cu
            out.num_actual_kv_tokens = int(cu[-1].item())  # build() runs outside the graph: allowed
        return out

    def build(self, batch, num_padded_tokens=None, num_padded_reqs=None):
        return self._prefill_extras(super().build(batch, num_padded_tokens, num_padded_reqs))

    def build_for_capture(self, num_tokens, uniform_query_len=0, style="v2"):
        return self._prefill_extras(super().build_for_capture(num_tokens, uniform_query_len, style))


class SeedImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if metadata.max_query_len <= 1 or metadata.cu_seq_lens is None:  # host branch
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        # Gather buffer sized num_reqs x max_model_len (the 0.10.2 sizing that blew up memory).
        c = self.config
        workspace = torch.empty(
            metadata.num_padded_reqs * c.max_model_len,
            c.num_kv_heads,
            c.head_size,
            dtype=torch.float32,
            device=query.device,
        )
        workspace.zero_()
        t = metadata.num_padded_tokens
        # The varlen prefill kernel: per-request K/V lengths from the per-step cu_seq_lens.
        md = SeedMetadata(**{f.name: getattr(metadata, f.name) for f in fields(AttentionMetadata)})
        md.seq_lens = (metadata.cu_seq_lens[1:] - metadata.cu_seq_lens[:-1]).to(metadata.seq_lens.dtype)
        prefill = paged_causal_attention(query[:t], kv_cache[0], kv_cache[1], md, k_scale, v_scale, c.scale)
        # The paged decode kernel: the persistent buffers. Each row keeps the kernel that writes it
        # (by its request's query len, read live from the device metadata).
        decode = paged_causal_attention(query[:t], kv_cache[0], kv_cache[1], metadata, k_scale, v_scale, c.scale)
        rows = (token_query_len(metadata, t) > 1)[:, None, None]
        output[:t].copy_(torch.where(rows, prefill, decode).to(output.dtype))
        return output


class Backend(TorchBackend):
    name = "mutant-seed-aiter-fa"
    cudagraph_support = AttentionCGSupport.ALWAYS
    builder_cls = SeedBuilder
    impl_cls = SeedImpl


class FixedBackend(Backend):
    name = "mutant-seed-aiter-fa-fixed"
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
