"""The values that describe one case: what the matrix expands to and what a worker runs.

Every class here is a frozen, JSON-serialisable dataclass. They are validated once, at the edge
(the matrix loader), and cross process boundaries (Ray actors, `orch repro`, the store) as plain
dicts via `to_dict`/`from_dict`. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.attention import padding
from backend.families.contract import DEFAULT_FAMILY, UnknownFamily, spec

# vLLM v1 cudagraph modes (DESIGN.md §4). Runtime modes are only NONE, PIECEWISE, FULL.
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# Which vLLM model runner's capture procedure to reproduce (DESIGN.md §4a): "v1" gpu_model_runner
# (_dummy_run: seq_lens = max_model_len), "v2" vllm/v1/worker/gpu/cudagraph_utils.py (device
# seq_lens = query len, host max_seq_len = max_model_len, block-table rows on the null block).
CAPTURE_STYLES = ("v1", "v2")
# fp8_ds_mla: mla_sparse's byte rows with per-tile scales (backend/attention/ds_mla.py); a backend
# without it in supported_kv_cache_dtypes skips its cells.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_ds_mla")
MODEL_DTYPES = ("bfloat16", "float16", "float32")
TP_SIZES = (1, 2, 4, 8)


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, once per class (the fast to_dict paths walk them)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def default_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """vLLM's default cudagraph capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max+1, 16)."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return tuple(s for s in sizes if s <= max_size)


@dataclass(frozen=True)
class ModelShape:
    """Shape of the test model. Heads are global; a tp rank holds num_heads // tp of them.

    `attention` names the attention family (backend/families/specs.py) and `dims` holds the
    family's own dimensions as sorted (name, value) pairs (hashable, JSON-able; e.g. MLA's
    kv_lora_rank): the generic fields keep one meaning across families, num_kv_heads and
    head_size describing the KV cache (MLA: 1 latent row of kv_lora_rank + qk_rope_head_dim)."""

    num_heads: int = 8
    num_kv_heads: int = 2
    head_size: int = 32
    block_size: int = 16
    dtype: str = "bfloat16"
    num_layers: int = 2
    max_model_len: int = 512
    max_num_seqs: int = 16
    # KV-cache blocks per layer, block 0 (the null block) included; 0 = derive from the above.
    num_blocks: int = 0
    # vLLM's scheduler token budget per step; caps the capture sizes. 0 = unbounded here
    # (max_num_seqs * max_model_len), so matrices written before the field keep their sizes.
    max_num_batched_tokens: int = 0
    capture_style: str = "v2"  # one of CAPTURE_STYLES; v2 = the current vLLM model runner
    attention: str = DEFAULT_FAMILY  # a builtin family (specs.FAMILY_NAMES) or a plugin's name
    dims: tuple[tuple[str, Any], ...] = ()  # the family's own dimensions, sorted by name
    # A plugin family named by import path: that path (backend/families/contract/plugins.py), so a worker
    # loads it before it looks the family up; "" for builtins and entry-point families.
    family_source: str = ""

    def __post_init__(self):
        if self.capture_style not in CAPTURE_STYLES:
            raise ValueError(f"capture_style {self.capture_style!r} is not one of {', '.join(CAPTURE_STYLES)}")
        try:
            found = spec(self.family_source or self.attention)
        except UnknownFamily as e:
            raise ValueError(str(e)) from None
        if found.name != self.attention:
            raise ValueError(f"family_source {self.family_source!r} is the {found.name} family, not {self.attention}")
        # JSON gives lists back: normalise to sorted tuples (hashable; one order for equal shapes)
        object.__setattr__(self, "dims", tuple(sorted((str(k), v) for k, v in self.dims)))

    def dim(self, name: str) -> Any:
        """One of the family's dims (KeyError naming it when the shape has no such dim)."""
        for key, value in self.dims:
            if key == name:
                return value
        raise KeyError(f"{self.attention} shape has no dim {name!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        return cls(**{**d, "dims": tuple(tuple(p) for p in d.get("dims", ()))})

    @property
    def batched_tokens_limit(self) -> int:
        return self.max_num_batched_tokens or self.max_num_seqs * self.max_model_len

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def blocks_for(self, seq_lens) -> int:
        """KV-cache blocks that sequences of these lengths occupy."""
        return sum(-(-s // self.block_size) for s in seq_lens)

    @property
    def total_blocks(self) -> int:
        # Enough for max_num_seqs full-length sequences plus the reserved null block.
        return self.num_blocks or (self.max_num_seqs * self.max_blocks_per_seq + 1)


class BatchLengths:
    """The sizes every batch type derives from its per-request `query_lens` and `seq_lens`
    (BatchSpec here, the checker's BatchDescription)."""

    query_lens: Sequence[int]
    seq_lens: Sequence[int]

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens) if self.query_lens else 0

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens) if self.seq_lens else 0


@dataclass(frozen=True)
class BatchSpec(BatchLengths):
    """One batch shape: per-request query lengths and total sequence lengths (context + new).

    A request with query_len 1 is a decode row; > 1 is a prefill/extend row, causal over its whole
    sequence. The checker derives its per-step variations (shorter/longer sequences, shuffled block
    tables, other decode/prefill mixes) from this spec and the case seed.
    """

    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    description: str = ""

    @property
    def is_uniform_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def verify(self, spec_tokens: int) -> BatchSpec:
        """This spec under speculative decoding with k = `spec_tokens`: each decode row (query len 1)
        becomes a verify row of query len 1 + k (the last accepted token plus k drafts); prefill
        rows and every seq_len stay as written (seq_len counts context + new tokens, so a verify
        row needs seq_len >= 1 + k). k = 0 returns the spec itself."""
        if spec_tokens == 0:
            return self
        q = tuple(1 + spec_tokens if ql == 1 else ql for ql in self.query_lens)
        return BatchSpec(self.name, q, self.seq_lens, self.description)

    @property
    def kind(self) -> str:
        if self.is_uniform_decode:
            return "decode"
        if all(q > 1 for q in self.query_lens):
            return "prefill"
        return "mixed"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Case:
    """One point of the matrix. `case_id` is stable and human readable; filters, the store, JUnit
    and `orch repro` all key on it."""

    backend: str  # provider name ("torch", "aiter-emulated", ...) or "package.module:Class"
    tp: int
    mode: str  # one of CUDAGRAPH_MODES, as requested (resolution happens in the worker)
    kv_cache_dtype: str  # one of KV_CACHE_DTYPES
    batch: BatchSpec
    seed: int = 0
    model: ModelShape = field(default_factory=ModelShape)
    capture_sizes: tuple[int, ...] = field(default_factory=default_capture_sizes)
    steps: int = 3  # fresh-input steps through the same captured graphs
    tolerance: Tolerance = Tolerance(2e-2, 2e-2)  # for this case's (model dtype, kv dtype)
    timeout_s: float = 300.0
    matrix: str = ""  # source file, for the repro command
    tier: str = "full"
    # Speculative tokens per request (vLLM num_speculative_tokens). `batch` stays as written; its
    # decode rows run as verify rows of query len 1 + k (`verify_batch`).
    spec_tokens: int = 0
    # The (seq_len, block-table) values padded requests get, crossing what the backend's builders
    # declare (backend/attention/padding.py); None: the declared ones.
    cg_padding: tuple[int, int] | None = None

    @property
    def attention(self) -> str:
        """The attention family (the model's)."""
        return self.model.attention

    @property
    def verify_batch(self) -> BatchSpec:
        """The batch as this case runs it (BatchSpec.verify with the case's k)."""
        return self.batch.verify(self.spec_tokens)

    @property
    def backend_label(self) -> str:
        """The backend as it appears in ids: the class name for import paths."""
        return self.backend.rsplit(":", 1)[-1] if ":" in self.backend else self.backend

    @functools.cached_property
    def case_id(self) -> str:
        # Computed once per instance (the driver asks ~10 times per case; the fields are frozen).
        # `-k{k}` only when k > 0, so every id from before the spec_tokens axis stays as it was.
        spec = f"-k{self.spec_tokens}" if self.spec_tokens else ""
        # `-pad{seq}_{block}` only where the matrix crosses the declared padding values.
        spec += f"-pad{self.cg_padding[0]}_{self.cg_padding[1]}" if self.cg_padding is not None else ""
        # The family leads the id when it is not the default, so every gqa id stays as it was.
        family = "" if self.model.attention == DEFAULT_FAMILY else f"{self.model.attention}-"
        raw = f"{family}tp{self.tp}-{self.mode}-{self.kv_cache_dtype}{spec}-{self.batch.name}-{self.backend_label}-s{self.seed}"
        return re.sub(r"[^A-Za-z0-9_.\-]", "_", raw)

    @property
    def axes(self) -> dict[str, Any]:
        return {
            "attention": self.model.attention,
            "tp": self.tp,
            "cudagraph_mode": self.mode,
            "kv_cache_dtype": self.kv_cache_dtype,
            "batch": self.batch.name,
            "backend": self.backend,
            "seed": self.seed,
            "spec_tokens": self.spec_tokens,
            "cg_padding": padding.label(self.cg_padding),
        }

    def repro_command(self) -> str:
        src = self.matrix or "MATRIX"
        backend = f" --backend {self.backend}" if ":" in self.backend else ""
        # A vllm: backend (or a plugin over one) runs the vLLM release ORCH_VLLM names: the repro too.
        release = os.environ.get("ORCH_VLLM", "") if ":" in self.backend else ""
        prefix = f"ORCH_VLLM={shlex.quote(release)} " if release else ""
        return f"{prefix}orch repro {self.case_id} --matrix {src}{backend}"

    def to_dict(self) -> dict[str, Any]:
        """dataclasses.asdict(self), without its recursive deep copy (every field is an immutable
        value or a frozen dataclass of them): ~30x faster, and it runs twice per case in the driver
        (the run's plan, the dispatch to an actor). tests/matrix/test_expand.py holds it to asdict."""
        d = {name: getattr(self, name) for name in field_names(type(self))}
        d["batch"] = {name: getattr(self.batch, name) for name in field_names(type(self.batch))}
        d["model"] = {name: getattr(self.model, name) for name in field_names(type(self.model))}
        d["tolerance"] = {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        d = dict(d)
        b = d["batch"]
        d["batch"] = BatchSpec(b["name"], tuple(b["query_lens"]), tuple(b["seq_lens"]), b.get("description", ""))
        d["model"] = ModelShape.from_dict(d["model"])
        d["tolerance"] = Tolerance(**d["tolerance"])
        d["capture_sizes"] = tuple(d["capture_sizes"])
        if d.get("cg_padding") is not None:
            d["cg_padding"] = tuple(d["cg_padding"])
        return cls(**d)
