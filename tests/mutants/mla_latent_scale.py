"""Bug class (MLA): the softmax scale taken over the absorbed dot product's 576 dims,
(kv_lora_rank + qk_rope_head_dim)^-0.5, instead of the model's MHA scale (qk_nope + qk_rope)^-0.5
(AITER's op tests use 1/sqrt(576) for convenience; the model does not). Wrong in every mode:
the reference checks fail everywhere.
"""

from __future__ import annotations

import dataclasses

from backend.attention.mla import MLADims
from backend.providers.torch_mla import TorchMLABackend, TorchMLAImpl


class Impl(TorchMLAImpl):
    def __init__(self, config):
        super().__init__(config)
        d = MLADims.of(config)
        self.config = dataclasses.replace(config, scale=(d.kv_lora_rank + d.qk_rope_head_dim) ** -0.5)


class Backend(TorchMLABackend):
    name = "mutant-mla-latent-scale"
    impl_cls = Impl
