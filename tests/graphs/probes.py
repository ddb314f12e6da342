"""The probe corpus: small programs, each with the verdict a real CUDA graph gives.

Every program runs on both runners through backend.graphs.equivalence.run_program: under
torch.cuda.CUDAGraph on a GPU (benchmarks/gpu_equivalence.py writes tests/graphs/golden_cuda.json)
and under the CPU emulation (tests/graphs/test_probes.py asserts it gives the golden verdict, or
the conservative one in CONSERVATIVE, or the `unverifiable` one in UNVERIFIABLE). Host memory is
made with host_tensor() (a (pinned) CPU tensor on a GPU, a marked CPU tensor under the emulation,
backend/graphs/host.py) by the older probes, and unmarked, the way GPU code makes it (no device,
`pin_memory=True`), by the later probes (ROUND_TWO on): the emulation finds those by how they were
made (backend/graphs/provenance.py).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np
import torch

from backend.graphs.base import is_capturing
from backend.graphs.equivalence import PROGRAMS as BASE_PROGRAMS
from backend.graphs.equivalence import Instance, Program
from backend.graphs.host import host_tensor
from backend.harness.churn import poison_free_memory

_HOST_GLOBAL = {"scale": 2.0}  # stands for vLLM's forward context, read inside an op body


@torch.library.custom_op("orch_probe::scale_by_global", mutates_args=())
def _scale_by_global(x: torch.Tensor) -> torch.Tensor:
    return x * _HOST_GLOBAL["scale"]


@torch.library.custom_op("orch_probe::scale_by_item", mutates_args=())
def _scale_by_item(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * scale.item()  # AITER pa_decode's k_scale.item(), inside an op


@torch.library.custom_op("orch_probe::double_into", mutates_args=("out",))
def _double_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 2)


@torch.library.custom_op("orch_probe::scale_by_int", mutates_args=())
def _scale_by_int(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n


@torch.library.custom_op("orch_probe::cast_reshape", mutates_args=())
def _cast_reshape(x: torch.Tensor) -> torch.Tensor:
    # to(dtype) and reshape of a transpose copy; their schemas say "may alias", and inside an op's
    # body (below autograd) they reach a dispatch mode as such, not decomposed
    return x.to(torch.float64).view(2, 2).t().reshape(-1).to(torch.float32) * 2


# An op registered the older way (a Library impl, no CustomOpDef): the emulation cannot get at
# its body, so it refuses it rather than replaying the body with live host state.
_LIB = torch.library.Library("orch_probe_lib", "DEF")
_LIB.define("scale_by_global(Tensor x) -> Tensor")
_LIB.impl("scale_by_global", lambda x: x * _HOST_GLOBAL["scale"], "CompositeExplicitAutograd")


def _arange(n: int, device, start: float = 0.0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32, device=device)


def _customop_host_global(device) -> Instance:
    _HOST_GLOBAL["scale"] = 2.0
    x = _arange(4, device)

    def step():
        _HOST_GLOBAL["scale"] = 5.0
        x.add_(1)

    return Instance(lambda: torch.ops.orch_probe.scale_by_global(x), step, lambda: x * _HOST_GLOBAL["scale"])


def _library_impl_host_global(device) -> Instance:
    _HOST_GLOBAL["scale"] = 2.0
    x = _arange(4, device)

    def step():
        _HOST_GLOBAL["scale"] = 5.0
        x.add_(1)

    return Instance(lambda: torch.ops.orch_probe_lib.scale_by_global(x), step, lambda: x * _HOST_GLOBAL["scale"])


def _customop_item(device) -> Instance:
    x, scale = _arange(4, device), torch.ones(1, device=device)
    return Instance(lambda: torch.ops.orch_probe.scale_by_item(x, scale), lambda: scale.fill_(2.0), lambda: x * scale)


def _customop_cast_reshape(device) -> Instance:
    x = _arange(4, device)
    return Instance(
        lambda: torch.ops.orch_probe.cast_reshape(x), lambda: x.mul_(3), lambda: x.view(2, 2).t().reshape(-1) * 2
    )


def _customop_mutating(device) -> Instance:
    x, out = _arange(4, device), torch.zeros(4, device=device)

    def fn():
        torch.ops.orch_probe.double_into(x, out)
        return out

    return Instance(fn, lambda: x.fill_(3.0), lambda: x * 2)


def _customop_host_int(device) -> Instance:
    x, host = _arange(4, device), {"n": 2}

    def step():
        host["n"] = 7

    return Instance(lambda: torch.ops.orch_probe.scale_by_int(x, host["n"]), step, lambda: x * host["n"])


def _host_cumsum_pinned_h2d(device) -> Instance:
    query_lens = host_tensor(torch.tensor([1, 1, 1], dtype=torch.int32), device)
    staging = host_tensor(torch.zeros(3, dtype=torch.int32), device, pinned=True)
    start_loc = torch.zeros(3, dtype=torch.int32, device=device)

    def fn():
        staging.copy_(query_lens.cumsum(0))  # host work: runs once, at capture
        start_loc.copy_(staging, non_blocking=True)
        return start_loc * 1

    def step():
        query_lens.copy_(torch.tensor([1, 5, 2], dtype=torch.int32))

    return Instance(fn, step, lambda: query_lens.cumsum(0).to(device))


def _pinned_h2d_refreshed(device) -> Instance:
    staging = host_tensor(torch.ones(4), device, pinned=True)
    dev = torch.zeros(4, device=device)

    def fn():
        dev.copy_(staging, non_blocking=True)
        return dev * 2

    def step():
        staging.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # the builder refills the pinned buffer

    return Instance(fn, step, lambda: staging.to(device) * 2)


def _pageable_h2d_blocking(device) -> Instance:
    host = host_tensor(torch.ones(4), device)
    dev = torch.zeros(4, device=device)

    def fn():
        dev.copy_(host)  # blocking copy from pageable memory: a stream sync
        return dev * 2

    return Instance(fn, lambda: host.fill_(3.0), lambda: host.to(device) * 2)


def _d2h_cpu(device) -> Instance:
    x = _arange(4, device)

    def fn():
        n = x.cpu()  # host metadata built from device data
        return x * 2 + n.sum().to(x.device) * 0

    return Instance(fn, lambda: x.add_(1), lambda: x * 2)


def _host_item_frozen(device) -> Instance:
    x, scale = _arange(4, device), host_tensor(torch.ones(1), device)
    return Instance(lambda: x * scale.item(), lambda: scale.fill_(3.0), lambda: x * 3.0)


def _host_scalar_tensor_arg(device) -> Instance:
    x, scale = _arange(4, device), host_tensor(torch.tensor(2.0), device)
    return Instance(lambda: x * scale, lambda: scale.fill_(3.0), lambda: x * 3.0)


def _histc_auto_range(device) -> Instance:
    x = _arange(8, device)
    return Instance(lambda: torch.histc(x, bins=4), lambda: x.mul_(2), lambda: torch.histc(x, bins=4))


def _histc_fixed_range(device) -> Instance:
    x = _arange(8, device)

    def ref():
        return torch.histc(x, bins=4, min=0, max=16)

    return Instance(lambda: torch.histc(x, bins=4, min=0, max=16), lambda: x.mul_(2), ref)


def _allclose_branch(device) -> Instance:
    x, y = _arange(4, device), _arange(4, device)
    return Instance(lambda: x * 2 if torch.allclose(x, y) else x, lambda: y.add_(1), lambda: x)


def _explicit_generator(device) -> Instance:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.zeros(4, device=device)
    return Instance(lambda: x + torch.rand(4, device=device, generator=gen), lambda: None, None)


def _rng_default_generator(device) -> Instance:
    x = torch.zeros(4, device=device)
    return Instance(lambda: x + torch.rand(4, device=device), lambda: None, None)  # philox offset advances


def _alloc_during_capture(device) -> Instance:
    x = _arange(4, device)

    def fn():
        t = torch.zeros(4, device=device)
        t += x
        return t * 1

    return Instance(fn, lambda: x.fill_(9.0), lambda: x.clone())


def _shape_scalar(device) -> Instance:
    x = _arange(4, device)
    return Instance(lambda: x / x.shape[0], lambda: x.add_(4), lambda: x / 4)


def _where_mask(device) -> Instance:
    x = _arange(4, device)

    def ref():
        return torch.where(x > 2, x, torch.zeros_like(x))

    return Instance(
        lambda: torch.where(x > 2, x, torch.zeros_like(x)), lambda: x.copy_(_arange(4, device, 1.0).flip(0)), ref
    )


def _index_put_tensor_indices(device) -> Instance:
    idx = torch.tensor([0, 2], device=device)
    vals, out = torch.tensor([1.0, 2.0], device=device), torch.zeros(4, device=device)

    def fn():
        out.zero_()
        out.index_put_((idx,), vals)
        return out

    def step():
        idx.copy_(torch.tensor([1, 3]))
        vals.fill_(7.0)

    return Instance(fn, step, lambda: torch.zeros(4, device=device).index_put_((idx,), vals))


def _gather_block_table(device) -> Instance:
    cache, table = _arange(12, device).view(6, 2), torch.tensor([0, 1], device=device)

    def step():
        table.copy_(torch.tensor([4, 5]))

    return Instance(lambda: cache.index_select(0, table).sum(1), step, lambda: cache.index_select(0, table).sum(1))


def _out_variant(device) -> Instance:
    x, out = _arange(4, device), torch.zeros(4, device=device)

    def fn():
        torch.mul(x, 3, out=out)
        return out

    return Instance(fn, lambda: x.fill_(2.0), lambda: x * 3)


def _view_during_capture(device) -> Instance:
    buf = _arange(4, device)
    return Instance(lambda: buf.view(2, 2).sum(0), lambda: buf.mul_(3), lambda: buf.view(2, 2).sum(0))


def _bool_mask_index(device) -> Instance:
    x = _arange(4, device)
    return Instance(lambda: x[x > 1], lambda: x.add_(1), lambda: x[x > 1])


def _nonzero(device) -> Instance:
    x = _arange(4, device)
    return Instance(lambda: torch.nonzero(x).float(), lambda: x.add_(1), lambda: torch.nonzero(x).float())


def _tolist(device) -> Instance:
    x = _arange(4, device)
    return Instance(lambda: x * len(x.tolist()), lambda: x.add_(1), lambda: x * 4)


def _repeat_interleave_no_size(device) -> Instance:
    reps = torch.tensor([1, 2], device=device)
    return Instance(
        lambda: torch.repeat_interleave(reps).float(),
        lambda: reps.fill_(2),
        lambda: torch.repeat_interleave(reps).float(),
    )


def _d2h_variant(convert: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.device], Instance]:
    """x converted to host memory inside the capture by `convert` (a .to() form of .cpu()): on a GPU a
    blocking device->host copy, which a capturing stream refuses."""

    def build(device) -> Instance:
        x = _arange(4, device)
        return Instance(lambda: x * 2 + convert(x).sum() * 0, lambda: x.add_(1), lambda: x * 2)

    return build


def _d2h_to_host_like(device) -> Instance:
    x, like = _arange(4, device), host_tensor(torch.zeros(4), device)
    return Instance(lambda: x * 2 + x.to(like).sum() * 0, lambda: x.add_(1), lambda: x * 2)


def _device_view_item(device) -> Instance:
    x = _arange(4, device, 1.0)
    first = x[:1]  # a view of a device tensor, taken before capture: still device memory
    return Instance(lambda: x * first.item(), lambda: x.fill_(2.0), lambda: x * 2.0)


def _host_view_outlives_base(device) -> Instance:
    # A slice of a detached alias (no ._base link): the tensor object that was marked is gone, the
    # memory is the same, still host memory on a GPU.
    lens = host_tensor(torch.tensor([1.0, 2.0, 3.0]), device).detach()[1:]
    x = _arange(4, device)
    return Instance(lambda: x * lens.sum().item(), lambda: lens.fill_(4.0), lambda: x * 8.0)


def _host_reshape_scalar(device) -> Instance:
    host = host_tensor(torch.tensor([1.0, 2.0, 3.0, 4.0]), device)
    x = _arange(4, device)
    # reshape + index of host memory inside the capture: a 0-dim host tensor, passed by value
    return Instance(lambda: x * host.reshape(2, 2)[1, 1], lambda: host.fill_(9.0), lambda: x * 9.0)


def _host_index_copy_frozen(device) -> Instance:
    host = host_tensor(torch.tensor([1.0, 2.0, 3.0]), device)
    pick = host_tensor(torch.tensor([2]), device)
    x = _arange(4, device)
    # advanced indexing copies host memory on the host (run once at capture)
    return Instance(lambda: x * host[pick].item(), lambda: host.fill_(7.0), lambda: x * 7.0)


def _pinned_view_h2d(device) -> Instance:
    staging = host_tensor(torch.ones(6), device, pinned=True)
    window = staging[2:6]  # a slice of the pinned buffer is pinned memory too
    dev = torch.zeros(4, device=device)

    def fn():
        dev.copy_(window, non_blocking=True)
        return dev * 2

    def step():
        staging.copy_(torch.arange(6, dtype=torch.float32))

    return Instance(fn, step, lambda: staging[2:6].to(device) * 2)


NEW_PROGRAMS: tuple[Program, ...] = (
    Program("customop_host_global", "a custom op whose body reads a host global", _customop_host_global),
    Program(
        "library_impl_host_global",
        "a Library-impl op (no CustomOpDef) reading a host global",
        _library_impl_host_global,
    ),
    Program("customop_item", "a custom op whose body calls .item() on a device tensor", _customop_item),
    Program("customop_mutating", "a custom op writing its out argument in place", _customop_mutating),
    Program("customop_host_int", "a custom op given a host int that changes after capture", _customop_host_int),
    Program(
        "host_cumsum_pinned_h2d",
        "host cumsum of query lens, then non_blocking H2D from pinned",
        _host_cumsum_pinned_h2d,
    ),
    Program(
        "pinned_h2d_refreshed", "non_blocking H2D from a pinned buffer refilled before replay", _pinned_h2d_refreshed
    ),
    Program("pageable_h2d_blocking", "blocking H2D copy from pageable host memory", _pageable_h2d_blocking),
    Program("d2h_cpu", "x.cpu() to build host metadata", _d2h_cpu),
    Program("host_item_frozen", ".item() of a host tensor (allowed on a GPU, frozen)", _host_item_frozen),
    Program("host_scalar_tensor_arg", "a 0-dim CPU tensor as an operand of a device op", _host_scalar_tensor_arg),
    Program("histc_auto_range", "histc with min == max (range read from the data)", _histc_auto_range),
    Program("histc_fixed_range", "histc with a fixed range", _histc_fixed_range),
    Program("allclose_branch", "a Python branch on torch.allclose", _allclose_branch),
    Program("explicit_generator", "torch.rand with an explicit torch.Generator", _explicit_generator),
    Program(
        "rng_default_generator", "torch.rand on the default generator: new numbers each replay", _rng_default_generator
    ),
    Program("alloc_during_capture", "a tensor allocated inside the capture", _alloc_during_capture),
    Program("shape_scalar", "a python scalar from a shape that does not change", _shape_scalar),
    Program("where_mask", "torch.where with a device mask", _where_mask),
    Program("index_put_tensor_indices", "index_put_ with device index tensors", _index_put_tensor_indices),
    Program("gather_block_table", "index_select by a device block table", _gather_block_table),
    Program("out_variant", "torch.mul(..., out=static)", _out_variant),
    Program("view_during_capture", "a view created inside the capture", _view_during_capture),
    Program("bool_mask_index", "boolean-mask indexing", _bool_mask_index),
    Program("nonzero", "torch.nonzero", _nonzero),
    Program("tolist", "Tensor.tolist() of a device tensor", _tolist),
    Program("repeat_interleave_no_size", "repeat_interleave without output_size", _repeat_interleave_no_size),
    Program("d2h_to_str", 'x.to("cpu") of a device tensor', _d2h_variant(lambda t: t.to("cpu"))),
    Program("d2h_to_device_kwarg", 'x.to(device="cpu") of a device tensor', _d2h_variant(lambda t: t.to(device="cpu"))),
    Program(
        "d2h_to_torch_device",
        'x.to(torch.device("cpu"), torch.float64) of a device tensor',
        _d2h_variant(lambda t: t.to(torch.device("cpu"), torch.float64)),
    ),
    Program("d2h_to_host_like", "x.to(h) with h a host tensor", _d2h_to_host_like),
    Program(
        "d2h_cpu_of_view",
        "x[1:].cpu(): a view of a device tensor copied to the host",
        _d2h_variant(lambda t: t[1:].cpu()),
    ),
    Program("device_view_item", ".item() of a view of a device tensor", _device_view_item),
    Program(
        "host_view_outlives_base",
        ".item() of a host slice whose marked tensor object is gone",
        _host_view_outlives_base,
    ),
    Program("host_reshape_scalar", "reshape + index of a host tensor as a device op operand", _host_reshape_scalar),
    Program("host_index_copy_frozen", "advanced indexing of a host tensor, then .item()", _host_index_copy_frozen),
    Program(
        "customop_cast_reshape",
        "a custom op whose body casts (to(dtype)) and reshapes a transpose (copies)",
        _customop_cast_reshape,
    ),
    Program(
        "pinned_view_h2d", "non_blocking H2D from a slice of a pinned buffer refilled before replay", _pinned_view_h2d
    ),
)


# ---- round two: the four silent greens and the four false reds it found ------------------------
# Host memory below is made as GPU code makes it: no device, pin_memory=True; nothing is marked.


def _host_compute_h2d(device) -> Instance:
    lens = torch.tensor([1, 1, 1], dtype=torch.int32)  # host: made without a device
    staging = torch.zeros(3, dtype=torch.int32, pin_memory=True)
    start = torch.zeros(3, dtype=torch.int32, device=device)

    def fn():
        torch.cumsum(lens, 0, out=staging)  # host work: a GPU runs it once, at capture
        start.copy_(staging, non_blocking=True)  # and the graph copies that one result each replay
        return start * 1

    def step():
        lens.copy_(torch.tensor([1, 5, 2], dtype=torch.int32))

    return Instance(fn, step, lambda: lens.cumsum(0).to(device))


def _pageable_h2d_nonblocking(device) -> Instance:
    host = torch.ones(4)  # pageable host memory: made without a device, not pinned
    dev = torch.zeros(4, device=device)

    def fn():
        dev.copy_(host, non_blocking=True)
        return dev * 2

    return Instance(fn, lambda: host.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0])), lambda: host.to(device) * 2)


def _python_data_to_device(device) -> Instance:
    x = _arange(4, device)
    # python data to a device: put in host memory, then a blocking copy
    return Instance(lambda: x * torch.tensor([2.0], device=device), lambda: x.add_(1), lambda: x * 2)


def _pool_shared(copy_first: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x = _arange(4, device, 1.0)

        def peer():  # captured first into the same pool
            t = x * 3  # a temporary: its block goes back to the pool when the capture ends
            return t.sum().reshape(1)

        # fn's output is given the peer's freed block; the peer's replay writes 3x there
        return Instance(
            lambda: x * 2, lambda: x.add_(1), lambda: x * 2, peers=(peer,), copy_first=copy_first, own_pool=True
        )

    return build


def _stash(replay: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x = _arange(4, device, 0.5)
        stash = {}

        def fn():
            y = x * 7.25
            stash["y"] = y  # kept for the host to read later (an attention output, a debug tensor)
            return y + 1

        return Instance(fn, lambda: None, lambda: x * 7.25, observe=lambda: stash["y"], replay=replay, own_pool=True)

    return build


def _linalg(checked: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        a = torch.eye(3, device=device) * 4
        if checked:
            run = lambda: torch.linalg.cholesky(a)  # its error check reads `info` on the host
        else:
            run = lambda: torch.linalg.cholesky_ex(a).L  # `info` stays on the device
        return Instance(run, lambda: a.mul_(4), lambda: torch.linalg.cholesky(a))

    return build


def _memcpy_launcher(device) -> Callable[[int, int, int], None]:
    """A kernel launch on raw pointers behind PyTorch's dispatcher: the driver's device-to-device
    copy on the current (capturing) stream on a GPU; libc's memcpy through ctypes on the CPU."""
    if torch.device(device).type == "cuda":
        fn = ctypes.CDLL("libcuda.so.1").cuMemcpyDtoDAsync_v2
        fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]

        def launch(dst: int, src: int, n: int) -> None:
            rc = fn(dst, src, n, torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"cuMemcpyDtoDAsync_v2: CUresult {rc}")

        return launch
    fn = ctypes.CDLL(None).memcpy
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_void_p
    return lambda dst, src, n: fn(dst, src, n) and None


class _Raw:
    """Raw float32 memory at an address, as a C extension sees a tensor it was handed a pointer to."""

    def __init__(self, ptr: int, n: int):
        self.__array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": "<f4", "version": 3}


def _raw_launcher(device) -> Callable[[int, int, int], None]:
    """The same launch from a C extension the emulation cannot see into (no ctypes call): numpy's
    C code copying between raw addresses on the CPU; on a GPU the same driver launch as above."""
    if torch.device(device).type == "cuda":
        return _memcpy_launcher(device)
    import numpy as np

    return lambda dst, src, n: np.copyto(np.asarray(_Raw(dst, n // 4)), np.asarray(_Raw(src, n // 4)))


def _launch_behind_dispatcher(launcher) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x, out = _arange(4, device, 1.0), torch.zeros(4, device=device)
        launch = launcher(device)

        def fn():
            launch(out.data_ptr(), x.data_ptr(), 4 * x.element_size())
            return out * 1

        return Instance(fn, lambda: x.add_(1), lambda: x * 1)

    return build


def _out_resized(in_capture: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x = _arange(4, device, 1.0)
        buf = torch.empty(0, device=device)

        def fn():
            out = torch.empty(0, device=device) if in_capture else buf
            torch.mul(x, 3, out=out)  # resized from 0 to 4 elements inside the capture
            return out

        # the warm-up resized buf already: back to no memory, so the capture resizes it
        return Instance(fn, lambda: x.add_(1), lambda: x * 3, reset=lambda: buf.set_())

    return build


def _bool_mask_setitem(scalar: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x = _arange(4, device)
        mask = torch.tensor([True, False, True, False], device=device)
        value = torch.full((1,), 9.0, device=device)
        out = torch.zeros(4, device=device)

        def fn():
            out.copy_(x)
            out[mask] = 9.0 if scalar else value  # scalar: masked_fill_ on a GPU; a device value: nonzero
            return out

        def step():
            x.add_(1)
            mask.copy_(torch.tensor([False, True, False, True]))

        return Instance(fn, step, lambda: torch.where(mask, torch.full_like(x, 9.0), x))

    return build


ROUND_TWO: tuple[Program, ...] = (
    Program(
        "host_compute_h2d",
        "host cumsum of unmarked host lens into a pinned buffer, then non_blocking H2D",
        _host_compute_h2d,
    ),
    Program(
        "pageable_h2d_nonblocking",
        "non_blocking H2D from pageable host memory refilled before replay",
        _pageable_h2d_nonblocking,
    ),
    Program(
        "python_data_to_device", "torch.tensor(python data, device=...) inside the capture", _python_data_to_device
    ),
    Program(
        "pool_shared_output", "a graph's output read after another graph of its pool replayed", _pool_shared(False)
    ),
    Program("pool_output_copied", "the same, the output copied before the other graph replays", _pool_shared(True)),
    Program(
        "stash_read_before_replay", "a tensor stashed during capture, read on the host before any replay", _stash(False)
    ),
    Program("stash_read_after_replay", "the same tensor read after a replay", _stash(True)),
    Program("linalg_info_check", "torch.linalg.cholesky (its error check reads info on the host)", _linalg(True)),
    Program("linalg_ex_no_check", "torch.linalg.cholesky_ex (info stays on the device)", _linalg(False)),
    Program(
        "ctypes_launch",
        "a ctypes call on raw device pointers (a kernel launch behind the dispatcher)",
        _launch_behind_dispatcher(_memcpy_launcher),
    ),
    Program(
        "c_extension_launch",
        "a C extension writing through raw device pointers, no ctypes call",
        _launch_behind_dispatcher(_raw_launcher),
    ),
    Program(
        "out_resized_preexisting",
        "torch.mul(..., out=buf) with buf resized from empty inside the capture",
        _out_resized(False),
    ),
    Program(
        "out_resized_in_capture",
        "torch.mul(..., out=t) with t = torch.empty(0) made inside the capture",
        _out_resized(True),
    ),
    Program(
        "bool_mask_setitem_scalar", "x[mask] = 9.0 with a device mask (masked_fill_ on a GPU)", _bool_mask_setitem(True)
    ),
    Program(
        "bool_mask_setitem_tensor",
        "x[mask] = v with a one-element device tensor v (nonzero)",
        _bool_mask_setitem(False),
    ),
)

# ---- round three: host compute in a custom op's body, memory that moves after capture --------

_PREP: dict[str, torch.Tensor] = {}  # a builder's host buffers, made on its first call


def _prep_body(qsl: torch.Tensor, n: int, pinned: bool) -> None:
    # vLLM runs attention inside a custom op; a builder preparing metadata there makes its CPU
    # buffers on the first call and computes on the host each call: once, at capture, in a graph.
    if "lens" not in _PREP:
        _PREP["lens"] = torch.ones(n, dtype=torch.int32)
        _PREP["staging"] = torch.zeros(n + 1, dtype=torch.int32, pin_memory=pinned)
    torch.cumsum(_PREP["lens"], 0, out=_PREP["staging"][1:])
    qsl.copy_(_PREP["staging"], non_blocking=True)


@torch.library.custom_op("orch_probe::prep_pinned", mutates_args=("qsl",))
def _prep_pinned(qsl: torch.Tensor, n: int) -> None:
    _prep_body(qsl, n, True)


@torch.library.custom_op("orch_probe::prep_pageable", mutates_args=("qsl",))
def _prep_pageable(qsl: torch.Tensor, n: int) -> None:
    _prep_body(qsl, n, False)


def _cpu_compute_in_capture(op) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        _PREP.clear()
        qsl = torch.zeros(4, dtype=torch.int32, device=device)
        x = _arange(4, device)

        def step():
            _PREP["lens"].copy_(torch.tensor([1, 5, 2], dtype=torch.int32))

        def reference():
            q = torch.zeros(4, dtype=torch.int32)
            q[1:] = torch.cumsum(_PREP["lens"], 0)
            return x * q.to(device)

        def fn():
            op(qsl, 3)
            return x * qsl

        return Instance(fn, step, reference)

    return build


@functools.lru_cache(maxsize=1)
def _cached_scale(n: int, device: torch.device) -> torch.Tensor:
    return torch.full((n,), 2.0, device=device)  # a torch.device: device memory under the emulation too


@functools.cache
def _kept_scale(n: int, device: torch.device) -> torch.Tensor:
    return torch.full((n,), 2.0, device=device)


def _per_call_cache(evict: bool) -> Callable[[torch.device], Instance]:
    """evict: a bounded cache whose entry another size evicts (the emulation evicts it at the end
    of the capture, as a busy engine would: backend/graphs/freed.py); else an unbounded cache."""
    cached = _cached_scale if evict else _kept_scale

    def build(device) -> Instance:
        cached.cache_clear()
        x = _arange(4, device, 1.0)

        def step():
            if evict:
                _cached_scale(5, torch.device(device))  # another size: the entry the graph reads goes
                poison_free_memory(torch.device(device))  # a GPU: the freed block holds the poison now

        return Instance(lambda: x * cached(4, torch.device(device)), step, lambda: x * 2)

    return build


def _host_float_from_warmup(device) -> Instance:
    scale, x, held = torch.full((1,), 2.0, device=device), _arange(4, device), {"v": 1.0}

    def fn():
        if not is_capturing():
            held["v"] = float(scale)  # a host copy, refreshed on every eager call (the warm-up)
        return x * held["v"]

    return Instance(fn, lambda: scale.fill_(3.0), lambda: x * scale)


def _pointer_taken_no_launch(device) -> Instance:
    x, out = _arange(4, device), torch.zeros(4, device=device)

    def fn():
        assert out.data_ptr() % out.element_size() == 0  # an alignment check: nothing launched on it
        out.copy_(x * 2)
        return out

    return Instance(fn, lambda: x.add_(1), lambda: x * 2)


ROUND_THREE: tuple[Program, ...] = (
    Program(
        "cpu_compute_in_capture",
        "a custom op's body (made on its first call: CPU lens, pinned staging) does a "
        "host cumsum and a non_blocking H2D",
        _cpu_compute_in_capture(torch.ops.orch_probe.prep_pinned),
    ),
    Program(
        "cpu_compute_in_capture_pageable",
        "the same with a pageable staging buffer",
        _cpu_compute_in_capture(torch.ops.orch_probe.prep_pageable),
    ),
    Program(
        "cache_entry_evicted",
        "a graph captured on an lru_cache hit; the entry evicted and its block poisoned",
        _per_call_cache(True),
    ),
    Program(
        "cache_entry_kept",
        "the same through an unbounded cache (functools.cache), the entry kept",
        _per_call_cache(False),
    ),
    Program(
        "host_float_from_warmup",
        "a host float of a device scale taken in the eager warm-up, used in the capture",
        _host_float_from_warmup,
    ),
    Program(
        "pointer_taken_no_launch",
        "data_ptr() taken in the capture (an alignment check), nothing launched on it",
        _pointer_taken_no_launch,
    ),
)

# ---- host tensors in device work inside the captured region, made as GPU code makes them --------
# On a GPU a host op is not captured (it ran once, at capture), a 0-dim host tensor in a device op
# is a kernel argument baked at capture, and a host index tensor into a device tensor is a pageable
# copy that cannot be captured. Host memory below made the ways vLLM's builders make it: without a
# device, and as numpy memory (torch.from_numpy of a builder's numpy arrays).


def _host_index_into_device(numpy: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        table = _arange(12, device).view(6, 2)
        idx = torch.from_numpy(np.array([0, 1])) if numpy else torch.tensor([0, 1])  # host memory

        def step():
            idx.copy_(torch.tensor([4, 5]))

        return Instance(lambda: table[idx].sum(1), step, lambda: table[idx.to(device)].sum(1))

    return build


def _host_scale_0dim(numpy: bool) -> Callable[[torch.device], Instance]:
    def build(device) -> Instance:
        x = _arange(4, device, 1.0)
        scale = torch.from_numpy(np.array(2.0, dtype=np.float32)) if numpy else torch.tensor(2.0)  # 0-dim host

        return Instance(lambda: x * scale, lambda: scale.fill_(3.0), lambda: x * scale.item())

    return build


def _numpy_lens_cumsum(device) -> Instance:
    lens_np = np.ones(3, dtype=np.int32)  # a builder's host lens, kept as numpy
    lens = torch.from_numpy(lens_np)
    staging = torch.zeros(4, dtype=torch.int32, pin_memory=True)
    qsl = torch.zeros(4, dtype=torch.int32, device=device)
    x = _arange(4, device)

    def fn():
        torch.cumsum(lens, 0, out=staging[1:])  # host work inside forward: once, at capture
        qsl.copy_(staging, non_blocking=True)
        return x * qsl

    def step():
        lens_np[:] = (1, 5, 2)

    def reference():
        q = torch.zeros(4, dtype=torch.int32)
        q[1:] = torch.cumsum(lens, 0)
        return x * q.to(device)

    return Instance(fn, step, reference)


def _pinned_numpy_staging(device) -> Instance:
    # vLLM's CpuGpuBuffer: a pinned buffer and its numpy view; the engine writes the view between
    # steps (outside the graph) and the graph copies the buffer in: fresh.
    staging = torch.zeros(4, dtype=torch.int32, pin_memory=True)
    view = staging.numpy()
    dev = torch.zeros(4, dtype=torch.int32, device=device)
    x = _arange(4, device)

    def fn():
        dev.copy_(staging, non_blocking=True)
        return x * dev

    def step():
        view[:] = (0, 1, 6, 8)

    return Instance(fn, step, lambda: x * torch.tensor([0, 1, 6, 8], dtype=torch.int32).to(device))


HOST_WORK: tuple[Program, ...] = (
    Program(
        "host_index_into_device",
        "a device table indexed by a host index tensor (made without a device)",
        _host_index_into_device(False),
    ),
    Program(
        "numpy_index_into_device",
        "a device table indexed by torch.from_numpy of a host index array",
        _host_index_into_device(True),
    ),
    Program(
        "host_scale_0dim",
        "a 0-dim host tensor (made without a device) as a device op's scale, changed after capture",
        _host_scale_0dim(False),
    ),
    Program("numpy_scale_0dim", "the same 0-dim scale made by torch.from_numpy", _host_scale_0dim(True)),
    Program(
        "numpy_lens_cumsum_pinned",
        "torch.cumsum of numpy-backed host query lens in forward into a pinned staging, then non_blocking H2D",
        _numpy_lens_cumsum,
    ),
    Program(
        "pinned_numpy_staging_refreshed",
        "control: a pinned staging's numpy view written between steps, copied in by the graph",
        _pinned_numpy_staging,
    ),
)

# Probes added after the last recording: their CUDA verdicts in golden_cuda.json are derived from
# CUDA semantics ("derived" there, with the reasoning) until benchmarks/gpu_equivalence.py records them.

PROGRAMS: tuple[Program, ...] = BASE_PROGRAMS + NEW_PROGRAMS + ROUND_TWO + ROUND_THREE + HOST_WORK

# Where the emulation cannot be faithful: probe -> (its verdict, a phrase its error must contain).
CONSERVATIVE: dict[str, tuple[str, str]] = {
    "library_impl_host_global": ("capture-error", "cannot emulate: custom op"),
}
# Where the emulation says it cannot know (the graph's `unverifiable` notes, never a pass):
# probe -> a phrase its note must contain.
UNVERIFIABLE: dict[str, str] = {
    "c_extension_launch": "raw pointer left the dispatcher",
    "pointer_taken_no_launch": "raw pointer left the dispatcher",
}
