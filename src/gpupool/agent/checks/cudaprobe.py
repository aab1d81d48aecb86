"""The CUDA driver API through ctypes, for what must run a kernel without a CUDA toolkit or PyTorch: the
`isolation` validation probe (gpupool.agent.checks.isolation) and the real-GPU benchmark
(benchmarks/isolation_gpu.py).

- `Driver`: libcuda.so.1 with the prototypes of the calls used here; a failing call raises `CudaError`
  naming the call and the CUDA error code.
- `Spin`: one kernel, `spin_us(u64 n, u64 sink)`, written in PTX here and JIT-compiled by the driver (no
  toolkit needed): every thread runs n dependent FMAs, so its length scales with n and it keeps the GPU's
  time busy however the GPU slices it. One block per SM. With `fake=True` the module image is the one the
  simulated GPU of the tests understands (tests/native/fakes/fake_cuda.c: `spin_us` occupies the device
  for n microseconds), so the same code runs there; n is then microseconds, one per unit.
- `Timeline`: the device time of batches of work on one stream, measured with CUDA events on the device's
  own clock, never with anything an interception library sees or computes.

Why not "event, launch, event": an event recorded *before* a launch completes as soon as the stream is
idle, and a library that paces launches (by waiting inside cuLaunchKernel) leaves the stream idle while it
waits, so the span would count the wait as device time. Instead the host clock is read right *after* the
first launch of a batch returns (so after any wait), an event is recorded after the batch's last launch,
and the batch's span runs from max(that reading, end of the previous batch) to the event, on the host's
clock (the events' device times are placed on it through one event synchronised at the start). Error: the
few microseconds between a launch reaching an idle GPU and the host reading its clock, once per batch that
starts on an idle stream. What this cannot see: while another context holds the GPU, a queued batch's span
includes the neighbour's time. Where a batch's length alone is known (`Span.solo_ns`), `Span.device_ns`
corrects both.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
ATTR_MULTIPROCESSOR_COUNT = 16
SPIN_BLOCK = 128
FAKE_SPIN_IMAGE = b"gpupool-fake-module:spin_us\0"

# Each thread: n iterations of a dependent FMA chain (x = x * 0.999 + 1 converges to 1000, so it never
# equals -1: the store below never happens, but the compiler cannot drop the loop as dead code).
SPIN_PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_us(
    .param .u64 spin_us_n,
    .param .u64 spin_us_sink
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [spin_us_n];
    ld.param.u64 %rd2, [spin_us_sink];
    mov.b64 %rd3, 0;
    mov.u32 %r1, %tid.x;
    cvt.rn.f32.u32 %f1, %r1;
    mov.f32 %f2, 0f3F7FBE77;
$L_loop:
    setp.ge.u64 %p1, %rd3, %rd1;
    @%p1 bra $L_done;
    fma.rn.f32 %f1, %f1, %f2, 0f3F800000;
    add.u64 %rd3, %rd3, 1;
    bra.uni $L_loop;
$L_done:
    setp.eq.f32 %p2, %f1, 0fBF800000;
    @!%p2 bra $L_end;
    cvta.to.global.u64 %rd4, %rd2;
    st.global.f32 [%rd4], %f1;
$L_end:
    ret;
}
""" + b"\0"

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_PP = ctypes.POINTER(ctypes.c_void_p)
_PROTOTYPES: dict[str, list[object]] = {
    "cuInit": [_U],
    "cuDriverGetVersion": [ctypes.POINTER(_I)],
    "cuDeviceGetCount": [ctypes.POINTER(_I)],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetName": [ctypes.c_char_p, _I, _I],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDevicePrimaryCtxRetain": [_PP, _I],
    "cuDevicePrimaryCtxRelease_v2": [_I],
    "cuCtxSetCurrent": [_P],
    "cuModuleLoadData": [_PP, ctypes.c_char_p],
    "cuModuleGetFunction": [_PP, _P, ctypes.c_char_p],
    "cuModuleUnload": [_P],
    "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemGetInfo_v2": [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    "cuStreamCreate": [_PP, _U],
    "cuStreamDestroy_v2": [_P],
    "cuStreamSynchronize": [_P],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP],
    "cuEventCreate": [_PP, _U],
    "cuEventDestroy_v2": [_P],
    "cuEventRecord": [_P, _P],
    "cuEventSynchronize": [_P],
    "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "cuGraphCreate": [_PP, _U],
    "cuGraphAddKernelNode": [_PP, _P, _PP, ctypes.c_size_t, _P],
    "cuGraphInstantiateWithFlags": [_PP, _P, ctypes.c_ulonglong],
    "cuGraphLaunch": [_P, _P],
    "cuGraphExecDestroy": [_P],
    "cuGraphDestroy": [_P],
}


class CudaError(Exception):
    """A driver call failed (`code`: its CUDA error), or the driver could not be reached at all (code -1)."""

    def __init__(self, call: str, code: int, message: str | None = None) -> None:
        super().__init__(message or f"{call} returned CUDA error {code}")
        self.call, self.code = call, code


class Driver:
    """libcuda.so.1 (whatever the dynamic loader finds: with an interception library preloaded, its
    wrappers answer first, as in any tenant)."""

    def __init__(self, name: str = "libcuda.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as e:
            raise CudaError(name, -1, f"cannot load {name}: {e}") from None
        self._fns: dict[str, Any] = {}

    def fn(self, name: str) -> Any:
        f = self._fns.get(name)
        if f is None:
            try:
                f = getattr(self.lib, name)
            except AttributeError:
                raise CudaError(name, -1, f"the driver does not export {name}") from None
            f.argtypes = _PROTOTYPES[name]
            f.restype = ctypes.c_int
            self._fns[name] = f
        return f

    def code(self, name: str, *args: object) -> int:
        """The call's CUDA result, without raising."""
        rc: int = self.fn(name)(*args)
        return rc

    def call(self, name: str, *args: object) -> None:
        rc = self.code(name, *args)
        if rc != CUDA_SUCCESS:
            raise CudaError(name, rc)

    def init(self) -> int:
        """cuInit; the number of devices."""
        self.call("cuInit", 0)
        n = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def version(self) -> str:
        v = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return f"{v.value // 1000}.{v.value % 1000 // 10}"

    def name(self, device: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", buf, 256, device)
        return buf.value.decode(errors="replace")

    def attribute(self, device: int, attr: int) -> int:
        v = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(v), attr, device)
        return v.value

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device, as CUDA reports them to this process."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc(self, nbytes: int) -> int:
        """A device pointer; raises CudaError (code CUDA_ERROR_OUT_OF_MEMORY when refused)."""
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def free(self, ptr: int) -> None:
        self.call("cuMemFree_v2", ctypes.c_uint64(ptr))


@dataclass
class Context:
    """The device's primary context, current on this thread (as the `workload` check uses it)."""

    driver: Driver
    device: int
    handle: ctypes.c_void_p = field(default_factory=ctypes.c_void_p)

    def __enter__(self) -> Context:
        dev = ctypes.c_int()
        self.driver.call("cuDeviceGet", ctypes.byref(dev), self.device)
        self.driver.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.handle), dev)
        self.driver.call("cuCtxSetCurrent", self.handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.driver.code("cuDevicePrimaryCtxRelease_v2", self.device)


class Stream:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.handle = ctypes.c_void_p()
        driver.call("cuStreamCreate", ctypes.byref(self.handle), 0)

    def synchronize(self) -> None:
        self.driver.call("cuStreamSynchronize", self.handle)

    def destroy(self) -> None:
        self.driver.code("cuStreamDestroy_v2", self.handle)


class Event:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.handle = ctypes.c_void_p()
        driver.call("cuEventCreate", ctypes.byref(self.handle), 0)  # default flags: timing on

    def record(self, stream: Stream) -> None:
        self.driver.call("cuEventRecord", self.handle, stream.handle)

    def synchronize(self) -> None:
        self.driver.call("cuEventSynchronize", self.handle)

    def since(self, earlier: Event) -> int:
        """Device nanoseconds from `earlier` to this event (both completed)."""
        ms = ctypes.c_float()
        self.driver.call("cuEventElapsedTime", ctypes.byref(ms), earlier.handle, self.handle)
        return round(ms.value * 1e6)

    def destroy(self) -> None:
        self.driver.code("cuEventDestroy_v2", self.handle)


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (v1), what cuGraphAddKernelNode takes."""

    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p))]


class Spin:
    """The spin kernel, loaded into the current context. `per_us`: loop iterations per microsecond of
    device time (calibrate with `calibrate`; the simulated GPU takes microseconds directly)."""

    def __init__(self, driver: Driver, device: int, fake: bool = False, per_us: float = 250.0) -> None:
        self.driver, self.fake = driver, fake
        self.per_us = 1.0 if fake else per_us
        self.module = ctypes.c_void_p()
        self.function = ctypes.c_void_p()
        driver.call("cuModuleLoadData", ctypes.byref(self.module), FAKE_SPIN_IMAGE if fake else SPIN_PTX)
        driver.call("cuModuleGetFunction", ctypes.byref(self.function), self.module, b"spin_us")
        self.grid = max(1, driver.attribute(device, ATTR_MULTIPROCESSOR_COUNT))
        self.sink = driver.alloc(256)
        self._sink_arg = ctypes.c_uint64(self.sink)

    def iterations(self, us: float) -> int:
        return max(1, round(us * self.per_us))

    def _params(self, n: ctypes.c_uint64) -> ctypes.Array[ctypes.c_void_p]:
        return (ctypes.c_void_p * 2)(ctypes.addressof(n), ctypes.addressof(self._sink_arg))

    def launch(self, stream: Stream, us: float) -> None:
        n = ctypes.c_uint64(self.iterations(us))
        self.driver.call("cuLaunchKernel", self.function, self.grid, 1, 1, SPIN_BLOCK, 1, 1, 0, stream.handle,
                         self._params(n), None)

    def graph(self, lengths_us: list[float]) -> Graph:
        return Graph(self, lengths_us)

    def calibrate(self, stream: Stream, target_us: float = 1000.0, count: int = 20) -> float:
        """Set `per_us` from back-to-back kernels timed with events (uncapped, nothing else on the GPU)."""
        if self.fake:
            return self.per_us
        n_us = 20.0
        for _ in range(4):
            took = time_launches(self, stream, [n_us] * count) / count / 1000
            self.per_us = self.per_us * n_us / took if took > 0 else self.per_us
            if abs(took - target_us) < 0.2 * target_us:
                break
            n_us = target_us
        return self.per_us

    def close(self) -> None:
        self.driver.code("cuMemFree_v2", ctypes.c_uint64(self.sink))
        self.driver.code("cuModuleUnload", self.module)


class Graph:
    """A CUDA graph of spin kernels in a chain, instantiated. On the simulated GPU a graph is its length
    (its CUgraphExec handle is the number of microseconds it occupies the device: fake_state.h)."""

    def __init__(self, spin: Spin, lengths_us: list[float]) -> None:
        self.driver = spin.driver
        self.graph = ctypes.c_void_p()
        self.exec = ctypes.c_void_p()
        if spin.fake:
            self.exec = ctypes.c_void_p(max(1, round(sum(lengths_us))))
            return
        d = self.driver
        d.call("cuGraphCreate", ctypes.byref(self.graph), 0)
        previous: ctypes.c_void_p | None = None
        keep = []
        for us in lengths_us:
            n = ctypes.c_uint64(spin.iterations(us))
            params = spin._params(n)
            keep.append((n, params))
            node_params = _KernelNodeParams(spin.function, spin.grid, 1, 1, SPIN_BLOCK, 1, 1, 0,
                                            ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)), None)
            node = ctypes.c_void_p()
            deps = (ctypes.c_void_p * 1)(previous) if previous is not None else None
            d.call("cuGraphAddKernelNode", ctypes.byref(node), self.graph, deps, 1 if deps else 0,
                   ctypes.byref(node_params))
            previous = node
        d.call("cuGraphInstantiateWithFlags", ctypes.byref(self.exec), self.graph, 0)

    def launch(self, stream: Stream) -> None:
        self.driver.call("cuGraphLaunch", self.exec, stream.handle)

    def close(self) -> None:
        if self.graph.value:
            self.driver.code("cuGraphExecDestroy", self.exec)
            self.driver.code("cuGraphDestroy", self.graph)


def time_launches(spin: Spin, stream: Stream, lengths_us: list[float]) -> int:
    """Device nanoseconds that `lengths_us` back to back take (events around the whole run, after a sync:
    nothing here waits between the two events but the kernels)."""
    stream.synchronize()
    a, b = Event(spin.driver), Event(spin.driver)
    try:
        a.record(stream)
        for us in lengths_us:
            spin.launch(stream, us)
        b.record(stream)
        b.synchronize()
        return b.since(a)
    finally:
        a.destroy()
        b.destroy()


@dataclass(frozen=True, slots=True)
class Span:
    """One launch's (or batch's) device time on the host's CLOCK_MONOTONIC (ns): from `start` to `end`;
    `after`: the end of the one before it on the stream (0: none); `solo_ns`: its length measured alone
    (0: unknown)."""

    start: int
    end: int
    solo_ns: int = 0
    after: int = 0

    def device_ns(self, shared: bool = False) -> int:
        """Device time counted for it. Its span, read from the events; where its solo length is known:
        - alone on the GPU (`shared` false), at least the solo length, unless the previous one ended
          closer to its end than that: a span that starts when the host read its clock after the launch
          returned misses the part of the kernel that ran before (the latency of that return);
        - beside other contexts (`shared`), at most the solo length: the GPU time-slices, so a span holds
          the neighbours' slices that ran while it was queued or interrupted."""
        span = self.end - self.start
        if not self.solo_ns:
            return span
        since_previous = self.end - self.after if self.after else span
        if shared:
            return min(self.solo_ns, since_previous)
        return max(span, min(self.solo_ns, since_previous))


class Timeline:
    """Batches of work on `stream`, timed by events (module docstring). Use: launch the batch's first
    kernel, `started()`, launch the rest, `ended(solo_ns)`. At most `depth` batches are in flight: the
    oldest is waited for beyond that, which keeps the device queue bounded (and the host's memory)."""

    def __init__(self, driver: Driver, stream: Stream, depth: int = 32) -> None:
        self.driver, self.stream, self.depth = driver, stream, depth
        self._free: list[Event] = []
        self._inflight: deque[tuple[int, Event, int]] = deque()
        self._marker = 0
        self._last_end_ns = 0
        self.spans: list[Span] = []
        self.base = Event(driver)
        before = time.monotonic_ns()
        self.base.record(stream)
        self.base.synchronize()
        # The base event completed between these two reads (the stream is idle): the device clock's zero
        # on the host clock, to within half their distance.
        self.base_host_ns = (before + time.monotonic_ns()) // 2

    def _event(self) -> Event:
        return self._free.pop() if self._free else Event(self.driver)

    def started(self) -> None:
        self._marker = time.monotonic_ns()

    def ended(self, solo_ns: int = 0) -> None:
        assert self._marker, "ended() without started()"
        end = self._event()
        end.record(self.stream)
        self._inflight.append((self._marker, end, solo_ns))
        self._marker = 0
        while len(self._inflight) > self.depth:
            self._retire()

    def _retire(self) -> None:
        marker, end, solo = self._inflight.popleft()
        end.synchronize()
        end_ns = self.base_host_ns + end.since(self.base)
        # (a batch can end before the host read its clock only if it is shorter than a launch's return)
        start_ns = min(max(marker, self._last_end_ns), end_ns)
        self.spans.append(Span(start_ns, end_ns, solo, self._last_end_ns))
        self._last_end_ns = end_ns
        if end_ns - self.base_host_ns > 500_000_000:
            # Elapsed times are single-precision milliseconds: measure from a recent event, not the first.
            self._free.append(self.base)
            self.base, self.base_host_ns = end, end_ns
        else:
            self._free.append(end)

    def drain(self) -> list[Span]:
        while self._inflight:
            self._retire()
        return self.spans

    def close(self) -> None:
        for _, end, _ in self._inflight:
            end.destroy()
        for e in self._free:
            e.destroy()
        self.base.destroy()


def busy_between(spans: list[Span], t0: int, t1: int, shared: bool = False) -> int:
    """Device time of `spans` inside [t0, t1] (`Span.device_ns`), each spread evenly over its span."""
    total = 0.0
    for s in spans:
        lo, hi = max(s.start, t0), min(s.end, t1)
        if hi > lo and s.end > s.start:
            total += s.device_ns(shared) * (hi - lo) / (s.end - s.start)
    return round(total)
