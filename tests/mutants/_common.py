"""Graph-safe helpers the mutants share: per-token request facts from device metadata."""

from __future__ import annotations

import torch

from backend.providers.torch_ops import token_to_request


def token_query_len(metadata, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the query len of each token's request (0 for padded tokens)."""
    req, pos = token_to_request(metadata.query_start_loc, num_tokens)
    qlen = metadata.query_lens.to(torch.int64)[req]
    return torch.where(pos < qlen, qlen, torch.zeros_like(qlen))


def token_last_index(metadata, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the row of the last token of each token's request."""
    req, _ = token_to_request(metadata.query_start_loc, num_tokens)
    last = metadata.query_start_loc.to(torch.int64)[req + 1] - 1
    return last.clamp(min=0, max=max(num_tokens - 1, 0))
