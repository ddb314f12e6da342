"""`vllm:NAME`: one of vLLM's own v1 attention backends (FLEX_ATTENTION, TRITON_ATTN, ...) run in
place behind our interface (issue 15). The checker, modes, reference and reports stay ours; only the
unit under test is vLLM's: its metadata builder (`build`, `build_for_cudagraph_capture`), its Impl
(`do_kv_cache_update` + `forward`, with a layer object), its support level and its KV layout.

Built outside the engine the way vLLM's tests/v1/attention/utils.py does it: a VllmConfig (here
offline, from a config.json written for our ModelShape: no hub download, no tokenizer), a
FullAttentionSpec, CommonAttentionMetadata from our BatchDescription (our PersistentMetadataBuilder
fills the padded device buffers with vLLM's padding rules: DESIGN.md §4; this module hands them to
vLLM's builder as the model runner would), and the KV cache in vLLM's own layout:
    logical [num_blocks, num_kv_heads, block_size, 2 * head_size] (K | V in the content dim),
    physical order from the backend's supported_kv_cache_layouts() (LBNHC when it states none).
The checker sees that same storage as our [2, num_blocks, block_size, Hkv, D] through a strided
view (no copy), so context writes, snapshots and the KV-integrity check read vLLM's bytes.

Emulated, and said so in every result's versions["emulated"]: vLLM's `_C` extension is not shipped in the
Python-only wheel (and is built for another torch), so where `torch.ops._C_cache_ops.
reshape_and_cache_flash` is missing (FLEX_ATTENTION's KV write) it is registered here as a
composite op with the documented semantics (slot -1 writes nothing; fp8 divides by the scale):
backend.attention.kv_cache.write_slots, the same quantiser every provider uses.

The query is what vLLM's Attention layer would hand the Impl: with an fp8 cache and an Impl that
declares `supports_quant_query_input` (TRITON_ATTN on CUDA), vLLM's QuantFP8 quantises it to fp8
with the layer's q scale (query_quantizer; docs/VLLM.md).

Supported vLLM: SUPPORTED_RANGE (the 0.33/0.34 interface: logical [B, H, N, C] caches,
KVCacheLayout, vllm.v1.attention.backend). Outside it, or without vllm, or when the backend does
not import on this platform, every case is a skip with the reason, never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionConfig,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    BatchDescription,
)
from backend.attention.kv_cache import kv_cache_torch_dtype, write_slots

SUPPORTED_RANGE = ("0.33.0", "0.35.0")  # >= first, < second
# The names `orch doctor` lists are registry.VLLM_BACKENDS; any AttentionBackendEnum name works.
# Backends whose kernels run on a CPU torch (FLEX_ATTENTION is pure torch).
CPU_BACKENDS = ("FLEX_ATTENTION",)
# Compiled modules a backend's kernels live in, beyond vLLM's Python: absent from the trimmed
# Python-only wheel (benchmarks/build_vllm_wheel.py).
_NATIVE = {"FLASH_ATTN": ("vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"),
           "FLASHINFER": ("flashinfer",)}
# Our kv dtype names -> vLLM's CacheDType.
_KV_DTYPES = {"auto": "auto", "fp8": "fp8"}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def version_reason(installed: str | None, supported: tuple[str, str] = SUPPORTED_RANGE) -> str | None:
    """None when `installed` is inside [supported[0], supported[1]); else why not (one line)."""
    from packaging.version import InvalidVersion, Version

    if installed is None:
        return "unavailable: vllm is not installed (pip install vllm --no-deps plus docs/VLLM.md's extra packages)"
    try:
        v = Version(installed)
    except InvalidVersion:
        return f"unavailable: vllm version {installed!r} is not a version number"
    lo, hi = (Version(s) for s in supported)
    if not lo <= Version(v.base_version) < hi:
        return f"unavailable: vllm {installed} is outside the supported range >={supported[0]},<{supported[1]}"
    return None


def installed_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_fixups() -> None:
    """Without a GPU vLLM's platform is "unspecified" (its CPU platform needs triton-cpu and a CPU
    build), which still stages host->device copies in pinned memory: a CPU-only torch has no
    pinned allocator. Host copies stay plain (a module constant vLLM reads at call time)."""
    if torch.cuda.is_available():
        return
    import vllm.utils.torch_utils as tu

    tu.PIN_MEMORY = False


# Compiled modules vLLM's platform classes import at module level, stubbed where a Python-only
# install lacks them: vllm/platforms/cuda.py runs `import vllm._C_stable_libtorch` at import
# (its import_kernels() treats the same module as optional), so without a stub no backend that
# reads current_platform (TRITON_ATTN does at import) loads on a CUDA machine. The stub
# registers no op: a backend that needs one of its ops fails on that op, by name. The same
# applies to the full wheel's module when it cannot load (built for vLLM's pinned torch).
_PLATFORM_NATIVE = ("vllm._C_stable_libtorch",)


def _native_missing_module(name: str) -> bool:
    """The compiled module does not load here: absent (Python-only wheel) or built for another
    torch / a CUDA driver this machine lacks (what vLLM's own import would hit)."""
    import importlib

    try:
        importlib.import_module(name)
    except (ImportError, OSError):
        return True
    return False


def stub_platform_native(force: bool = False) -> tuple[str, ...]:
    """Empty modules for the absent _PLATFORM_NATIVE (on a CUDA machine, or `force`); the names."""
    if not (force or torch.cuda.is_available()):
        return ()
    stubbed = []
    for name in _PLATFORM_NATIVE:
        if name in sys.modules:
            continue
        if _native_missing_module(name):
            sys.modules[name] = types.ModuleType(name, "stub: absent from a Python-only vllm (backend/adapters/vllm.py)")
            stubbed.append(name)
            _EMULATED_OPS.append(f"{name} (empty stub)")
    return tuple(stubbed)


def _cpu_flex_eager(module) -> str | None:
    """FLEX_ATTENTION on CPU: torch.compile's CPU lowering of flex attention asserts that the
    block mask spans the whole KV (flex_cpu.py: seq_len_kv <= kv_indices width x KV block), and
    vLLM's direct block mask is as wide as the batch's pages, not the cache: every step fails
    inside inductor. Run torch's eager flex_attention with vLLM's own block mask and mask_mod
    instead (a module global of vLLM's; the result's provider name says so)."""
    if torch.cuda.is_available() or not hasattr(module, "flex_attention_compiled"):
        return None
    import torch.nn.attention.flex_attention as fa

    # Eager flex still wraps its op in torch.compile(backend="eager"), which refuses to trace
    # under the CPU graph emulation's dispatch mode; torch's debug switch calls the op directly.
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    module.flex_attention_compiled = module.flex_attention
    return "flex_attention eager (CPU)"


@contextlib.contextmanager
def _quiet_vllm_import():
    """vLLM logs a warning per compiled module it cannot load ("Failed to import from vllm._C")
    and torch one for a missing Triton, on stderr: `orch doctor` and every bad-input message
    promise one line there. vLLM's logger, where nothing configured it (no handler, no level:
    Python's last-resort handler would print its warnings), is set to ERROR for the process;
    VLLM_LOGGING_LEVEL too, unless the user set it (read when vLLM configures its logging).
    torch's Triton notice is raised to ERROR for the import."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    vlog = logging.getLogger("vllm")
    if not vlog.handlers and vlog.level == logging.NOTSET:
        vlog.setLevel(logging.ERROR)
    log = logging.getLogger("torch._library.triton")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@functools.lru_cache(maxsize=None)
def load_vllm_backend(name: str) -> tuple[Any, str | None]:
    """(vLLM's backend class, None), or (None, why it cannot be used here)."""
    why = version_reason(installed_version())
    if why:
        return None, why
    try:
        stub_platform_native()  # before anything resolves vllm.platforms.current_platform
        with _quiet_vllm_import():
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, f"unavailable: vllm does not import: {_one_line(exc)}"
    _cpu_fixups()
    try:
        member = AttentionBackendEnum[name]
    except (KeyError, ValueError):
        return None, f"unavailable: vLLM has no attention backend {name!r}"
    try:
        with _quiet_vllm_import():
            cls = member.get_class()
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel package missing on this platform
        return None, f"unavailable: vllm backend {name} does not import here: {_one_line(exc)}"
    eager = _cpu_flex_eager(sys.modules[cls.__module__]) if name == "FLEX_ATTENTION" else None
    if eager:
        _EMULATED_OPS.append(eager)
    ensure_cache_ops()  # here, so that emulated() is final once the class is loaded
    return cls, None


# ---- vLLM config, built offline ----------------------------------------------------------------
@dataclass(frozen=True)
class VllmContext:
    vllm_config: Any
    kv_cache_spec: Any
    layout: Any  # KVCacheLayout


def _model_dir(config: AttentionConfig) -> str:
    """A directory with a config.json for a Llama-shaped model of our (per-rank) heads: what
    ModelConfig reads instead of the hub. Written once per shape."""
    heads, kv_heads, d = config.num_heads, config.num_kv_heads, config.head_size
    key = f"orch-vllm-model-h{heads}-kv{kv_heads}-d{d}-l{config.max_model_len}-{str(config.dtype).removeprefix('torch.')}"
    path = os.path.join(tempfile.gettempdir(), key)
    os.makedirs(path, exist_ok=True)
    doc = {"architectures": [_TEST_ARCH], "model_type": "llama", "hidden_size": heads * d,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": d,
           "num_hidden_layers": 1, "intermediate_size": 2 * heads * d, "vocab_size": 256,
           "max_position_embeddings": config.max_model_len,
           "torch_dtype": str(config.dtype).removeprefix("torch.")}
    target = os.path.join(path, "config.json")
    tmp = f"{target}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, target)
    return path


# The architecture named in config.json. vLLM inspects a lazily registered model class (its Llama)
# in a *subprocess* (`_run_in_subprocess`), which on a CUDA machine with the Python-only wheel
# does not have our vllm._C_stable_libtorch stub and fails ("Model architectures
# ['LlamaForCausalLM'] failed to be inspected", seen on the H200). A class registered as a class is
# inspected in this process; nothing builds it (the test model is ours), it only answers vLLM's
# interface checks (a text-generation model: vllm_config kw, embed_input_ids, forward with
# input_ids and positions, compute_logits).
_TEST_ARCH = "OrchAttentionTestForCausalLM"


@functools.lru_cache(maxsize=1)
def _register_test_arch() -> None:
    from vllm.model_executor.models import ModelRegistry

    class OrchAttentionTestForCausalLM(torch.nn.Module):
        def __init__(self, *, vllm_config=None, prefix: str = ""):
            super().__init__()

        def embed_input_ids(self, input_ids):
            raise NotImplementedError("orch's test model is not built by vLLM")

        def forward(self, input_ids, positions, **kwargs):
            raise NotImplementedError("orch's test model is not built by vLLM")

        def compute_logits(self, hidden_states):
            raise NotImplementedError("orch's test model is not built by vLLM")

    ModelRegistry.register_model(_TEST_ARCH, OrchAttentionTestForCausalLM)


def _speculative_config(k: int, model, parallel):
    """The case's k as vLLM's speculative_config: what its builders size by (TRITON_ATTN's 3D
    split-KV scratch holds max_num_seqs x (1 + k) query rows; spec-as-decode builders set their
    reorder threshold to max_decode_query_len = 1 + k). n-gram drafting: the method that needs
    no draft model, and adds no drafting slots. None for k = 0, as in an engine without it."""
    if k <= 0:
        return None
    from vllm.config import SpeculativeConfig

    return SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=k + 1, prompt_lookup_min=1,
                             target_model_config=model, target_parallel_config=parallel)


@functools.lru_cache(maxsize=8)
def vllm_context(name: str, config: AttentionConfig) -> VllmContext:
    """The VllmConfig and KV cache spec vLLM's builder and Impl see for one rank's config.

    tp = 1 in vLLM's view: our config already holds one rank's heads (the tp split, the
    all-reduce and the gang are the test model's, DESIGN.md §5)."""
    from vllm.config import (
        CacheConfig,
        CompilationConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

    cls, why = load_vllm_backend(name)
    if cls is None:
        raise RuntimeError(why)
    _register_test_arch()
    d = _model_dir(config)
    model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype=config.dtype, seed=0,
                        max_model_len=config.max_model_len)
    cache = CacheConfig(block_size=config.block_size, cache_dtype=_KV_DTYPES[config.kv_cache_dtype])
    cache.num_gpu_blocks = config.num_blocks
    cache.num_cpu_blocks = 0
    scheduler = SchedulerConfig(max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                                max_num_batched_tokens=max(config.max_num_tokens, config.max_model_len),
                                is_encoder_decoder=False)
    # cudagraph_mode NONE: vLLM's engine would capture; here our session captures (the mode is a
    # case axis, not a builder setting). Builders read it only for custom mask mods / sliding
    # windows, which our model does not use.
    parallel = ParallelConfig(tensor_parallel_size=1)
    vc = VllmConfig(model_config=model, cache_config=cache, parallel_config=parallel,
                    scheduler_config=scheduler, device_config=DeviceConfig(device=config.device.type),
                    compilation_config=CompilationConfig(cudagraph_mode="NONE"),
                    speculative_config=_speculative_config(config.spec_tokens, model, parallel))
    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=config.num_kv_heads,
                             head_size=config.head_size, dtype=kv_cache_torch_dtype(config))
    layouts = cls.supported_kv_cache_layouts() or (KVCacheLayout.LBNHC,)
    return VllmContext(vc, spec, layouts[0])


# ---- the KV cache in vLLM's layout, seen as ours -----------------------------------------------
def allocate_vllm_kv_cache(config: AttentionConfig, layout) -> torch.Tensor:
    """One layer's cache in vLLM's physical order, returned as our [2, B, N, Hkv, D] view of it."""
    b, h, n, d = config.num_blocks, config.num_kv_heads, config.block_size, config.head_size
    logical = (b, h, n, 2 * d)
    order = layout.layer_view_order  # physical axis order of the logical [B, H, N, C] view
    if order[-1] != 3:
        raise ValueError(f"KV layout {layout.name}: the content dim is not innermost")
    physical = torch.zeros([logical[i] for i in order], dtype=kv_cache_torch_dtype(config), device=config.device)
    vllm_view = physical.permute([order.index(i) for i in range(4)])  # logical [B, H, N, 2D]
    sb, sh, sn, sc = vllm_view.stride()
    return physical.as_strided((2, b, n, h, d), (d * sc, sb, sn, sh, sc), physical.storage_offset())


def as_vllm_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """Our [2, B, N, Hkv, D] view (allocate_vllm_kv_cache) -> vLLM's logical [B, Hkv, N, 2D]."""
    _, b, n, h, d = kv_cache.shape
    _, sb, sn, sh, sc = kv_cache.stride()
    return kv_cache.as_strided((b, h, n, 2 * d), (sb, sh, sn, sc), kv_cache.storage_offset())


# ---- vLLM's native KV write, where its _C extension is absent -----------------------------------
_EMULATED_OPS: list[str] = []
_LIBRARY = None


def _reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's reshape_and_cache_flash semantics: token i's K/V go to slot slot_mapping[i] of the
    caches [num_blocks, block_size, Hkv, D] (strided views allowed); slot -1 writes nothing."""
    write_slots(key_cache, key, slot_mapping, k_scale)
    write_slots(value_cache, value, slot_mapping, v_scale)


def ensure_cache_ops() -> tuple[str, ...]:
    """Register the emulated KV write when vLLM's compiled one is not loaded; the op names
    emulated in this process."""
    global _LIBRARY
    try:
        torch.ops._C_cache_ops.reshape_and_cache_flash  # noqa: B018 - present when vllm._C loaded
    except (AttributeError, RuntimeError):
        if _LIBRARY is None:
            lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
            lib.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
                       "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
                       "Tensor v_scale) -> ()")
            # Composite: it decomposes into aten ops, which the CPU graph emulation records.
            lib.impl("reshape_and_cache_flash", _reshape_and_cache_flash, "CompositeImplicitAutograd")
            _LIBRARY = lib
            _EMULATED_OPS.append("reshape_and_cache_flash")
    return tuple(_EMULATED_OPS)


# ---- the four roles --------------------------------------------------------------------------
@dataclass
class VllmMetadata(AttentionMetadata):
    vllm: Any = None  # what vLLM's builder returned for this step


class _Layer(torch.nn.Module):
    """What vLLM's Impl reads from its Attention layer: the live scale tensors (ours, so graphs
    read their values) and their host copies. `_q_scale`/`_prob_scale` are the layer's defaults
    (vLLM's set_default_quant_scales: 0-d float32 1.0), what an engine without a checkpoint's q
    scale holds; with fp8 they become TRITON_ATTN's q_descale."""

    def __init__(self):
        super().__init__()
        self.layer_name = "model.layers.0.self_attn.attn"
        self._q_scale = torch.tensor(1.0, dtype=torch.float32)
        self._prob_scale = torch.tensor(1.0, dtype=torch.float32)
        self._q_scale_float = self._k_scale_float = self._v_scale_float = 1.0

    def bind(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        self._k_scale, self._v_scale = k_scale, v_scale
        if self._q_scale.device != k_scale.device:
            self._q_scale = self._q_scale.to(k_scale.device)
            self._prob_scale = self._prob_scale.to(k_scale.device)


def _backend_and_context(name: str, config: AttentionConfig) -> tuple[Any, VllmContext]:
    """vLLM's backend class and its config for this session (builder and Impl alike)."""
    cls, why = load_vllm_backend(name)
    if cls is None:
        raise RuntimeError(why)
    return cls, vllm_context(name, config)


class VllmBuilder(AttentionMetadataBuilder):
    backend_name: ClassVar[str] = ""

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        from vllm.config import set_current_vllm_config

        cls, self.ctx = _backend_and_context(self.backend_name, config)
        self.common = PersistentMetadataBuilder(config)
        with set_current_vllm_config(self.ctx.vllm_config):
            self.vllm_builder = cls.get_builder_cls()(self.ctx.kv_cache_spec, ["model.layers.0.self_attn.attn"],
                                                      self.ctx.vllm_config, config.device)

    def _common(self, md: AttentionMetadata):
        from vllm.v1.attention.backend import CommonAttentionMetadata

        # As the model runner hands it over for a padded step: every padded request and token is
        # in the counts; the padding values are vLLM's (DESIGN.md §4, builder.py).
        # Host copies, also on CPU (where .cpu() would return the device buffer itself).
        seq_cpu = md.seq_lens.to("cpu", copy=True)
        return CommonAttentionMetadata(
            query_start_loc=md.query_start_loc, query_start_loc_cpu=md.query_start_loc.to("cpu", copy=True),
            seq_lens=md.seq_lens, num_reqs=md.num_padded_reqs, num_actual_tokens=md.num_padded_tokens,
            max_query_len=md.max_query_len, max_seq_len=md.max_seq_len,
            block_table_tensor=md.block_table, slot_mapping=md.slot_mapping,
            seq_lens_cpu_upper_bound=seq_cpu)

    def _wrap(self, md: AttentionMetadata, capture: bool) -> VllmMetadata:
        from vllm.config import set_current_vllm_config

        cm = self._common(md)
        with set_current_vllm_config(self.ctx.vllm_config):
            if capture:
                built = self.vllm_builder.build_for_cudagraph_capture(cm)
            else:
                built = self.vllm_builder.build(common_prefix_len=0, common_attn_metadata=cm)
        fields = {f: getattr(md, f) for f in AttentionMetadata.__dataclass_fields__}
        return VllmMetadata(**fields, vllm=built)

    def build(self, batch: BatchDescription, num_padded_tokens: int | None = None,
              num_padded_reqs: int | None = None) -> VllmMetadata:
        return self._wrap(self.common.build(batch, num_padded_tokens, num_padded_reqs), capture=False)

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> VllmMetadata:
        return self._wrap(self.common.build_for_capture(num_tokens, uniform_query_len, style), capture=True)


def query_quantizer(impl, kv_cache_dtype: str, vllm_config):
    """What vLLM's Attention layer puts in front of the Impl for this kv dtype (0.33/0.34:
    Attention.__init__'s `query_quant`): vLLM's own QuantFP8, static per-tensor, when the Impl
    declares `supports_quant_query_input` and the cache is fp8 (TRITON_ATTN on CUDA, and on ROCm
    but gfx90a/gfx11; FLEX_ATTENTION never declares it). None otherwise: the Impl gets the
    model-dtype query, as in the engine. Per-head q scales come only from a checkpoint's q_scale,
    which this test model has not."""
    if not (getattr(impl, "supports_quant_query_input", False) and kv_cache_dtype.startswith("fp8")):
        return None
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    with set_current_vllm_config(vllm_config):
        return QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)


def quantize_query(quant, query: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    """The layer's `query, _ = self.query_quant(query, self._q_scale)` on the [T, H*D] query,
    through QuantFP8.forward_native: what the engine's default compilation runs (VLLM_COMPILE with
    inductor puts custom_ops "none", so quant_fp8 is disabled and its native form is compiled into
    the model). forward_cuda would call vLLM's compiled scaled_fp8_quant, which a Python-only wheel
    lacks; with a per-tensor static scale both are x / scale, clamped, cast to fp8."""
    t = query.shape[0]
    quantized, _ = quant.forward_native(query.reshape(t, -1), q_scale)
    return quantized.view(query.shape)


class VllmImpl(AttentionImpl):
    backend_name: ClassVar[str] = ""

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        from vllm.config import set_current_vllm_config

        cls, self.ctx = _backend_and_context(self.backend_name, config)
        self.backend = cls
        self.emulated_ops = ensure_cache_ops()
        with set_current_vllm_config(self.ctx.vllm_config):
            self.impl = cls.get_impl_cls()(
                num_heads=config.num_heads, head_size=config.head_size, scale=config.scale,
                num_kv_heads=config.num_kv_heads, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype=_KV_DTYPES[config.kv_cache_dtype], logits_soft_cap=None)
        self.layer = _Layer()
        self.includes_update = bool(getattr(cls, "forward_includes_kv_cache_update", True))
        self.query_quant = query_quantizer(self.impl, _KV_DTYPES[config.kv_cache_dtype], self.ctx.vllm_config)

    def query_fp8_scale(self) -> float | None:
        """The layer's static q scale when it quantises the query (the checker's reference rounds
        its query the same way), else None. The layer's host copy, as vLLM keeps it: no device read."""
        return self.layer._q_scale_float if self.query_quant is not None else None

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.layer.bind(k_scale, v_scale)
        cache = as_vllm_view(kv_cache)
        md = metadata.vllm
        t = metadata.num_padded_tokens
        if not self.includes_update:  # the engine's unified_kv_cache_update, before attention
            self.impl.do_kv_cache_update(self.layer, key[:t], value[:t], cache, metadata.slot_mapping)
        q = query[:t]
        if self.query_quant is not None:  # the layer's fp8 query (K/V stay in the model dtype)
            q = quantize_query(self.query_quant, q, self.layer._q_scale)
        self.impl.forward(self.layer, q, key[:t], value[:t], cache, md, output[:t])
        return output


def _native_missing(name: str) -> str | None:
    """The compiled module `name` needs when none of its candidates is importable, else None."""
    import importlib.util

    candidates = _NATIVE.get(name, ())
    for module in candidates:
        try:
            if importlib.util.find_spec(module) is not None:
                return None
        except (ImportError, ValueError):
            continue
    return " or ".join(candidates) or None


def _support(cls, ctx: VllmContext | None) -> AttentionCGSupport:
    """vLLM's own support level (get_cudagraph_support, else _cudagraph_support), as ours."""
    builder = cls.get_builder_cls()
    level = None
    if ctx is not None:
        try:
            level = builder.get_cudagraph_support(ctx.vllm_config, ctx.kv_cache_spec)
        except Exception:  # noqa: BLE001 - fall back to the class attribute
            level = None
    if level is None:
        level = getattr(builder, "_cudagraph_support", None)
    return AttentionCGSupport[level.name] if level is not None else AttentionCGSupport.NEVER


def make_backend(name: str) -> type[AttentionBackend]:
    """Our backend class for vLLM's backend `name` (a registry name, e.g. FLEX_ATTENTION). Always
    returns a class: when vLLM or the backend cannot be used, unavailable_reason says why."""
    return _make_backend(name.strip().upper())


@functools.lru_cache(maxsize=None)
def _make_backend(name: str) -> type[AttentionBackend]:
    cls, why = load_vllm_backend(name)
    support = _support(cls, None) if cls is not None else AttentionCGSupport.NEVER
    # Unusable here: every kv dtype, so a case's skip reason is why vLLM is unusable, not a
    # dtype it may well support.
    kv_dtypes = tuple(ours for ours, theirs in _KV_DTYPES.items()
                      if cls is None or not cls.supported_kv_cache_dtypes or theirs in cls.supported_kv_cache_dtypes)
    dtypes = tuple(cls.supported_dtypes) if cls is not None else (torch.bfloat16, torch.float16, torch.float32)
    builder = type(f"{name}Builder", (VllmBuilder,), {"backend_name": name})
    impl = type(f"{name}Impl", (VllmImpl,), {"backend_name": name})

    @classmethod
    def unavailable_reason(klass, device: torch.device) -> str | None:
        if why:
            return why
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        if name.startswith("ROCM_") and torch.version.hip is None:
            return f"unavailable: vllm:{name} runs on ROCm only"
        if device.type != "cuda" and name not in CPU_BACKENDS:
            kind = "Triton" if name in ("TRITON_ATTN", "ROCM_AITER_UNIFIED_ATTN") else "CUDA/HIP"
            return f"unavailable: vllm:{name} launches {kind} kernels: it needs a GPU (--devices gpu)"
        missing = _native_missing(name)
        if missing:
            return f"unavailable: vllm:{name} needs {missing}, which this vllm install lacks (a Python-only wheel?)"
        return None

    @classmethod
    def unsupported_reasons(klass, config: AttentionConfig) -> list[str]:
        reasons = AttentionBackend.unsupported_reasons.__func__(klass, config)
        if cls is not None:
            if not cls.supports_head_size(config.head_size):
                reasons.append(f"head_size {config.head_size} not supported by vllm:{name}")
            if not cls.supports_block_size(config.block_size):
                reasons.append(f"block_size {config.block_size} not supported by vllm:{name}")
        return reasons

    @staticmethod
    def allocate_kv_cache(config: AttentionConfig) -> torch.Tensor:
        return allocate_vllm_kv_cache(config, vllm_context(name, config).layout)

    attrs = {
        "name": f"vllm:{name}",
        "cudagraph_support": support,
        "supported_kv_cache_dtypes": kv_dtypes,
        "supported_dtypes": dtypes,
        "builder_cls": builder,
        "impl_cls": impl,
        "vllm_backend": cls,
        "unavailable_reason": unavailable_reason,
        "unsupported_reasons": unsupported_reasons,
        "allocate_kv_cache": allocate_kv_cache,
        "sizes_by_spec_tokens": True,  # its VllmConfig carries the case's speculative_config
        # What runs in place of vLLM's own code in this process (the result's versions say it).
        "emulated": staticmethod(lambda: tuple(_EMULATED_OPS)),
        "__doc__": f"vLLM's {name} backend, run in place (backend/adapters/vllm.py).",
    }
    return types.new_class(f"Vllm_{name}", (AttentionBackend,), {}, lambda ns: ns.update(attrs))
