"""The agent's NVML discovery, feature labels and node validation checks on a real NVIDIA GPU (never changes
GPU settings).

Without NVML (no driver, or nvidia-ml-py missing) it says so and exits 0. Otherwise it discovers the GPUs
with the agent's NVML backend, prints the feature labels the agent would patch onto the node, and runs the
four validation checks as the agent runs them on a real node: driver, toolkit (the host's config and
nvidia-ctk, where visible), isolation (the interception library, built here, loads in a child process)
and workload (a child process allocates, writes and reads 1 MiB on each GPU through the CUDA driver API).
Each with its time. The last line is one JSON object.

    python benchmarks/node_checks_gpu.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpupool.agent.state.validation import Result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# The workload check runs `python -m gpupool.agent.checks.workload` in a child: it must find this tree too.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])


def main() -> None:
    from gpupool.agent.checks import driver, isolation, toolkit, workload
    from gpupool.agent.devices.discovery import DiscoveryError
    from gpupool.agent.devices.inventory import labels_for
    from gpupool.agent.devices.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
        start = time.monotonic()
        found = backend.discover()
        discover_s = time.monotonic() - start
    except (DiscoveryError, ImportError, OSError) as e:
        print(f"node_checks_gpu needs an NVIDIA driver and nvidia-ml-py: {e}; nothing measured")
        print(json.dumps({"benchmark": "node_checks_gpu", "skipped": str(e)}))
        return
    gpus = [{"index": g.index, "model": g.model, "memory_mib": g.memory_mib, "numa_node": g.numa_node,
             "compute_capability": g.compute_capability} for g in found.devices]
    print(f"discovered in {discover_s:.2f} s: driver {found.driver_version}, CUDA {found.cuda_version}, {gpus}")
    labels = labels_for(found)
    print("labels:", json.dumps(labels, sort_keys=True))
    spec = importlib.util.spec_from_file_location("gpupool_native_build", ROOT / "native" / "build.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    checks: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        library = native.compile_library(Path(tmp) / "libgpupool_hook.so")
        steps: dict[str, Callable[[], Result]] = {
            "driver": lambda: driver.check(backend), "toolkit": toolkit.check,
            "isolation": lambda: isolation.check(library, {}, None),
            "workload": lambda: workload.check(len(found.devices))}
        for name, run in steps.items():
            start = time.monotonic()
            result = run()
            checks[name] = {"ok": result.ok, "reason": result.reason, "seconds": round(time.monotonic() - start, 2)}
            print(f"{name}: {'ok' if result.ok else 'FAILED'} {result.reason} ({checks[name]['seconds']} s)")
    print(json.dumps({"benchmark": "node_checks_gpu", "driver": found.driver_version, "gpus": gpus,
                      "discover_s": round(discover_s, 3), "labels": labels, "checks": checks,
                      "cores": os.cpu_count()}))


if __name__ == "__main__":
    main()
