"""Bug class: a KV write that also lands outside the step's slots on every run, eager included
(a wrong slot computed from the block table, not only on padded rows: vLLM's eager path writes the
same way its graphs do). Here each write also copies the first token's K/V into slot 0 of the
cache, which no step's real tokens own (the first block of every shuffled table is past it)."""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl


class StrayWriteImpl(TorchImpl):
    def write(self, kv_cache, key, value, metadata, k_scale, v_scale) -> None:
        super().write(kv_cache, key, value, metadata, k_scale, v_scale)
        if metadata.slot_mapping.numel():
            # slot 0 gets the first token's K/V, shifted so that its bytes differ from any real row's
            slot0 = torch.zeros_like(metadata.slot_mapping[:1])
            super().write(kv_cache, key[:1] + 1, value[:1] + 1, _Slots(slot0), k_scale, v_scale)


class _Slots:
    """Metadata with only a slot mapping: what TorchImpl.write reads."""

    def __init__(self, slot_mapping: torch.Tensor):
        self.slot_mapping = slot_mapping


class Backend(TorchBackend):
    name = "mutant-stray-write-every-run"
    impl_cls = StrayWriteImpl
