"""Bug class (mla_sparse): a top-k size hard-coded in a graph buffer (ROCm ATOM #1591: index_topk
1024 in the CUDA-graph buffers while the model uses 512, visible only past ~2K tokens).

Here the persistent top-k buffer (the one every graph captures) is sized for twice the model's
top-k and the top-k fills its width: a token attends up to 2 x index_topk keys, which changes the
output only where a context is longer than index_topk. The contract check sees the buffer's width
in every case, short contexts included.
"""

from __future__ import annotations

import torch

from backend.providers.torch_mla_sparse import TorchSparseMLABackend, TorchSparseMLAImpl

HARD_CODED = 2  # x index_topk: the test model's stand-in for 1024 against 512


class Impl(TorchSparseMLAImpl):
    def __init__(self, config):
        super().__init__(config)
        self.topk_indices = torch.full(
            (config.max_num_tokens, HARD_CODED * self.index.index_topk), -1, dtype=torch.int32, device=config.device
        )


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-hardcoded-topk"
    impl_cls = Impl
