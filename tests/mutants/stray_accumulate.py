"""Bug class: a read-modify-write that lands outside the step's slots on every run (an accumulate
into a wrong slot): each KV write also adds one to the first bytes of request 0's first context
slot, which the step's attention then reads. Two runs from the same state read the same bytes; a
run after another that was not undone reads them moved again, so its output differs."""

from __future__ import annotations

from backend.harness.checks import raw
from backend.providers.torch_backend import TorchBackend, TorchImpl


class StrayAccumulateImpl(TorchImpl):
    def write(self, kv_cache, key, value, metadata, k_scale, v_scale) -> None:
        super().write(kv_cache, key, value, metadata, k_scale, v_scale)
        if metadata.slot_mapping.numel():
            block = metadata.block_table[0, 0].long()  # request 0's first block: context it reads
            keys = raw(kv_cache[0])  # [blocks, block_size, heads, head_size] as integers
            keys[block, 0, :, :4] += 1


class Backend(TorchBackend):
    name = "mutant-stray-accumulate"
    impl_cls = StrayAccumulateImpl
