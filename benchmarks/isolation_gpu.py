"""gpupool's CUDA interception library on a real NVIDIA GPU, with PyTorch (never changes GPU settings).

Without a GPU (or without PyTorch with CUDA) it says so and exits 0. Otherwise it builds the library and
grants every child as the agent does: the limits in a limits.v1 written by the agent's own writer
(gpupool.agent.hookdir.write_limits), handed to the child read-only at the library's fixed limits path (the
library is built with that path at /proc/self/fd/201, the test suite's stand-in for the read-only mount at
/run/gpupool/limits), the accounting in its own directory, and the limits in the environment too, as
today's grant sets them. Then:
1. memory: a process with a 10 GiB share (GPUPOOL_MEMORY_LIMIT_MIB=10240) allocates in 64 MiB, then 1 MiB
   steps until refused (PyTorch's caching off, so every tensor is one cuMemAlloc), then tries 1 MiB more;
   it reports what torch.cuda.mem_get_info and nvidia-smi (run under the same preload) say the card holds;
2. compute: the same matmul loop alone uncapped, then in two processes capped 30 and 70 at once: their
   throughputs, ratio and each one's share of the uncapped rate; then each cap alone;
3. overhead at cap 100: a matmul loop and a small-kernel loop with and without the library (median of 3
   rounds, alternating which goes first);
4. the hostile tenant: the memory child again with GPUPOOL_MEMORY_LIMIT_MIB unset, then raised to 65536,
   then GPUPOOL_HOOK_DIR pointed elsewhere: each must still stop at 10 GiB.
The last line is one JSON object.

    python benchmarks/isolation_gpu.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MEMORY_CHILD = r"""
import json, shutil, subprocess, torch
# Without the caching allocator a refused cuMemAlloc reaches PyTorch 2.11 as AcceleratorError, not
# OutOfMemoryError; both are RuntimeErrors that say "out of memory".
def refused(e):
    if "out of memory" not in str(e):
        raise e
free, total = torch.cuda.mem_get_info()
held, step, refused_at = [], 64 << 20, None
while step >= 1 << 20:
    try:
        held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
    except RuntimeError as e:
        refused(e)
        step //= 64 if step == 64 << 20 else 2
allocated = sum(t.numel() for t in held)
try:
    held.append(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    beyond = "succeeded"
except RuntimeError as e:
    refused(e)
    beyond = "refused"
smi = ""
if shutil.which("nvidia-smi"):  # under the same LD_PRELOAD: NVML's memory figures are the share
    # pass_fds: nvidia-smi must see the limits file too, as every process in the pod sees the mount
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
                         capture_output=True, text=True, pass_fds=(201,)).stdout.strip().splitlines()[0]
print(json.dumps({"reported_total_mib": total >> 20, "reported_free_mib": free >> 20,
                  "allocated_mib": allocated / 2**20, "one_mib_beyond": beyond, "nvidia_smi": smi}))
"""

LOOP_CHILD = r"""
import json, sys, time, torch
kind, seconds = sys.argv[1], float(sys.argv[2])
if kind == "matmul":
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    step = lambda: a @ a
else:
    x = torch.zeros(1024, device="cuda")
    step = lambda: x.add_(1)
for _ in range(20):
    step()
torch.cuda.synchronize()
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    n += 10
print(json.dumps({"rate": n / (time.perf_counter() - t0)}))
"""


def gpu_available() -> str | None:
    """None when usable, else why not."""
    try:
        torch: Any = importlib.import_module("torch")  # optional: this benchmark only
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no NVIDIA GPU visible to PyTorch"
    return None


LIMITS_FD = 201  # the library below is built with GP_LIMITS_PATH=/proc/self/fd/201


def child_env(lib: Path | None, hook_dir: Path, **limits: str) -> dict[str, str]:
    """The child's environment. With the library, `hook_dir` gets the agent's layout: limits/limits.v1 (from
    the GPUPOOL_* values given, as the agent writes it) and hook/ for the accounting. A value of "" removes
    the variable from the environment (the tenant unsetting it); the file keeps the grant."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.pop("LD_PRELOAD", None)
    if lib is not None:
        from gpupool.agent.hookdir import HookLimits, accounting_dir, limits_dir, write_limits

        grant = {k: v for k, v in limits.items() if not k.startswith("TAMPER_")}
        accounting_dir(hook_dir).mkdir(parents=True, exist_ok=True)
        write_limits(limits_dir(hook_dir), HookLimits(
            memory_mib=(int(grant.get("GPUPOOL_MEMORY_LIMIT_MIB", "0")),),
            cores=(float(grant.get("GPUPOOL_CORES_PERCENT", "100")),),
            accounting_dir=str(accounting_dir(hook_dir))))
        env["LD_PRELOAD"] = str(lib)
        env["GPUPOOL_HOOK_DIR"] = str(accounting_dir(hook_dir))
        env.update(grant)
        for key, value in limits.items():
            if key.startswith("TAMPER_"):
                name = key.removeprefix("TAMPER_")
                if value:
                    env[name] = value
                else:
                    env.pop(name, None)
        env["GPUPOOL_BENCH_LIMITS"] = str(limits_dir(hook_dir) / "limits.v1")
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def _spawn(code: str, env: dict[str, str], args: tuple[str, ...], wait: bool) -> Any:
    """Run the child with its limits file as descriptor LIMITS_FD, read-only (the agent's read-only mount)."""
    limits = env.pop("GPUPOOL_BENCH_LIMITS", None)
    fds: tuple[int, ...] = ()
    fd = -1
    if limits is not None:
        fd = os.open(limits, os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(fd, LIMITS_FD, inheritable=False)
        fds = (LIMITS_FD,)
    try:
        argv = [sys.executable, "-c", code, *args]
        if wait:
            return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, pass_fds=fds)
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                pass_fds=fds)
    finally:
        if fd >= 0:
            os.close(LIMITS_FD)
            os.close(fd)


def run_child(code: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    done = _spawn(code, env, args, wait=True)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def start_child(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc: subprocess.Popen[str] = _spawn(code, env, args, wait=False)
    return proc


def collect(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {err[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    why = gpu_available()
    if why is not None:
        print(f"isolation_gpu needs an NVIDIA GPU and PyTorch with CUDA: {why}; nothing measured")
        print(json.dumps({"benchmark": "isolation_gpu", "skipped": why}))
        return
    if shutil.which(os.environ.get("CC", "cc")) is None:
        raise SystemExit("needs a C compiler (cc) to build the library")
    spec = importlib.util.spec_from_file_location("gpupool_native_build", ROOT / "native" / "build.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)

    secs = str(args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lib: Path = native.compile_library(root / "libgpupool_hook.so",
                                           [f'-DGP_LIMITS_PATH="/proc/self/fd/{LIMITS_FD}"'])
        dirs = [root / f"pod{i}" for i in range(8)]
        for d in dirs:
            d.mkdir()
        memory = run_child(MEMORY_CHILD, child_env(lib, dirs[0], GPUPOOL_MEMORY_LIMIT_MIB="10240"))
        print("memory, 10 GiB share:", json.dumps(memory))
        alone = run_child(LOOP_CHILD, child_env(None, dirs[1]), "matmul", secs)["rate"]
        a = start_child(LOOP_CHILD, child_env(lib, dirs[2], GPUPOOL_CORES_PERCENT="30"), "matmul", secs)
        b = start_child(LOOP_CHILD, child_env(lib, dirs[3], GPUPOOL_CORES_PERCENT="70"), "matmul", secs)
        rate30, rate70 = collect(a)["rate"], collect(b)["rate"]
        print(f"matmul it/s: uncapped alone {alone:.1f}; capped 30 -> {rate30:.1f}, capped 70 -> {rate70:.1f}")
        # Each cap alone too: pacing accuracy on its own, apart from how two contexts time-slice the GPU.
        solo = {cap: run_child(LOOP_CHILD, child_env(lib, dirs[2], GPUPOOL_CORES_PERCENT=cap), "matmul",
                               secs)["rate"] for cap in ("30", "70")}
        print(f"matmul it/s, each capped alone: 30 -> {solo['30']:.1f}, 70 -> {solo['70']:.1f}")
        overhead = {}
        for kind in ("matmul", "small"):
            # Alternate which runs first, median of three rounds: the GPU's clocks warm up over a run.
            plain_rates: list[float] = []
            hooked_rates: list[float] = []
            for round_ in range(3):
                order = ("plain", "hooked") if round_ % 2 == 0 else ("hooked", "plain")
                for which in order:
                    env = (child_env(None, dirs[1]) if which == "plain" else child_env(
                        lib, dirs[1], GPUPOOL_CORES_PERCENT="100", GPUPOOL_MEMORY_LIMIT_MIB="10240"))
                    rate = run_child(LOOP_CHILD, env, kind, secs)["rate"]
                    (plain_rates if which == "plain" else hooked_rates).append(rate)
            plain, hooked = statistics.median(plain_rates), statistics.median(hooked_rates)
            overhead[kind] = round((plain - hooked) / plain * 100, 2)
            print(f"{kind} loop at cap 100 (median of 3, alternating): {plain:.1f} it/s without, "
                  f"{hooked:.1f} with ({overhead[kind]} % slower)")
        elsewhere = root / "elsewhere"
        elsewhere.mkdir()
        tampers = {"variable unset": {"TAMPER_GPUPOOL_MEMORY_LIMIT_MIB": ""},
                   "variable raised to 65536": {"TAMPER_GPUPOOL_MEMORY_LIMIT_MIB": "65536"},
                   "GPUPOOL_HOOK_DIR elsewhere": {"TAMPER_GPUPOOL_HOOK_DIR": str(elsewhere)}}
        tampered = {}
        for (name, tamper), d in zip(tampers.items(), dirs[4:], strict=False):
            tampered[name] = run_child(MEMORY_CHILD, child_env(lib, d, GPUPOOL_MEMORY_LIMIT_MIB="10240", **tamper))
            print(f"tenant tamper, {name}:", json.dumps(tampered[name]))
    print(json.dumps({
        "benchmark": "isolation_gpu",
        "memory": memory,
        "matmul_rate_alone": round(alone, 2),
        "rate_30": round(rate30, 2),
        "rate_70": round(rate70, 2),
        "ratio_70_over_30": round(rate70 / rate30, 3) if rate30 else None,
        "share_30_of_alone": round(rate30 / alone, 3),
        "share_70_of_alone": round(rate70 / alone, 3),
        "share_of_alone_each_alone": {cap: round(rate / alone, 3) for cap, rate in solo.items()},
        "overhead_percent_at_cap_100": overhead,
        "tampered": tampered,
    }))


if __name__ == "__main__":
    main()
