"""The reclaim squeeze on the simulated device: the node agent's writer (gpupool.agent.state.hookdir.write_squeeze)
lowers a running pod's compute cap through its shared file and lifts it again, without the pod restarting.
Shares are read from the fake device's kernel log (its own clock), as in test_hook_compute.py; the write
times only place the windows, each of which skips the first 0.4 s after a change (settling) and must hold
the cap within the issue's +-5 points."""

from __future__ import annotations

import time

import pytest

from gpupool.agent.state.hookdir import read_usage, write_squeeze
from tests.native.conftest import PodFactory
from tests.native.native_helpers import active_window, busy_share, now_ns
from tests.native.test_hook_compute import finish, run

S = 1_000_000_000
SETTLE = 4 * S // 10


def _wait_for_file(pods: PodFactory, probe_dir: object) -> None:
    for _ in range(200):
        if read_usage(probe_dir):  # type: ignore[arg-type]
            return
        time.sleep(0.01)
    raise AssertionError("the library never made its shared file")


@pytest.mark.parametrize("mode", ["hard", "elastic"])
def test_a_squeeze_written_at_runtime_caps_an_uncapped_pod_and_lifting_it_gives_the_gpu_back(
        pods: PodFactory, mode: str) -> None:
    pod = pods.pod(cores="100", mode=mode)
    probe = pods.start(pod)
    run(probe, 3.6)
    _wait_for_file(pods, pod.hook_dir)
    time.sleep(1.0)
    squeezed_at = now_ns()
    written = write_squeeze(pod.hook_dir, {0: 30})
    assert written is not None and written.changed and written.enforced
    assert [u.squeeze_percent for u in read_usage(pod.hook_dir)] == [30.0]
    time.sleep(1.3)
    lifted_at = now_ns()
    assert write_squeeze(pod.hook_dir, {}) is not None
    finish(probe)
    start, end = active_window(pods.device, [probe.pid], S // 4, S // 10)
    before = busy_share(pods.device, {probe.pid}, start, squeezed_at)
    during = busy_share(pods.device, {probe.pid}, squeezed_at + SETTLE, lifted_at)
    after = busy_share(pods.device, {probe.pid}, lifted_at + SETTLE, end)
    assert before > 0.8  # uncapped: the loop takes the whole device
    # Squeezed to 30 %: hard holds 30 +- 5; elastic may keep what nobody else wants (alone on the device)
    # and so stays above the squeeze, which is its contract (it gives time back when a neighbour asks).
    if mode == "hard":
        assert during == pytest.approx(0.30, abs=0.05)
    else:
        assert during > 0.8
    assert after > 0.8


def test_a_squeeze_lowers_a_capped_pod_and_never_raises_it(pods: PodFactory) -> None:
    pod = pods.pod(cores="60")
    probe = pods.start(pod)
    run(probe, 3.2)
    _wait_for_file(pods, pod.hook_dir)
    time.sleep(0.8)
    t1 = now_ns()
    assert write_squeeze(pod.hook_dir, {0: 20}) is not None
    time.sleep(1.2)
    t2 = now_ns()
    assert write_squeeze(pod.hook_dir, {0: 90}) is not None  # above its own cap: the cap (60) holds
    finish(probe)
    start, end = active_window(pods.device, [probe.pid], SETTLE, S // 10)
    assert busy_share(pods.device, {probe.pid}, start, t1) == pytest.approx(0.60, abs=0.05)
    assert busy_share(pods.device, {probe.pid}, t1 + SETTLE, t2) == pytest.approx(0.20, abs=0.05)
    assert busy_share(pods.device, {probe.pid}, t2 + SETTLE, end) == pytest.approx(0.60, abs=0.05)


def test_the_squeeze_is_written_only_into_a_file_the_library_made(pods: PodFactory) -> None:
    pod = pods.pod(cores="50")
    assert write_squeeze(pod.hook_dir, {0: 30}) is None  # no process yet: nothing to write into
    with pytest.raises(ValueError, match="not a percent"):
        write_squeeze(pod.hook_dir, {0: 0})
    with pytest.raises(ValueError, match="outside"):
        write_squeeze(pod.hook_dir, {16: 30})
