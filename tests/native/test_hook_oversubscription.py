"""Memory oversubscription (limits.v1 `oversub`, native/gp_mem.c): beyond its cap a pod's cuMemAlloc is
served as managed memory kept on the host, up to the cap plus the oversubscription, so a program asking
for 1.5x its share completes while the GPU memory it holds stays within the share, and the guaranteed
share of a neighbour on the same GPU is untouched. The fake GPU (fake_cuda.c) moves managed pages as the
driver does: off the device with a preferred location on the host, back with one on the device or a
prefetch there."""

from __future__ import annotations

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, MIB, Probe

OOM = 2
INVALID = 1
PATHS = ["direct", "dlsym", "gpa", "gpa2"]


def device_used(probe: Probe) -> int:
    """Device memory in use on the whole (simulated) GPU, as NVML's device view counts it: nvidia-smi
    inside a pod shows its share, so it is read from a probe without limits."""
    rc, _total, _free, used = probe.ask("nvml")
    assert rc == 0
    return used


@pytest.mark.parametrize("path", PATHS)
def test_a_program_allocating_one_and_a_half_times_its_share_completes(pods: PodFactory, path: str) -> None:
    pod = pods.pod(memory_mib="4096", granted=True, oversub_mib=2048, extra={"FAKE_GPU_MEM_MIB": "10240"})
    probe = pods.start(pod, path)
    handles = []
    for _ in range(6):  # 6 GiB of a 4 GiB share: 4 on the GPU, 2 spilled to host memory
        rc, handle = probe.alloc("mem", GIB)
        assert rc == 0
        handles.append(handle)
    assert probe.alloc("mem", MIB)[0] == OOM  # share + oversubscription is the ceiling
    observer = pods.start(pods.pod(extra={"FAKE_GPU_MEM_MIB": "10240"}))
    assert device_used(observer) == 4 * GIB
    # freeing a spilled piece gives its room back, under the same ceiling
    assert probe.ask(f"free mem {handles.pop()}") == [0]
    assert device_used(observer) == 4 * GIB
    assert probe.alloc("mem", GIB)[0] == 0
    assert probe.alloc("mem", MIB)[0] == OOM


def test_a_neighbours_guaranteed_memory_is_untouched(pods: PodFactory) -> None:
    """A 10 GiB GPU: pod A holds a 4 GiB share oversubscribed by 2 GiB and uses all 6; pod B's guaranteed
    6 GiB must still be there. Had A's excess landed on the GPU, B could get only 4."""
    gpu = {"FAKE_GPU_MEM_MIB": "10240"}
    a = pods.start(pods.pod(memory_mib="4096", granted=True, oversub_mib=2048, extra=gpu))
    for _ in range(6):
        assert a.alloc("mem", GIB)[0] == 0
    b = pods.start(pods.pod(memory_mib="6144", granted=True, extra=gpu))
    for _ in range(6):
        assert b.alloc("mem", GIB)[0] == 0


@pytest.mark.parametrize("how", ["advise", "prefetch"])
def test_the_tenant_cannot_pull_spilled_pages_onto_the_gpu(pods: PodFactory, how: str) -> None:
    gpu = {"FAKE_GPU_MEM_MIB": "10240"}
    a = pods.start(pods.pod(memory_mib="4096", granted=True, oversub_mib=2048, extra=gpu))
    for _ in range(4):
        assert a.alloc("mem", GIB)[0] == 0
    rc, spilled = a.alloc("mem", 2 * GIB)
    assert rc == 0
    assert a.ask(f"togpu {how} {spilled}") == [INVALID]
    observer = pods.start(pods.pod(extra=gpu))
    assert device_used(observer) == 4 * GIB
    # memory the tenant allocated as managed itself is counted in full against the cap and is its own to move
    b = pods.start(pods.pod(memory_mib="2048", granted=True, extra=gpu))
    rc, managed = b.alloc("managed", GIB)
    assert rc == 0 and b.ask(f"togpu {how} {managed}") == [0]


def test_without_oversubscription_the_cap_is_exact(pods: PodFactory) -> None:
    probe = pods.start(pods.pod(memory_mib="4096", granted=True))
    for _ in range(4):
        assert probe.alloc("mem", GIB)[0] == 0
    assert probe.alloc("mem", MIB)[0] == OOM


def test_the_environment_cannot_grant_oversubscription(pods: PodFactory) -> None:
    """Only the agent's limits file carries it: a variable of that name is nothing to the library."""
    pod = pods.pod(memory_mib="4096", granted=True, extra={"GPUPOOL_MEMORY_OVERSUBSCRIPTION": "2",
                                                           "GPUPOOL_OVERSUB_MIB": "4096"})
    probe = pods.start(pod)
    for _ in range(4):
        assert probe.alloc("mem", GIB)[0] == 0
    assert probe.alloc("mem", MIB)[0] == OOM


def test_in_a_pods_namespaces_the_tenant_still_cannot_lift_the_ceiling(pods: PodFactory) -> None:
    """As in a production container: PID and mount namespaces of its own with a fresh /proc (so NVML's host
    PIDs are not the process's own), variables claiming more, and advice pulling spilled pages back: the
    ceiling stays share + oversubscription and the GPU holds only the share."""
    gpu = {"FAKE_GPU_MEM_MIB": "10240"}
    tamper = {**gpu, "GPUPOOL_MEMORY_LIMIT_MIB": "10240", "GPUPOOL_OVERSUB_MIB": "8192"}
    probe = pods.start(pods.pod(memory_mib="4096", granted=True, oversub_mib=2048, namespaces=True, extra=tamper))
    for _ in range(4):
        assert probe.alloc("mem", GIB)[0] == 0
    rc, spilled = probe.alloc("mem", 2 * GIB)
    assert rc == 0
    assert probe.ask(f"togpu advise {spilled}") == [INVALID]
    assert probe.alloc("mem", MIB)[0] == OOM
    observer = pods.start(pods.pod(extra=gpu))
    assert device_used(observer) == 4 * GIB
