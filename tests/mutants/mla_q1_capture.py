"""Bug class (MLA, spec decode): decode graphs captured as one token a request while verify
batches of q = 1 + k replay them (vLLM #21505).

The builder captures every decode graph on q = 1 (num_tokens requests of one token), and the
decode kernel, like TritonMLA's forward_mqa, derives each row's request and causal extent from
the host query len num_decode_tokens // num_decodes (1 at capture, frozen): at replay a verify
batch's rows are read as one request each. Eager (q = 1 + k from the step's own split) is right,
and so is k = 0. The replay check fails for k > 0 decode graphs.
"""

from __future__ import annotations

import torch

from backend.attention.mla import MLAMetadataBuilder
from backend.providers.torch_backend import gather_length
from backend.providers.torch_mla import TorchMLABackend, TorchMLAImpl
from backend.providers.torch_ops import token_chunks


class Builder(MLAMetadataBuilder):
    def build_for_capture(self, num_tokens, uniform_query_len=0, style="v2"):
        return super().build_for_capture(num_tokens, 1 if uniform_query_len > 0 else 0, style)


class Impl(TorchMLAImpl):
    def decode(self, qq, kv_cache, md, k_scale):
        n = md.num_decode_tokens
        q = max(n // max(md.num_decodes, 1), 1)  # host: one query len for the block
        rows = torch.arange(n, device=qq.device)
        req, pos = rows // q, rows % q
        seq = md.seq_lens.to(torch.int64)[req.clamp(max=md.seq_lens.shape[0] - 1)]
        limit = seq - q + pos
        length = gather_length(md, kv_cache.shape[1])
        keys = torch.arange(length, device=qq.device)
        lat = self.dims.kv_lora_rank
        out = torch.zeros(n, qq.shape[1], lat, dtype=torch.float32, device=qq.device)
        from backend.providers.mla_ops import gather_latent

        for chunk in token_chunks(n, length * qq.shape[2] * 8 + qq.shape[1] * length * 12):
            r = gather_latent(
                kv_cache, md.block_table[req[chunk].clamp(max=md.block_table.shape[0] - 1)], length, k_scale
            )
            s = torch.matmul(qq[chunk].float() * self.config.scale, r.transpose(1, 2))
            mask = (keys[None, :] <= limit[chunk, None]) & (keys[None, :] < seq[chunk, None])
            s.masked_fill_(~mask[:, None, :], float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
            out[chunk] = torch.matmul(p, r[..., :lat])
        return out


class Backend(TorchMLABackend):
    name = "mutant-mla-q1-capture"
    builder_cls = Builder
    impl_cls = Impl
