"""Several KV-cache groups over one shared CommonAttentionMetadata, as vLLM's runner builds them
(DESIGN.md §9c; vllm/v1/worker/gpu/attn_utils.py build_attn_metadata, 0.26's
gpu_model_runner._build_attention_metadata).

The runner owns the persistent inputs: query_start_loc (device and a CPU copy), seq_lens (device
and CPU) and query_lens are ONE set of tensors for the whole model; each group has its own block
table and slot mapping. Per step, and per capture, the groups' metadata are built in group order,
each builder handed a shallow copy of one CommonAttentionMetadata (dataclasses.replace) whose
query_start_loc, query_start_loc_cpu and seq_lens are the same objects in every group: a builder
that mutates them in place changes what every later group's builder sees (vLLM #51585, #53821).
Every build writes the shared buffers first ([:n], tails reset, as PersistentMetadataBuilder), so
what a capture mutated is restored before a replay; what a later group derived from it on the
host at capture is frozen in its graph.

Group builders take the common metadata (vLLM's builder.build(common_prefix_len, cm) and
build_for_cudagraph_capture(cm)): backend/attention/swa.py has the contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.attention.builder import NULL_BLOCK, PAD_SLOT, capture_batch
from backend.attention.interface import AttentionConfig, BatchDescription
from backend.host_copy import copy_into


@dataclass
class CommonAttentionMetadata:
    """vLLM's CommonAttentionMetadata, the fields orch's group builders read. Tensors are views of
    the runner's persistent buffers, sized to the padded request/token counts."""

    query_start_loc: torch.Tensor  # [padded_reqs + 1] int32, device (shared by every group)
    query_start_loc_cpu: torch.Tensor  # the same on the host (shared)
    seq_lens: torch.Tensor  # [padded_reqs] int32, device (shared)
    seq_lens_cpu: torch.Tensor  # host (shared)
    query_lens: torch.Tensor  # [padded_reqs] int32, device (shared)
    num_reqs: int
    num_actual_tokens: int
    num_padded_reqs: int
    num_padded_tokens: int
    max_query_len: int  # host: the capture's is the dummy's (mixed: num_tokens)
    max_seq_len: int  # host: the capture's is max_model_len
    block_table_tensor: torch.Tensor  # [padded_reqs, max_blocks] int32, the group's own
    slot_mapping: torch.Tensor  # [padded_tokens] int64, the group's own
    for_capture: bool = False
    # Spec decode (what vLLM's runner hands a GDN builder beside the common metadata): the
    # accepted-token count of each request's previous verify step (device, the runner's buffer)
    # and each request's draft count (host; -1: not a spec row). None at capture and for k = 0.
    num_accepted_tokens: torch.Tensor | None = None
    num_draft_tokens_cpu: torch.Tensor | None = None


class LayerMetadata(tuple):
    """Per-layer metadata (each layer's group's); a graph keeps it as its capture metadata."""

    @property
    def num_padded_reqs(self) -> int:
        return self[0].num_padded_reqs


class GroupedMetadataBuilder:
    """The session's builder for a family with KV-cache groups (AttentionFamily.make_builder)."""

    # The runner's own padding pair, before its group builders' declarations (padding.py).
    cg_pad_seq_lens = 0
    cg_pad_block_table = NULL_BLOCK

    def __init__(
        self,
        backend_cls,
        config: AttentionConfig,
        groups: Sequence,
        num_layers: int,
        group_config=None,
        group_builder=None,
    ):
        """groups: AttentionFamily.groups (name, layers, sliding_window, kind). group_config(config,
        group) -> the AttentionConfig a group's builder gets (its spec's window); group_builder(group,
        config) -> the group's builder (default: the backend's builder_cls for every group)."""
        self.config, self.groups = config, tuple(groups)
        self.cg_padding = (self.cg_pad_seq_lens, self.cg_pad_block_table)  # what it pads with (padding.apply)
        dev, reqs, toks = config.device, config.max_num_seqs, config.max_num_tokens
        self.query_start_loc = torch.zeros(reqs + 1, dtype=torch.int32, device=dev)
        self.query_start_loc_cpu = torch.zeros(reqs + 1, dtype=torch.int32)
        self.seq_lens = torch.zeros(reqs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.zeros(reqs, dtype=torch.int32)
        self.query_lens = torch.zeros(reqs, dtype=torch.int32, device=dev)
        self.block_tables = [
            torch.zeros(reqs, config.max_blocks_per_seq, dtype=torch.int32, device=dev) for _ in self.groups
        ]
        self.slot_mappings = [torch.full((toks,), PAD_SLOT, dtype=torch.int64, device=dev) for _ in self.groups]
        self.num_accepted = torch.ones(reqs, dtype=torch.int32, device=dev)
        self.num_drafts_cpu = torch.full((reqs,), -1, dtype=torch.int32)
        make_config = group_config or (lambda c, g: c)
        make = group_builder or (lambda g, c: backend_cls.builder_cls(c))
        self.builders = [make(g, make_config(config, g)) for g in self.groups]
        self.layer_group = [
            next(i for i, g in enumerate(self.groups) if layer in g.layers) for layer in range(num_layers)
        ]

    # ---- the runner's writes ------------------------------------------------------------------
    def _common(
        self,
        query_lens,
        seq_lens,
        tables,
        slots,
        padded_tokens,
        padded_reqs,
        max_query_len,
        max_seq_len,
        for_capture,
        accepted=None,
        drafts=None,
    ) -> CommonAttentionMetadata:
        c = self.config
        n, t = len(query_lens), int(sum(query_lens))
        if not (0 <= n <= padded_reqs <= c.max_num_seqs and 0 <= t <= padded_tokens <= c.max_num_tokens):
            raise ValueError(
                f"batch of {n} requests / {t} tokens (padded {padded_reqs} / {padded_tokens}) exceeds "
                f"max_num_seqs {c.max_num_seqs} / max_num_tokens {c.max_num_tokens}"
            )
        qlens = torch.tensor(list(query_lens), dtype=torch.int32)
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum(qlens, 0, out=qsl[1:])
        self.query_start_loc_cpu[: n + 1].copy_(qsl)
        self.query_start_loc_cpu[n + 1 :].fill_(t)
        copy_into(self.query_start_loc[: n + 1], qsl)
        self.query_start_loc[n + 1 :].fill_(t)
        sl = torch.tensor(list(seq_lens), dtype=torch.int32)
        self.seq_lens_cpu[:n].copy_(sl)
        pad_seq_len, pad_block = self.cg_padding
        self.seq_lens_cpu[n:].fill_(pad_seq_len)
        copy_into(self.seq_lens[:n], sl)
        self.seq_lens[n:].fill_(pad_seq_len)
        copy_into(self.query_lens[:n], qlens)
        self.query_lens[n:].fill_(0)
        for table, slot, buf_t, buf_s in zip(tables, slots, self.block_tables, self.slot_mappings):
            width = min(table.shape[1], buf_t.shape[1]) if n else 0
            buf_t[n:].fill_(pad_block)
            if n:
                copy_into(buf_t[:n, :width], table[:n, :width].to(torch.int32))
                buf_t[:n, width:].fill_(NULL_BLOCK)
            copy_into(buf_s[:t], slot.to(torch.int64))
            buf_s[t:].fill_(PAD_SLOT)
        spec = {}
        if accepted is not None:  # the runner's spec-decode inputs, [:n] and the tail reset
            copy_into(self.num_accepted[:n], torch.tensor(list(accepted), dtype=torch.int32))
            self.num_accepted[n:].fill_(1)
            self.num_drafts_cpu[:n].copy_(torch.tensor(list(drafts), dtype=torch.int32))
            self.num_drafts_cpu[n:].fill_(-1)
            spec = dict(
                num_accepted_tokens=self.num_accepted[:padded_reqs],
                num_draft_tokens_cpu=self.num_drafts_cpu[:padded_reqs],
            )
        return CommonAttentionMetadata(
            self.query_start_loc[: padded_reqs + 1],
            self.query_start_loc_cpu[: padded_reqs + 1],
            self.seq_lens[:padded_reqs],
            self.seq_lens_cpu[:padded_reqs],
            self.query_lens[:padded_reqs],
            n,
            t,
            padded_reqs,
            padded_tokens,
            max_query_len,
            max_seq_len,
            self.block_tables[0][:padded_reqs],
            self.slot_mappings[0][:padded_tokens],
            for_capture,
            **spec,
        )

    def _per_group(self, common: CommonAttentionMetadata, capture: bool) -> LayerMetadata:
        built = []
        for g, builder in enumerate(self.builders):
            # A shallow copy: the shared tensors are the same objects in every group (vLLM's replace).
            cm = dataclasses.replace(
                common,
                block_table_tensor=self.block_tables[g][: common.num_padded_reqs],
                slot_mapping=self.slot_mappings[g][: common.num_padded_tokens],
            )
            built.append(builder.build_for_capture(cm) if capture else builder.build(cm))
        return LayerMetadata(built[g] for g in self.layer_group)

    # ---- the session's builder interface ------------------------------------------------------
    def build(
        self,
        batches: Sequence[BatchDescription],
        num_padded_tokens: int | None = None,
        num_padded_reqs: int | None = None,
    ) -> LayerMetadata:
        b = batches[0]
        padded_tokens = b.num_tokens if num_padded_tokens is None else num_padded_tokens
        padded_reqs = b.num_reqs if num_padded_reqs is None else num_padded_reqs
        if max(b.seq_lens, default=0) > self.config.max_model_len:
            raise ValueError(f"seq_len {max(b.seq_lens)} exceeds max_model_len {self.config.max_model_len}")
        common = self._common(
            b.query_lens,
            b.seq_lens,
            [x.block_table for x in batches],
            [x.slot_mapping for x in batches],
            padded_tokens,
            padded_reqs,
            b.max_query_len,
            b.max_seq_len,
            for_capture=False,
            accepted=b.num_accepted_tokens,
            drafts=b.num_draft_tokens,
        )
        return self._per_group(common, capture=False)

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> LayerMetadata:
        q, s, table, slots, host_max_q = capture_batch(self.config, num_tokens, uniform_query_len, style)
        # A state group's dummy rows are on its null slot (V2 runner: null-block rows), whatever style.
        tables = [torch.zeros_like(table) if getattr(g, "kind", "paged") == "state" else table for g in self.groups]
        common = self._common(
            q,
            s,
            tables,
            [slots] * len(self.groups),
            num_tokens,
            len(q),
            host_max_q,
            self.config.max_model_len,
            for_capture=True,
        )
        return self._per_group(common, capture=True)
