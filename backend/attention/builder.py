"""The graph-safe metadata builder shared by every provider (vLLM's CommonAttentionMetadata +
persistent buffers, as in vllm/v1/attention/backends/triton_attn.py).

Buffers are allocated once on config.device, sized for max_num_seqs requests and max_num_tokens
tokens. Every build writes [:n] with `buffer[:n].copy_(cpu)` (never rebinds a buffer: a captured
graph holds the old storage) and resets the whole tail to the padding values, so a request that
existed in an earlier, larger batch cannot leak into a padded row of a later one:
  seq_lens and block-table rows the session's padding pair (`cg_padding`: backend/attention/
  padding.py; this builder declares 0 and the null block 0), query_start_loc repeats its last
  value, slot_mapping -1 (write nothing), query_lens 0.
"""

from __future__ import annotations

import torch

from backend.attention.interface import (
    AttentionConfig,
    AttentionMetadata,
    AttentionMetadataBuilder,
    BatchDescription,
)
from backend.host_copy import copy_into

PAD_SLOT = -1
NULL_BLOCK = 0


class PersistentMetadataBuilder(AttentionMetadataBuilder):
    cg_pad_block_table = NULL_BLOCK  # orch's own padding (DESIGN.md §4); vLLM's base says -1

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        dev, reqs, toks = config.device, config.max_num_seqs, config.max_num_tokens
        self.query_start_loc = torch.zeros(reqs + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(reqs, dtype=torch.int32, device=dev)
        self.query_lens = torch.zeros(reqs, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros(reqs, config.max_blocks_per_seq, dtype=torch.int32, device=dev)
        self.slot_mapping = torch.full((toks,), PAD_SLOT, dtype=torch.int64, device=dev)

    def _check(self, num_reqs: int, num_tokens: int, padded_reqs: int, padded_tokens: int) -> None:
        c = self.config
        if not 0 <= num_reqs <= padded_reqs <= c.max_num_seqs:
            raise ValueError(f"requests {num_reqs} (padded {padded_reqs}) exceed max_num_seqs {c.max_num_seqs}")
        if not 0 <= num_tokens <= padded_tokens <= c.max_num_tokens:
            raise ValueError(f"tokens {num_tokens} (padded {padded_tokens}) exceed max_num_tokens {c.max_num_tokens}")

    def build(
        self, batch: BatchDescription, num_padded_tokens: int | None = None, num_padded_reqs: int | None = None
    ) -> AttentionMetadata:
        n, t = batch.num_reqs, batch.num_tokens
        padded_tokens = t if num_padded_tokens is None else num_padded_tokens
        padded_reqs = n if num_padded_reqs is None else num_padded_reqs
        self._check(n, t, padded_reqs, padded_tokens)
        if max(batch.seq_lens, default=0) > self.config.max_model_len:
            raise ValueError(f"seq_len {max(batch.seq_lens)} exceeds max_model_len {self.config.max_model_len}")
        if batch.slot_mapping.shape[0] != t:
            raise ValueError(f"slot_mapping has {batch.slot_mapping.shape[0]} entries for {t} tokens")
        return self._write(
            batch.query_lens,
            batch.seq_lens,
            batch.block_table,
            batch.slot_mapping,
            padded_tokens,
            padded_reqs,
            for_capture=False,
        )

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> AttentionMetadata:
        """vLLM's capture dummy batch (DESIGN.md §4a), pinned in tests/backend/test_capture_batch.py.

        Requests (V1 gpu_model_runner._dummy_run, V2 cudagraph_utils.capture_graph):
          uniform decode (uniform_query_len q > 0): min(cdiv(N, q), max_num_seqs) requests of q
            tokens (the last takes N % q when q does not divide N), host max_query_len = q;
          mixed (q = 0): N tokens over min(N, max_num_seqs) requests (the last takes the
            remainder), host max_query_len = N ("mixed graphs can replay a single prefill
            spanning the entire batch"), so a backend branching on max_query_len > 1 is captured
            on its prefill branch whenever N > 1.
        seq_lens: v1 every request max_model_len over valid (non-null) blocks; v2 device seq_lens
        = each request's query len, host max_seq_len = max_model_len, block-table rows on the null
        block. Slots are -1: capture must not write the cache the checker later compares."""
        c = self.config
        query_lens, seq_lens, block_table, slots, host_max_query_len = capture_batch(
            c, num_tokens, uniform_query_len, style
        )
        n = len(query_lens)
        self._check(n, num_tokens, n, num_tokens)
        md = self._write(query_lens, seq_lens, block_table, slots, num_tokens, n, for_capture=True)
        md.max_query_len = host_max_query_len
        md.max_seq_len = c.max_model_len
        return md

    def _write(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        padded_tokens: int,
        padded_reqs: int,
        for_capture: bool,
    ) -> AttentionMetadata:
        n, t = len(query_lens), int(sum(query_lens))
        qlens = torch.tensor(query_lens, dtype=torch.int32)
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum(qlens, 0, out=qsl[1:])
        # Host -> device copies into the persistent storage (queued, no host sync on a GPU);
        # tails reset to padding.
        copy_into(self.query_start_loc[: n + 1], qsl)
        self.query_start_loc[n + 1 :].fill_(t)
        copy_into(self.seq_lens[:n], torch.tensor(seq_lens, dtype=torch.int32))
        pad_seq_len, pad_block = self.cg_padding
        self.seq_lens[n:].fill_(pad_seq_len)
        copy_into(self.query_lens[:n], qlens)
        self.query_lens[n:].fill_(0)
        width = min(block_table.shape[1], self.block_table.shape[1]) if n else 0
        self.block_table[n:].fill_(pad_block)
        if n:
            copy_into(self.block_table[:n, :width], block_table[:n, :width].to(torch.int32))
            self.block_table[:n, width:].fill_(NULL_BLOCK)
        copy_into(self.slot_mapping[:t], slot_mapping.to(torch.int64))
        self.slot_mapping[t:].fill_(PAD_SLOT)
        return AttentionMetadata(
            num_actual_tokens=t,
            num_reqs=n,
            num_padded_tokens=padded_tokens,
            num_padded_reqs=padded_reqs,
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            query_start_loc=self.query_start_loc[: padded_reqs + 1],
            seq_lens=self.seq_lens[:padded_reqs],
            block_table=self.block_table[:padded_reqs],
            slot_mapping=self.slot_mapping[:padded_tokens],
            query_lens=self.query_lens[:padded_reqs],
            for_capture=for_capture,
        )


def capture_batch(
    c: AttentionConfig, num_tokens: int, uniform_query_len: int = 0, style: str = "v2"
) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor, int]:
    """vLLM's capture dummy batch (PersistentMetadataBuilder.build_for_capture says which):
    (query_lens, seq_lens, block_table, slot_mapping of -1s, host max_query_len)."""
    if style not in ("v1", "v2"):
        raise ValueError(f"capture style {style!r} is not v1 or v2")
    if uniform_query_len > 0:
        n = min(-(-num_tokens // uniform_query_len), c.max_num_seqs)
        query_lens = [uniform_query_len] * n
        query_lens[-1] = num_tokens - uniform_query_len * (n - 1)
        host_max_query_len = uniform_query_len
    else:
        n = min(num_tokens, c.max_num_seqs)
        query_lens = [num_tokens // n] * n
        query_lens[-1] += num_tokens % n
        host_max_query_len = num_tokens
    nb = c.max_blocks_per_seq
    if style == "v1":
        usable = max(c.num_blocks - 1, 1)
        block_table = (1 + torch.arange(n * nb, dtype=torch.int64).remainder(usable)).view(n, nb).to(torch.int32)
        seq_lens = [c.max_model_len] * n
    else:
        block_table = torch.full((n, nb), NULL_BLOCK, dtype=torch.int32)
        seq_lens = list(query_lens)
    slots = torch.full((num_tokens,), PAD_SLOT, dtype=torch.int64)
    return query_lens, seq_lens, block_table, slots, host_max_query_len
