"""`vllm:NAME`: one of vLLM's own attention backends run in place behind our interface.
The checker, modes, reference and reports stay ours; only the unit under test is vLLM's: its
metadata builder, its Impl (with a layer object), its support level and its KV cache layout.

One concern per module:
    release.py    which vLLM this process imports (or ORCH_VLLM names), which interface serves it
    current.py    the current interface, >=0.33,<0.35 (AttentionBackendEnum, KVCacheLayout, V2 runner)
    old.py        the old interface, >=0.10.2,<0.12 (the seed's releases: `_Backend`, cudagraph_support,
                  orch's own cache layout, V1 runner)
    roles.py      our builder, Impl and backend class around any vLLM backend (the same for both)
    config.py     the VllmConfig, built offline (a config.json for our heads, a test architecture)
    metadata.py   our metadata as vLLM's CommonAttentionMetadata (V1 and V2 runner counts), the layer
    cache.py      the KV cache in vLLM's layout, seen as ours without a copy
    query.py      the fp8 query vLLM's layer hands the Impl
    native.py     vLLM's compiled KV write and platform modules, where this install lacks them
    rocm_ops.py   ROCM_AITER_FA's ROCm-only ops, off ROCm, over orch's AITER emulation
    fixups.py     what runs differently on CPU (pinned memory, eager flex)
    errors.py     every "cannot be used here" as one `unavailable:` line

Families (make_backend's `family`): gqa, every backend of both interfaces (FullAttentionSpec; K
and V per kv head); mla, mla.py (vllm:TRITON_MLA's decode in place, the rest orch's and
labelled); swa_sinks, swa.py (TRITON_ATTN, ROCM_AITER_UNIFIED_ATTN with per-layer windows and
sinks, their builders per KV-cache group); hybrid_gdn, gdn.py (GDN_ATTN: vLLM's GDN builder per
state group, its Triton core on a GPU); mla_sparse, mla_sparse.py (FLASHMLA_SPARSE: vLLM's DSA
indexer and sparse MLA builders, orch's torch kernels; ROCM_AITER_MLA_SPARSE skips with why). An MLA backend named for gqa skips with `family_reason`'s words.

Whatever cannot run here is a skip with the reason, never a traceback: vllm not installed, a
release outside both ranges, a backend that does not import, a platform or a kv dtype it lacks.
On the command line (`--backend vllm:NAME`), a release outside both ranges is bad input instead
(registry.check_explicit, exit 2).
"""

from __future__ import annotations

import functools

from backend.adapters.vllm import release
from backend.adapters.vllm.cache import allocate_in_layout as allocate_vllm_kv_cache  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.cache import as_vllm_view  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.native import ensure_cache_ops, stub_platform_native  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.native import native_missing_module as _native_missing_module  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.query import quantize_query, query_quantizer  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.release import OLD_RANGE, SUPPORTED_RANGE, version_reason  # noqa: F401 - the adapter's API, re-exported
from backend.adapters.vllm.roles import VllmBuilder, VllmImpl  # noqa: F401 - the adapter's API, re-exported

# MLA backends (a family of their own, not bridged yet: see the module docstring).
MLA_BACKENDS = (
    "TRITON_MLA",
    "FLASHMLA",
    "CUTLASS_MLA",
    "FLASHINFER_MLA",
    "FLASH_ATTN_MLA",
    "ROCM_AITER_MLA",
    "FLASHMLA_SPARSE",
    "ROCM_AITER_MLA_SPARSE",
)


def family_reason(name: str) -> str | None:
    """Why `name` cannot serve the gqa family (None for the GQA backends it can)."""
    if name.removesuffix("_VLLM_V1") in MLA_BACKENDS:
        return f"unavailable: vllm:{name} is an MLA backend: run it with attention: [mla] (bridged: TRITON_MLA)"
    return None


def installed_version() -> str | None:
    """The vllm release this process imports (ORCH_VLLM applied); tests replace this name."""
    return release.installed_version()


def current_interface():
    """(the interface serving the release here, None), or (None, why none does)."""
    err = release.site_error()
    if err:
        return None, f"unavailable: {err}"
    name, why = release.interface_for(installed_version())
    if name is None:
        return None, why
    if name == "old":
        from backend.adapters.vllm.old import OLD

        return OLD, None
    from backend.adapters.vllm.current import CURRENT

    return CURRENT, None


@functools.cache
def load_vllm_backend(name: str):
    """(vLLM's backend class, None), or (None, why it cannot be used here)."""
    iface, why = current_interface()
    if iface is None:
        return None, why
    return iface.load(name)


def make_backend(name: str, family: str = "gqa"):
    """Our backend class for vLLM's backend `name` (e.g. FLEX_ATTENTION, ROCM_AITER_FA) for attention
    `family`. Always a class: when vLLM or the backend cannot be used here, unavailable_reason says
    why. Families: gqa (every GQA backend, both interfaces), mla (TRITON_MLA: mla.py), swa_sinks
    (TRITON_ATTN, ROCM_AITER_UNIFIED_ATTN: swa.py), hybrid_gdn (GDN_ATTN: gdn.py), mla_sparse
    (FLASHMLA_SPARSE, ROCM_AITER_MLA_SPARSE: mla_sparse.py)."""
    name = name.strip().upper()
    if family == "mla":
        if name.removesuffix("_VLLM_V1") == "TRITON_MLA":
            from backend.adapters.vllm.mla import make_triton_mla_backend

            return make_triton_mla_backend()
        return _unbridged(name, family)
    if family == "swa_sinks":
        if name in MLA_BACKENDS:
            return _unbridged(name, family)
        from backend.adapters.vllm.swa import make_swa_backend

        return make_swa_backend(name)
    if family == "hybrid_gdn":
        if name == "GDN_ATTN":
            from backend.adapters.vllm.gdn import make_gdn_backend

            return make_gdn_backend()
        return _unbridged(name, family)
    if family == "mla_sparse":
        if name == "FLASHMLA_SPARSE":
            from backend.adapters.vllm.mla_sparse import make_sparse_backend

            return make_sparse_backend()
        if name == "ROCM_AITER_MLA_SPARSE":
            from backend.adapters.vllm.mla_sparse import make_rocm_sparse_backend

            return make_rocm_sparse_backend()
        return _unbridged(name, family)
    if name == "GDN_ATTN":
        return _unbridged(name, family)
    return _make_backend(name)


@functools.cache
def _unbridged(name: str, family: str):
    """A class for a (vLLM backend, family) pair the adapter does not bridge: its cases skip."""
    import types

    from backend.attention.interface import AttentionBackend

    why = f"unavailable: vllm:{name} is not bridged for the {family} family (backend/adapters/vllm/)"
    attrs = {"name": f"vllm:{name}", "family": family, "unavailable_reason": classmethod(lambda klass, device: why)}
    return types.new_class(f"Vllm_{name}_{family}", (AttentionBackend,), {}, lambda ns: ns.update(attrs))


@functools.cache
def _make_backend(name: str):
    from backend.adapters.vllm.roles import make_backend_class

    iface, why = current_interface()
    why = why or family_reason(name)
    return make_backend_class(name, iface if why is None else None, why)
