"""Bug class: a builder that declares padding values its own writes do not use (vLLM lets a builder
declare `cg_pad_seq_lens` / `cg_pad_block_table`, #35969 / tests/v1/attention/test_cg_padding.py:
FlashMLA with an fp8 cache declares seq_len 1 because its kernel cannot take 0).

`Backend` declares seq_len 1 for padded requests and its kernel relies on it (it normalises each row
by seq_len / seq_len: 0/0 where a padded request has seq_len 0), but its builder pads with 0 after
the runner's value. Real rows are right; a FULL graph's padded rows are NaN: padded_finite fails
wherever a FULL graph pads. `Honest` declares 1 and pads with what the runner applied: green.
"""

from __future__ import annotations

from backend.attention.builder import PersistentMetadataBuilder
from backend.providers.torch_backend import TorchBackend, TorchImpl
from backend.providers.torch_ops import token_to_request


class _HonestBuilder(PersistentMetadataBuilder):
    cg_pad_seq_lens = 1  # its kernel needs a key for every request


class _ZeroPadBuilder(_HonestBuilder):
    def _write(self, query_lens, seq_lens, *args, **kwargs):
        md = super()._write(query_lens, seq_lens, *args, **kwargs)
        self.seq_lens[len(query_lens) :].fill_(0)  # the declaration, ignored
        return md


class _NeedsOneImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        req, _ = token_to_request(metadata.query_start_loc, t)
        seq = metadata.seq_lens.float()[req.clamp(max=metadata.seq_lens.shape[0] - 1)]
        out[:t].mul_((seq / seq)[:, None, None].to(out.dtype))  # 1 where seq_len >= 1, as declared
        return out


class Backend(TorchBackend):
    name = "mutant-pad-declared"
    builder_cls = _ZeroPadBuilder
    impl_cls = _NeedsOneImpl


class Honest(TorchBackend):
    name = "mutant-pad-declared-honest"
    builder_cls = _HonestBuilder
    impl_cls = _NeedsOneImpl
