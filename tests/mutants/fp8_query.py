"""An fp8 query (vLLM's layer quantises the query for an Impl that declares
supports_quant_query_input; backend/adapters/vllm/ does what the layer does): the `torch`
provider with its query rounded to the cache's fp8 (static scale QUERY_SCALE) on fp8 caches.

  QueryFp8Declared    says so (`query_fp8_scale()` on its Impl): the checker's reference rounds its
                      query the same way, so the reference checks see only the kernel's error
  QueryFp8Undeclared  the same rounding, not declared: the reference attends with the bf16 query,
                      and the rounding shows up as error (larger than the declared one's)
"""

from __future__ import annotations

from backend.attention.kv_cache import fp8_dtype
from backend.harness.reference import fp8_round
from backend.providers.torch_backend import TorchBackend, TorchImpl

QUERY_SCALE = 0.5


class _RoundsQuery(TorchImpl):
    def _fp8(self) -> bool:
        return self.config.kv_cache_dtype == "fp8"

    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        if self._fp8():
            query = fp8_round(query.float(), QUERY_SCALE, fp8_dtype(query.device)).to(query.dtype)
        return super().attend(query, kv_cache, metadata, k_scale, v_scale, output)


class DeclaredImpl(_RoundsQuery):
    def query_fp8_scale(self) -> float | None:
        return QUERY_SCALE if self._fp8() else None


class QueryFp8Declared(TorchBackend):
    name = "torch+fp8-query"
    impl_cls = DeclaredImpl


class QueryFp8Undeclared(TorchBackend):
    name = "torch+fp8-query-undeclared"
    impl_cls = _RoundsQuery
