"""gpupool.agent.checks.cudaprobe's Timeline on the simulated GPU: the device time it measures for a loop of
kernels is what the device's own kernel log says the loop occupied, also while the interception library
paces the launches (its waits inside cuLaunchKernel are not counted), which an event recorded before each
launch would count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.native.native_helpers import kernel_log

ROOT = Path(__file__).resolve().parents[3]

# In the child: 1.5 s of 5 ms spin kernels, each timed by the Timeline. With "naive", each is also timed by an
# event recorded before its launch and one after it, waited for at once (so nothing queues); without, up to
# 4 kernels queue as in any busy loop.
LOOP = r"""
import json, os, sys, time
from gpupool.agent.checks.cudaprobe import Context, Driver, Event, Spin, Stream, Timeline, busy_between
naive_too = sys.argv[1] == "naive"
d = Driver()
d.init()
with Context(d, 0):
    spin, stream = Spin(d, 0, fake=True), Stream(d)
    timeline = Timeline(d, stream, depth=4)
    before, after = Event(d), Event(d)
    naive = 0
    t0 = time.monotonic_ns()
    while time.monotonic_ns() < t0 + 1_500_000_000:
        before.record(stream)
        spin.launch(stream, 5000)
        timeline.started()
        timeline.ended()
        if naive_too:
            after.record(stream)
            after.synchronize()
            naive += after.since(before)
    spans = timeline.drain()
    t1 = max(time.monotonic_ns(), spans[-1].end)
print(json.dumps({"pid": os.getpid(), "t0": t0, "t1": t1, "timeline": busy_between(spans, t0, t1), "naive": naive,
                  "count": len(spans)}))
"""


def _loop(env: dict[str, str], naive: bool) -> dict[str, int]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "FAKE_GPU_"))}
    base.pop("LD_PRELOAD", None)
    base["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run([sys.executable, "-c", LOOP, "naive" if naive else "queued"], env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _logged(state: Path, r: dict[str, int]) -> int:
    return sum(min(end, r["t1"]) - max(start, r["t0"]) for pid, start, end in kernel_log(state)
               if pid == r["pid"] and end > r["t0"] and start < r["t1"])


def test_the_timeline_measures_what_the_device_ran(gpu: dict[str, str]) -> None:
    r = _loop(gpu, naive=False)
    logged = _logged(Path(gpu["FAKE_GPU_STATE"]), r)
    assert r["count"] > 30 and logged > 0
    assert abs(r["timeline"] - logged) <= 0.02 * logged


def test_paced_by_the_library_the_timeline_leaves_out_the_waits_an_event_before_the_launch_counts(
        gpu: dict[str, str], library: Path, tmp_path: Path) -> None:
    r = _loop({**gpu, "LD_PRELOAD": str(library), "GPUPOOL_CORES_PERCENT": "30",
               "GPUPOOL_HOOK_DIR": str(tmp_path)}, naive=True)
    state = Path(gpu["FAKE_GPU_STATE"])
    logged = _logged(state, r)
    assert r["count"] > 10
    assert logged < 0.6 * (r["t1"] - r["t0"])  # the library did pace the loop: the waits are there to count
    # Every paced kernel starts on an idle stream, where the Timeline reads low by the launch's return latency
    # (documented in cudaprobe); never high.
    assert 0.9 * logged <= r["timeline"] <= 1.01 * logged
    assert r["naive"] > 1.3 * logged
