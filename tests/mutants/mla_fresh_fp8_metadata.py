"""Bug class (MLA): fp8 metadata built into a fresh tensor every step instead of a persistent
buffer (vLLM #35175): a FULL graph keeps reading the tensor it was captured with.

Here the fp8 path's decode reads a per-build copy of seq_lens (under V2 capture, the dummy
batch's 1s), so a replayed fp8 decode graph attends to one key per request; auto kv and eager
are right. The replay check fails for fp8 where a FULL decode graph replays.
"""

from __future__ import annotations

import dataclasses

from backend.attention.mla import MLAMetadataBuilder
from backend.providers.torch_mla import TorchMLABackend


class Builder(MLAMetadataBuilder):
    def _write(self, *args, **kwargs):
        md = super()._write(*args, **kwargs)
        if self.config.kv_cache_dtype == "fp8":
            return dataclasses.replace(md, seq_lens=md.seq_lens.clone())  # fresh: not the persistent buffer
        return md


class Backend(TorchMLABackend):
    name = "mutant-mla-fresh-fp8-metadata"
    builder_cls = Builder
