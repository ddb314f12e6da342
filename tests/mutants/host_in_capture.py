"""Bug class: host (CPU) tensors taking part in device work inside the captured forward. On a GPU
a host op is not captured (it ran once, at capture), a 0-dim host tensor in a device op is a
kernel argument baked at capture, and a host index tensor into a device tensor is a pageable copy
a capturing stream refuses. The host memory here is made as vLLM's builders make it: numpy arrays
(torch.from_numpy of them), tensors made without a device, a pinned staging buffer.

- `NumpyLens`: the builder keeps its host query lens as a numpy array (written in every build);
  forward runs torch.cumsum on them into a pinned staging and copies that in: every replay gets
  the capture batch's query_start_loc (wrong on mixed batches; decode batches match the capture's).
- `HostIndex`: forward gathers its output rows through a host index tensor: a capture error.
  `LazyHostIndex` makes that index on its first call, an eager one where the session ran NONE
  before it captured.
- `HostScale`: the builder writes the token count into a 0-dim host tensor and a device tensor in
  every build; forward scales its output by their ratio (1 while live): the host one is a kernel
  argument baked at capture (the capture batch's count), so every replay of another count is off.
  `LazyHostScale` makes that host tensor in its first build(): an eager step's where the session
  ran NONE first, outside every host scope (the emulation's one silent form left: the session
  builds eager metadata outside host_scope).
- `PinnedStaging` (the control): the builder writes its host query_start_loc into a pinned
  staging's numpy view in every build, outside the graph, and forward copies the staging in
  (vLLM's CpuGpuBuffer): green.
"""

from __future__ import annotations

import numpy as np
import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.providers.torch_backend import TorchBackend, TorchImpl


class _NumpyLensBuilder(PersistentMetadataBuilder):
    def __init__(self, config):
        super().__init__(config)
        self.lens_np = np.zeros(config.max_num_seqs, dtype=np.int32)
        self.lens_cpu = torch.from_numpy(self.lens_np)  # host memory on a GPU

    def _write(self, query_lens, *args, **kwargs):
        md = super()._write(query_lens, *args, **kwargs)
        self.lens_np[:] = 0
        self.lens_np[: len(query_lens)] = query_lens
        md.query_lens_cpu = self.lens_cpu[: md.num_padded_reqs]
        return md


class _CumsumImpl(TorchImpl):
    def __init__(self, config):
        super().__init__(config)
        self.staging = torch.zeros(config.max_num_seqs + 1, dtype=torch.int32, pin_memory=True)

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        n = metadata.num_padded_reqs
        torch.cumsum(metadata.query_lens_cpu, 0, out=self.staging[1 : n + 1])  # host work
        metadata.query_start_loc.copy_(self.staging[: n + 1], non_blocking=True)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class _IndexImpl(TorchImpl):
    def __init__(self, config):
        super().__init__(config)
        self.rows = torch.arange(config.max_num_tokens)  # made without a device: host memory

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        out[:t] = out[self.rows[:t]]
        return out


class _LazyIndexImpl(_IndexImpl):
    """The host index made on the first call: an eager one when the session ran NONE first."""

    def __init__(self, config):
        TorchImpl.__init__(self, config)
        self.rows = None

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if self.rows is None:
            self.rows = torch.arange(self.config.max_num_tokens)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class _ScaleBuilder(PersistentMetadataBuilder):
    def __init__(self, config):
        super().__init__(config)
        self.tokens_cpu = torch.zeros((), dtype=torch.float32)  # 0-dim host memory
        self.tokens_dev = torch.zeros((), dtype=torch.float32, device=config.device)

    def _write(self, query_lens, *args, **kwargs):
        md = super()._write(query_lens, *args, **kwargs)
        self.tokens_cpu.fill_(float(sum(query_lens)))  # the engine's host value, every build
        self.tokens_dev.fill_(float(sum(query_lens)))
        md.tokens_cpu, md.tokens_dev = self.tokens_cpu, self.tokens_dev
        return md


class _LazyScaleBuilder(_ScaleBuilder):
    """The host count made on the first build(): an eager step's when the session ran NONE first."""

    def __init__(self, config):
        PersistentMetadataBuilder.__init__(self, config)
        self.tokens_cpu = None
        self.tokens_dev = torch.zeros((), dtype=torch.float32, device=config.device)

    def _write(self, query_lens, *args, **kwargs):
        if self.tokens_cpu is None:
            self.tokens_cpu = torch.zeros((), dtype=torch.float32)
        return super()._write(query_lens, *args, **kwargs)


class _ScaleImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        out[:t].mul_(metadata.tokens_cpu / metadata.tokens_dev)  # 1 while the host value is live
        return out


class _StagingBuilder(PersistentMetadataBuilder):
    def __init__(self, config):
        super().__init__(config)
        self.staging = torch.zeros(config.max_num_seqs + 1, dtype=torch.int32, pin_memory=True)
        self.staging_np = self.staging.numpy()

    def _write(self, query_lens, *args, **kwargs):
        md = super()._write(query_lens, *args, **kwargs)
        n, total = len(query_lens), int(sum(query_lens))
        self.staging_np[0] = 0
        self.staging_np[1 : n + 1] = np.cumsum(query_lens)
        self.staging_np[n + 1 :] = total
        md.staging = self.staging[: md.num_padded_reqs + 1]
        return md


class _StagingImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        metadata.query_start_loc.copy_(metadata.staging, non_blocking=True)  # read at replay
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class NumpyLens(TorchBackend):
    name = "mutant-host-numpy-lens"
    builder_cls = _NumpyLensBuilder
    impl_cls = _CumsumImpl


class HostIndex(TorchBackend):
    name = "mutant-host-index"
    impl_cls = _IndexImpl


class LazyHostIndex(TorchBackend):
    name = "mutant-host-index-lazy"
    impl_cls = _LazyIndexImpl


class HostScale(TorchBackend):
    name = "mutant-host-scale"
    builder_cls = _ScaleBuilder
    impl_cls = _ScaleImpl


class LazyHostScale(TorchBackend):
    name = "mutant-host-scale-lazy"
    builder_cls = _LazyScaleBuilder
    impl_cls = _ScaleImpl


class PinnedStaging(TorchBackend):
    name = "mutant-host-pinned-staging"
    builder_cls = _StagingBuilder
    impl_cls = _StagingImpl
