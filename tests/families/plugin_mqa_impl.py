"""The out-of-tree mqa family's implementation and its provider (plugin_mqa.py is its spec).

The family is gqa's with its own spec (one kv head: gqa's projections, cache and reference hold);
the provider is orch's torch provider declared for it. A real family writes its own
AttentionFamily (backend/families/contract/family.py lists what the harness asks)."""

from typing import ClassVar

from backend.families.gqa import GQA
from backend.providers.torch_backend import TorchBackend
from tests.families.plugin_mqa import SPEC


class MQA(GQA):
    spec = SPEC


class TorchMQA(TorchBackend):
    name: ClassVar[str] = "torch-mqa"
    family: ClassVar[str] = "mqa"


class TorchMQAOffByOne(TorchMQA):
    """Broken on purpose: the causal mask lets each token see the next position, to show the
    family's reference catches a wrong provider."""

    impl_cls = type(
        "OffByOneImpl",
        (TorchBackend.impl_cls,),
        {
            "attend": lambda self, query, kv_cache, metadata, k_scale, v_scale, output: _attend_off_by_one(
                self, query, kv_cache, metadata, k_scale, v_scale, output
            )
        },
    )


def _attend_off_by_one(impl, query, kv_cache, metadata, k_scale, v_scale, output):
    from backend.providers.torch_backend import paged_causal_attention

    t = metadata.num_padded_tokens
    out = paged_causal_attention(
        query[:t], kv_cache[0], kv_cache[1], metadata, k_scale, v_scale, impl.config.scale, diagonal=1
    )
    output[:t].copy_(out.to(output.dtype))
    return output
