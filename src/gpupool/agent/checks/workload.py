"""Validation step `workload`: a tiny CUDA workload runs on every GPU.

A child process (`python -m gpupool.agent.checks.workload <n>`) initialises the CUDA driver API through
ctypes, and on each of the n GPUs creates a context, allocates 1 MiB, writes a byte pattern, reads it
back and frees it. It runs apart from the agent so a hung driver call is bounded by a timeout and the agent
never holds a context (its process would hold GPU memory and show up to the watchdog).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

from gpupool.agent.state.validation import Result

PATTERN = 0x5A
SIZE = 1 << 20


def _cuda_check(expected: int) -> str | None:
    """The workload itself (in the child): None when every GPU ran it."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"cannot load libcuda.so.1: {e}"

    def call(name: str, *args: object) -> None:
        rc = getattr(cuda, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned CUDA error {rc}")

    try:
        call("cuInit", 0)
        count = ctypes.c_int()
        call("cuDeviceGetCount", ctypes.byref(count))
        if count.value != expected:
            return f"CUDA sees {count.value} GPU(s), discovery {expected}"
        for i in range(count.value):
            dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
            call("cuDeviceGet", ctypes.byref(dev), i)
            call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            try:
                call("cuCtxSetCurrent", ctx)
                call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(SIZE))
                call("cuMemsetD8_v2", ptr, ctypes.c_ubyte(PATTERN), ctypes.c_size_t(SIZE))
                back = (ctypes.c_ubyte * SIZE)()
                call("cuMemcpyDtoH_v2", back, ptr, ctypes.c_size_t(SIZE))
                call("cuMemFree_v2", ptr)
                if any(b != PATTERN for b in bytes(back)):
                    return f"GPU {i}: memory read back differs from what was written"
            finally:
                cuda.cuDevicePrimaryCtxRelease_v2(dev)
    except RuntimeError as e:
        return str(e)
    return None


def check(expected_gpus: int, timeout_s: float = 60.0) -> Result:
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(expected_gpus)], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Result.failed(f"the CUDA check did not finish within {timeout_s:g} s")
    except OSError as e:
        return Result.failed(f"cannot start the CUDA check: {e}")
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        return Result.failed(lines[-1] if lines else f"the CUDA check exited with {done.returncode}")
    return Result.passed()


if __name__ == "__main__":
    problem = _cuda_check(int(sys.argv[1]))
    if problem is not None:
        print(problem)
        sys.exit(1)
