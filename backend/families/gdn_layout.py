"""The layout of hybrid_gdn's GatedDeltaNet layers, shared by the family (hybrid_gdn.py) and its
StepState (gdn_state.py): which layers are GDN, each one's state dtype and state page, a rank's
conv channels, and the KV-cache groups (one per state dtype, then the attention layers')."""

from __future__ import annotations

import torch

from backend.attention.gdn import GDNDims, StatePage
from backend.families.contract import KVCacheGroup
from backend.families.specs import is_attention_layer

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def gdn_layers(shape) -> tuple[int, ...]:
    return tuple(i for i in range(shape.num_layers) if not is_attention_layer(shape, i))


def layer_state_dtype(shape, layer: int) -> str:
    """The recurrent state's dtype of a GDN layer (mixed: float32 on the even GDN layers)."""
    choice = dict(shape.dims)["state_dtype"]
    if choice != "mixed":
        return choice
    return "float32" if gdn_layers(shape).index(layer) % 2 == 0 else "bfloat16"


def is_state_page(cache: torch.Tensor) -> bool:
    """A GDN layer's cache: a byte tensor [num_slots, page_bytes] (a KV cache has 4 or 5 dims)."""
    return cache.dim() == 2 and cache.dtype == torch.uint8


def state_page(config, shape, layer: int) -> StatePage:
    return StatePage(GDNDims.of(config), config.dtype, STATE_DTYPES[layer_state_dtype(shape, layer)])


def rank_heads(layout, shape) -> tuple[range, range]:
    """The rank's GDN key heads and value heads (value heads: the q heads of the attention layers)."""
    hk = dict(shape.dims)["num_k_heads"] // layout.tp
    return range(layout.rank * hk, (layout.rank + 1) * hk), layout.q_heads


def conv_channels(layout, shape) -> torch.Tensor:
    """The rank's conv channels of the full [q | k | v] layout, in the rank's [q | k | v] order."""
    dims = dict(shape.dims)
    dk, dv, hk_all = dims["head_k_dim"], shape.head_size, dims["num_k_heads"]
    kh, vh = rank_heads(layout, shape)
    q = torch.arange(kh.start * dk, kh.stop * dk)
    return torch.cat([q, q + hk_all * dk, 2 * hk_all * dk + torch.arange(vh.start * dv, vh.stop * dv)])


def kv_cache_groups(shape) -> tuple[KVCacheGroup, ...]:
    """The model's KV-cache groups in first-layer order, as vLLM builds them: a state group per
    state dtype, then the attention layers' group."""
    state = gdn_layers(shape)
    kinds = list(dict.fromkeys(layer_state_dtype(shape, i) for i in state))  # first-layer order
    groups = [
        KVCacheGroup(f"state_{k}", tuple(i for i in state if layer_state_dtype(shape, i) == k), kind="state")
        for k in kinds
    ]
    attention = tuple(i for i in range(shape.num_layers) if is_attention_layer(shape, i))
    return (*groups, KVCacheGroup("full", attention))
