"""The backend contract for the hybrid_gdn family's state layers (DESIGN.md §11): GatedDeltaNet's
metadata, its state pages and its builder, as vLLM 0.34's GDN backend has them
(vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadata, GDNAttentionMetadataBuilder), over
orch's shared common metadata (backend/attention/groups.py). The attention layers of the family are
gqa's, their group built by SWAMetadataBuilder (no window) over the same common metadata.

State (per layer, per rank; vLLM's MambaSpec page, conv layout SD):
    a page per slot: conv [W, C] in the model dtype, then recurrent [Hv, Dv, Dk] in the state dtype
    W = conv_kernel - 1 + k (a rolling buffer under spec decode), C = 2 * Hk * Dk + Hv * Dv (q | k | v
    channels of the rank's heads); slot 0 is the null slot (vLLM's null block): never a request's.
A request owns 1 + k slots (its state-group block table row). Non-spec rows (decodes at k = 0,
prefills) read and write column 0: recurrent state, conv window W[0:K-1]. A verify row of 1 + k
tokens reads recurrent column a - 1 and conv window W[a-1 : a-1+K-1] (a = its num_accepted_tokens
from the step before), writes the state after token t to column t and shifts the conv buffer to
[W[a : a+K-2], x_0 .. x_k] (vLLM's causal_conv1d_update and fused_sigmoid_gating kernels).

Metadata (vLLM's field names, so one check reads both): per-request buffers are persistent, sized
min(max_num_seqs * (1 + k), largest capture size), written [:n] with the padding rules of the tail:
state index PAD_SLOT (-1; vLLM 0.34 pads with its null block 0), query-start tail repeating the last
value, accepted count 1, spec mask False. UNIFORM_BATCH: capture is decode only (vLLM's assertion),
and a capture's state indices are all padding (making a graph writes no state).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.attention.groups import CommonAttentionMetadata
from backend.attention.interface import AttentionBackend, AttentionCGSupport, AttentionConfig
from backend.host_copy import copy_into

PAD_SLOT = -1
NULL_SLOT = 0  # never a request's slot (vLLM's null block); orch's kernels do not special-case it


@dataclass(frozen=True)
class GDNDims:
    """One rank's GDN layer: Hk key heads of Dk, Hv value heads of Dv, conv width K, k spec tokens."""

    num_k_heads: int
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int
    conv_kernel: int
    spec_tokens: int = 0

    @classmethod
    def of(cls, config: AttentionConfig) -> GDNDims:
        """The rank's dims: key heads split in the ratio the value heads (num_heads) were split."""
        d = dict(config.dims)
        hk = d["num_k_heads"] * config.num_heads // d["num_v_heads"]
        return cls(hk, d["head_k_dim"], config.num_heads, config.head_size, d["conv_kernel"], config.spec_tokens)

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def conv_width(self) -> int:
        return self.conv_kernel - 1 + self.spec_tokens

    @property
    def columns(self) -> int:
        return 1 + self.spec_tokens


def num_state_slots(config: AttentionConfig) -> int:
    """Slots per state layer: the null slot, then 1 + k for each of max_num_seqs requests."""
    return 1 + config.max_num_seqs * (1 + config.spec_tokens)


@dataclass(frozen=True)
class StatePage:
    """A state layer's cache: a byte tensor [num_slots, page_bytes] (as vLLM's hybrid allocator
    holds a Mamba page), seen as its two planes without a copy."""

    dims: GDNDims
    conv_dtype: torch.dtype
    state_dtype: torch.dtype

    @property
    def conv_bytes(self) -> int:
        d = self.dims
        return _align(d.conv_width * d.conv_dim * _size(self.conv_dtype))

    @property
    def state_bytes(self) -> int:
        d = self.dims
        return _align(d.num_v_heads * d.head_v_dim * d.head_k_dim * _size(self.state_dtype))

    @property
    def page_bytes(self) -> int:
        return self.conv_bytes + self.state_bytes

    def allocate(self, num_slots: int, device) -> torch.Tensor:
        return torch.zeros(num_slots, self.page_bytes, dtype=torch.uint8, device=device)

    def conv(self, page: torch.Tensor) -> torch.Tensor:
        """[num_slots, W, C] (a strided view of the page)."""
        d, n = self.dims, page.shape[0]
        used = d.conv_width * d.conv_dim * _size(self.conv_dtype)
        return page[:, :used].view(self.conv_dtype).view(n, d.conv_width, d.conv_dim)

    def state(self, page: torch.Tensor) -> torch.Tensor:
        """[num_slots, Hv, Dv, Dk] (a strided view of the page)."""
        d, n = self.dims, page.shape[0]
        used = d.num_v_heads * d.head_v_dim * d.head_k_dim * _size(self.state_dtype)
        return (
            page[:, self.conv_bytes : self.conv_bytes + used]
            .view(self.state_dtype)
            .view(n, d.num_v_heads, d.head_v_dim, d.head_k_dim)
        )


def _size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _align(n: int, to: int = 16) -> int:
    return -(-n // to) * to


@dataclass
class GDNMetadata:
    """One step's GDN metadata (vLLM's GDNAttentionMetadata fields; rows come decodes first). Host
    counts are frozen by a graph; the tensors are the builder's persistent buffers where staged."""

    num_prefills: int
    num_prefill_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_spec_decodes: int
    num_spec_decode_tokens: int
    num_actual_tokens: int  # the tokens the step runs (padded in a FULL graph)
    num_reqs: int  # real requests
    num_padded_reqs: int
    has_initial_state: torch.Tensor | None = None  # [non-spec rows] bool: context > 0
    spec_query_start_loc: torch.Tensor | None = None  # [spec rows + 1]
    non_spec_query_start_loc: torch.Tensor | None = None  # [non-spec rows + 1]
    spec_state_indices_tensor: torch.Tensor | None = None  # [spec rows, 1 + k]
    non_spec_state_indices_tensor: torch.Tensor | None = None  # [non-spec rows]
    spec_sequence_masks: torch.Tensor | None = None  # [rows] bool
    num_accepted_tokens: torch.Tensor | None = None  # [spec rows]
    pad_slot: int = PAD_SLOT  # the state index a padded request carries (the contract's padding)
    for_capture: bool = False


class GDNMetadataBuilder:
    """Orch's GDN builder: vLLM's rules (the module docstring) over CommonAttentionMetadata, whose
    block table is this state group's [requests, 1 + k] slots."""

    def __init__(self, config: AttentionConfig):
        self.config = config
        self.dims = GDNDims.of(config)
        k = config.spec_tokens
        dev = config.device
        # decode_cudagraph_max_bs: min(max_num_seqs * (1 + k), the largest capture size)
        self.max_bs = config.max_num_seqs * (1 + k)
        if config.max_capture_size:
            self.max_bs = min(self.max_bs, config.max_capture_size)
        n = max(self.max_bs, config.max_num_seqs)
        self.spec_state_indices = torch.full((n, 1 + k), PAD_SLOT, dtype=torch.int32, device=dev)
        self.non_spec_state_indices = torch.full((n,), PAD_SLOT, dtype=torch.int32, device=dev)
        self.spec_sequence_masks = torch.zeros(n, dtype=torch.bool, device=dev)
        self.spec_query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.non_spec_query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.num_accepted_tokens = torch.ones(n, dtype=torch.int32, device=dev)

    # The padding values (the contract): the mutation suite's broken builders override these.
    def pad_indices(self, buf: torch.Tensor) -> None:
        buf.fill_(PAD_SLOT)

    def pad_accepted(self, buf: torch.Tensor) -> None:
        buf.fill_(1)

    def request_rows(self, cm: CommonAttentionMetadata) -> int:
        """How many rows the per-request buffers hold: the padded request count (vLLM #45100's fix)."""
        return cm.num_padded_reqs

    def split(self, q: list[int], ctx: list[int], drafts: list[int] | None) -> int:
        """How many leading rows are decodes (rows come decodes first; the family orders them).
        Spec decode (drafts given): the rows with drafts (>= 0). Else a decode is a row of one token
        over context, or of none (padding): vLLM's V2 runner and GDN builder class a prompt's first
        chunk, even of one token, as a prefill, since its slot holds no state of its own (#51483)."""
        n, lead = len(q), 0
        if drafts is not None:
            while lead < n and drafts[lead] >= 0:
                lead += 1
            return lead
        while lead < n and ((q[lead] == 1 and ctx[lead] > 0) or q[lead] == 0):
            lead += 1
        return lead

    def build(self, cm: CommonAttentionMetadata) -> GDNMetadata:
        return self._build(cm, capture=False)

    def _build(self, cm: CommonAttentionMetadata, capture: bool) -> GDNMetadata:
        k, n = self.config.spec_tokens, cm.num_reqs
        qsl_cpu = cm.query_start_loc_cpu
        q = (qsl_cpu[1 : n + 1] - qsl_cpu[:n]).tolist()
        # A capture's rows are decodes whatever its seq_lens (V2: seq_len = query len; vLLM's builder
        # masks its "no prior state" test with is_prefilling, None at capture).
        ctx = [1] * n if capture else (cm.seq_lens_cpu[:n] - qsl_cpu[1 : n + 1] + qsl_cpu[:n]).tolist()
        drafts = None
        if k > 0:
            if capture:  # vLLM: num_decode_draft_tokens_cpu = diff(query_start_loc_cpu) - 1
                drafts = [x - 1 for x in q]
            elif cm.num_draft_tokens_cpu is not None:
                drafts = cm.num_draft_tokens_cpu[:n].tolist()
        spec = drafts is not None and any(x >= 0 for x in drafts)  # else vLLM runs the non-spec path
        lead = self.split(q, ctx, drafts if spec else None)
        prefills = n - lead
        table = cm.block_table_tensor
        rows = self.request_rows(cm)
        lead_tokens = int(qsl_cpu[lead]) if n else 0
        md = GDNMetadata(
            num_prefills=prefills,
            num_prefill_tokens=(int(qsl_cpu[n]) if n else 0) - lead_tokens,
            num_decodes=0,
            num_decode_tokens=0,
            num_spec_decodes=0,
            num_spec_decode_tokens=0,
            num_actual_tokens=cm.num_padded_tokens,
            num_reqs=n,
            num_padded_reqs=cm.num_padded_reqs,
            for_capture=cm.for_capture,
        )
        if spec:
            md.num_spec_decodes, md.num_spec_decode_tokens = lead, lead_tokens
        else:
            md.num_decodes, md.num_decode_tokens = lead, lead_tokens
        if prefills == 0 and rows <= self.max_bs:
            self._stage(md, cm, table, lead, rows, spec)
        else:  # vLLM stages only what a FULL graph can hold
            self._eager(md, cm, table, lead, n, ctx, spec)
        return md

    def _stage(
        self, md: GDNMetadata, cm: CommonAttentionMetadata, table: torch.Tensor, lead: int, rows: int, spec: bool
    ) -> None:
        """A decode-only batch (what a FULL graph holds): the persistent buffers, [:lead] the real
        rows, [lead:rows] the padding rules."""
        qsl = cm.query_start_loc
        if spec:
            idx = self.spec_state_indices
            copy_into(idx[:lead], table[:lead, : idx.shape[1]])
            self.pad_indices(idx[lead:rows])
            self.spec_sequence_masks[:lead].fill_(True)
            self.spec_sequence_masks[lead:rows].fill_(False)
            acc = self.num_accepted_tokens
            if cm.num_accepted_tokens is not None:
                copy_into(acc[:lead], cm.num_accepted_tokens[:lead])
            else:  # the capture batch: each row's query len (vLLM derives it from query_start_loc)
                copy_into(acc[:lead], qsl[1 : lead + 1] - qsl[:lead])
            self.pad_accepted(acc[lead:rows])
            sq = self.spec_query_start_loc
            copy_into(sq[: lead + 1], qsl[: lead + 1])
            sq[lead + 1 : rows + 1].copy_(qsl[lead : lead + 1].expand(rows - lead))
            md.spec_state_indices_tensor, md.spec_sequence_masks = idx[:rows], self.spec_sequence_masks[:rows]
            md.num_accepted_tokens, md.spec_query_start_loc = acc[:rows], sq[: rows + 1]
            return
        idx = self.non_spec_state_indices
        copy_into(idx[:lead], table[:lead, 0])
        self.pad_indices(idx[lead:rows])
        nq = self.non_spec_query_start_loc
        copy_into(nq[: lead + 1], qsl[: lead + 1])
        nq[lead + 1 : rows + 1].copy_(qsl[lead : lead + 1].expand(rows - lead))
        md.non_spec_state_indices_tensor, md.non_spec_query_start_loc = idx[:rows], nq[: rows + 1]

    def _eager(
        self,
        md: GDNMetadata,
        cm: CommonAttentionMetadata,
        table: torch.Tensor,
        lead: int,
        n: int,
        ctx: list[int],
        spec: bool,
    ) -> None:
        """A batch with prefill rows: never in a FULL graph (UNIFORM_BATCH), fresh tensors are fine."""
        qsl, dev = cm.query_start_loc, cm.query_start_loc.device
        k = self.config.spec_tokens
        first = lead if spec else 0  # non-spec: decodes and prefills are one group, decodes first
        if spec and lead:
            md.spec_state_indices_tensor = table[:lead, : 1 + k].to(torch.int32)
            md.spec_sequence_masks = torch.arange(n, device=dev) < lead
            md.num_accepted_tokens = cm.num_accepted_tokens[:lead].to(torch.int32)
            md.spec_query_start_loc = qsl[: lead + 1]
        md.non_spec_state_indices_tensor = table[first:n, 0].to(torch.int32)
        md.non_spec_query_start_loc = qsl[first : n + 1] - qsl[first]
        md.has_initial_state = torch.tensor([c > 0 for c in ctx[first:]], dtype=torch.bool).to(dev)

    def build_for_capture(self, cm: CommonAttentionMetadata) -> GDNMetadata:
        """vLLM's assertion: FULL graphs of GDN are decode only. The capture's state indices are all
        padding: making a graph writes no state (the capture's slots are -1 for the KV cache too)."""
        if cm.num_reqs > self.max_bs or cm.num_padded_tokens > self.max_bs:
            raise AssertionError(
                f"GDN only supports decode-only full CUDAGraph capture. Make sure batch size "
                f"({cm.num_reqs}) <= cudagraph capture sizes ({self.max_bs}), and number of "
                f"tokens ({cm.num_padded_tokens}) <= cudagraph capture sizes ({self.max_bs})."
            )
        k, n = self.config.spec_tokens, cm.num_reqs
        pads = torch.full((n, 1 + k), PAD_SLOT, dtype=torch.int32, device=cm.block_table_tensor.device)
        return self._build(dataclasses.replace(cm, block_table_tensor=pads, num_accepted_tokens=None), capture=True)


def request_buffer_problems(md, pad_slot: int) -> list[str]:
    """The contract of a decode-only (staged) GDN metadata, whoever built it (orch's builder or
    vLLM's: the same field names): every per-request buffer has one row per padded request
    (vLLM #45100: padded by tokens, not requests), and the padded rows hold the padding values
    (state index `pad_slot`, accepted count 1, spec mask False, query-start tail = the last value)."""
    if md.num_prefills or md.num_padded_reqs is None:
        return []
    rows, real = md.num_padded_reqs, md.num_reqs
    out = []
    spec = md.spec_state_indices_tensor is not None and md.num_spec_decodes
    named = (
        (
            ("spec_state_indices_tensor", md.spec_state_indices_tensor, rows),
            ("spec_sequence_masks", md.spec_sequence_masks, rows),
            ("num_accepted_tokens", md.num_accepted_tokens, rows),
            ("spec_query_start_loc", md.spec_query_start_loc, rows + 1),
        )
        if spec
        else (
            ("non_spec_state_indices_tensor", md.non_spec_state_indices_tensor, rows),
            ("non_spec_query_start_loc", md.non_spec_query_start_loc, rows + 1),
        )
    )
    for name, t, want in named:
        if t is None:
            continue
        if t.shape[0] != want:
            out.append(f"{name} has {t.shape[0]} rows for {rows} requests")
    if out or rows == real:
        return out
    host = {name: t.detach().cpu() for name, t, _ in named if t is not None}
    idx = host.get("spec_state_indices_tensor", host.get("non_spec_state_indices_tensor"))
    if idx is not None and bool((idx[real:] != pad_slot).any()):
        out.append(
            f"padded requests {real}..{rows - 1}: state index {int(idx[real:].flatten()[0])}, "
            f"not the padding {pad_slot}"
        )
    acc = host.get("num_accepted_tokens")
    if acc is not None and bool((acc[real:] != 1).any()):
        out.append(f"padded requests {real}..{rows - 1}: num_accepted_tokens {int(acc[real:][0])}, not 1")
    mask = host.get("spec_sequence_masks")
    if mask is not None and bool(mask[real:].any()):
        out.append(f"padded requests {real}..{rows - 1}: spec_sequence_masks True, not False")
    qsl = host.get("spec_query_start_loc", host.get("non_spec_query_start_loc"))
    if qsl is not None and bool((qsl[real + 1 :] != qsl[real]).any()):
        out.append(f"query_start_loc's tail after request {real - 1} does not repeat its last value {int(qsl[real])}")
    return out


class GDNImpl:
    """A provider's GDN core: the causal conv1d and the gated delta rule over the state page
    (vLLM's GDN attention core: the layer's projections and gated norm are the family's)."""

    def __init__(self, config: AttentionConfig):
        self.config = config
        self.dims = GDNDims.of(config)

    def forward(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        page: torch.Tensor,
        layout: StatePage,
        md,
        weights: dict[str, torch.Tensor],
        out: torch.Tensor,
    ) -> torch.Tensor:
        """mixed_qkv [T, C], b/a [T, Hv] (the step's padded rows) -> out [T, Hv, Dv] (the core's
        output before the gated norm; rows of padded tokens may hold anything). weights: conv_w
        [C, K], A_log [Hv], dt_bias [Hv] (the rank's)."""
        raise NotImplementedError


class HybridImpl:
    """The family's Impl: the attention layers' (gqa's Impl over the attention group's metadata)
    and the state layers' (a GDNImpl). Providers subclass it naming the two classes."""

    attention_cls: ClassVar[type] = None
    gdn_cls: ClassVar[type] = GDNImpl

    def __init__(self, config: AttentionConfig):
        self.config = config
        self.attention = self.attention_cls(config)
        self.gdn = self.gdn_cls(config)


class HybridGDNBackend(AttentionBackend):
    """Static capabilities of a hybrid_gdn provider (subclass: set gdn_builder_cls,
    attention_builder_cls and an impl_cls, a HybridImpl). The support level is the minimum over
    the groups: GDN's UNIFORM_BATCH."""

    family: ClassVar[str] = "hybrid_gdn"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    # The builders and buffers are sized by k (decode_cudagraph_max_bs, the 1 + k slot columns).
    sizes_by_spec_tokens: ClassVar[bool] = True
    gdn_builder_cls: ClassVar[type] = GDNMetadataBuilder
    attention_builder_cls: ClassVar[type] = None  # set by subclasses (SWAMetadataBuilder: no window)
    impl_cls: ClassVar[type] = HybridImpl

    @classmethod
    def group_builder(cls, kind: str, config: AttentionConfig):
        """A KV-cache group's builder: GDN's for a state group, the attention layers' otherwise."""
        return (cls.gdn_builder_cls if kind == "state" else cls.attention_builder_cls)(config)
