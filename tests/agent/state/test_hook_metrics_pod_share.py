"""The per-pod series an autoscaler reads (gpupool.agent.state.hook_metrics): a pod's compute used against its
share and its memory against its cap, summed over its containers and GPUs. Expected values are worked out
by hand in the comments; the files are written as the library and the agent write them (usage.v1 with a
live process slot held by an OFD lock, limits.v1 by the agent's own writer)."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.agent.state.hook_metrics import HookUsageCollector, PodShare, granted_gpus, pod_shares, split_label
from gpupool.agent.state.hookdir import (
    USAGE_FILE,
    HookLimits,
    HookPod,
    PodGpuUsage,
    accounting_dir,
    claim_dir,
    container_dir,
    hook_paths,
    prepare_pod,
    remote_shares,
)

GIB = 1 << 30
UID_A = "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e"
UID_B = "0f0e0d0c-0b0a-4909-8807-060504030201"
UID_C = "11111111-2222-4333-8444-555555555555"
# usage.v1 (struct gp_shared, native/gp.h; offsets as gpupool.agent.state.hookdir reads them)
_MAGIC, _DEV, _SLOT, _SLOT_SIZE, _SIZE = 0x314C4F4F50555047, 304, 2048, 264, 2048 + 256 * 264


def rec(uid: str, label: str, container: str, gpu: str, busy: float, cores: float, used: int = 0,
        limit: int = 0) -> PodGpuUsage:
    return PodGpuUsage(pod_uid=uid, label=label, gpu=gpu, limit_bytes=limit, used_bytes=used, busy_seconds=busy,
                       cores_percent=cores, mode="hard", processes=1, container=container)


@pytest.mark.parametrize(("label", "expected"), [
    ("team/trainer-7f9c", ("team", "trainer-7f9c", "")),
    ("team/shared (claim)", ("team", "", "shared")),
    ("", ("", "", "")),
])
def test_the_label_names_the_namespace_and_the_pod_or_the_claim(label: str, expected: tuple[str, str, str]) -> None:
    assert split_label(label) == expected


def test_a_pods_containers_and_gpus_are_summed_against_what_it_was_granted() -> None:
    records = [
        # pod A: container main on two GPUs (20 % and 30 %), container side on one (50 %): 1.0 GPU granted.
        rec(UID_A, "team/a", "main", "G0", busy=2.0, cores=20, used=1 * GIB, limit=4 * GIB),
        rec(UID_A, "team/a", "main", "G1", busy=1.0, cores=30, used=2 * GIB, limit=4 * GIB),
        rec(UID_A, "team/a", "side", "G0", busy=3.0, cores=50, used=1 * GIB, limit=0),  # no memory cap
        # pod B: one container, 25 % of one GPU, 1 s busy; 3 GiB of a 12 GiB cap.
        rec(UID_B, "team/b", "main", "G2", busy=1.0, cores=25, used=3 * GIB, limit=12 * GIB),
    ]
    share_b, share_a = pod_shares(records, granted={})  # sorted by UID: B's 0f0e... first
    # A: busy 2 + 1 + 3 = 6 s over 0.2 + 0.3 + 0.5 = 1.0 GPU = 6.0; memory on capped GPUs 1 + 2 = 3 GiB of
    # 4 + 4 = 8 GiB = 0.375 (the uncapped GPU's 1 GiB is counted in used_bytes only).
    assert (share_a.uid, share_a.namespace, share_a.pod, share_a.claim) == (UID_A, "team", "a", "")
    assert share_a.busy_seconds == pytest.approx(6.0) and share_a.granted_gpus == pytest.approx(1.0)
    assert share_a.compute_share_seconds == pytest.approx(6.0)
    assert (share_a.used_bytes, share_a.capped_used_bytes, share_a.cap_bytes) == (4 * GIB, 3 * GIB, 8 * GIB)
    assert share_a.memory_used_ratio == pytest.approx(0.375)
    # B: 1 s over 0.25 GPU = 4.0; 3 / 12 = 0.25.
    assert share_b == PodShare(uid=UID_B, namespace="team", pod="b", claim="", busy_seconds=1.0, granted_gpus=0.25,
                               used_bytes=3 * GIB, capped_used_bytes=3 * GIB, cap_bytes=12 * GIB)
    assert share_b.compute_share_seconds == pytest.approx(4.0)
    assert share_b.memory_used_ratio == pytest.approx(0.25)


def test_the_limits_files_decide_the_grant_so_a_container_that_has_not_run_yet_counts() -> None:
    # Only main's library has written its accounting (0.6 s busy at 20 %); side (30 %) has not run: the
    # limits files grant 0.2 + 0.3 = 0.5 GPU, so the counter is 0.6 / 0.5 = 1.2 now and does not drop
    # when side's records appear (which dividing by 0.2 would make it do: 3.0, then 0.6 / 0.5).
    records = [rec(UID_A, "team/a", "main", "G0", busy=0.6, cores=20)]
    (share,) = pod_shares(records, granted={UID_A: 0.5})
    assert share.compute_share_seconds == pytest.approx(1.2)


def test_an_uncapped_pod_has_no_memory_ratio_and_a_zero_grant_no_division() -> None:
    (share,) = pod_shares([rec(UID_A, "team/a", "main", "G0", busy=1.0, cores=100, used=GIB)], granted={UID_A: 0})
    assert share.memory_used_ratio is None and share.compute_share_seconds == 0.0


# ---- from the files, through the collector --------------------------------------------------------------
def write_usage(directory: Path, busy_s: list[float], used: list[int]) -> int:
    """usage.v1 as the library leaves it: the device count, each GPU's cumulative busy time, and one live
    process (slot 0: its pid, then used[16]) whose slot lock (byte 1) is held on the returned descriptor,
    as the library's process holds it while it lives."""
    data = bytearray(_SIZE)
    struct.pack_into("<QII", data, 0, _MAGIC, 1, len(busy_s))
    for d, seconds in enumerate(busy_s):
        struct.pack_into("<Q", data, _DEV + 64 * d + 40, round(seconds * 1e9))
    struct.pack_into("<q", data, _SLOT, os.getpid())
    for d, n in enumerate(used):
        struct.pack_into("<Q", data, _SLOT + 8 + 8 * d, n)
    path = accounting_dir(directory) / USAGE_FILE
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 1, 1, 0))
    return fd


@pytest.fixture
def held() -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


def samples(root: Path) -> dict[tuple[str, str, str], float]:
    """(metric, pod or claim, pod_uid) -> value, for the per-pod families."""
    registry = CollectorRegistry()
    registry.register(HookUsageCollector(root))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("gpupool_pod_share_"):
                out[(s.name, s.labels["pod"] or s.labels["claim"], s.labels["namespace"])] = s.value
    return out


def test_the_collector_serves_each_pod_once_from_its_containers_files(tmp_path: Path, held: list[int]) -> None:
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    main = HookPod(UID_A, "team/a", "main", ("G0", "G1"), container_dir(root, UID_A, "main"),
                   HookLimits(memory_mib=(4096, 2048), cores=(20.0, 30.0), gpus=("G0", "G1")))
    side = HookPod(UID_A, "team/a", "side", ("G0",), container_dir(root, UID_A, "side"),
                   HookLimits(memory_mib=(0,), cores=(50.0,), gpus=("G0",)))
    claim = HookPod(UID_C, "team/shared (claim)", "claim", ("G2",), claim_dir(root, UID_C),
                    HookLimits(memory_mib=(8192,), cores=(40.0,), gpus=("G2",)))
    for pod in (main, side, claim):
        prepare_pod(pod)
    held.append(write_usage(main.dir, busy_s=[1.5, 0.5], used=[GIB, GIB]))
    held.append(write_usage(claim.dir, busy_s=[0.2], used=[2 * GIB]))
    # side's library has not run: no usage.v1, but its limits.v1 is there.
    assert granted_gpus(root) == pytest.approx({UID_A: 1.0, UID_C: 0.4})
    got = samples(root)
    # pod a: (1.5 + 0.5) s over 0.2 + 0.3 + 0.5 = 1.0 GPU = 2.0; memory 1 + 1 GiB of 4 + 2 GiB = 1/3.
    assert got[("gpupool_pod_share_compute_seconds_total", "a", "team")] == pytest.approx(2.0)
    assert got[("gpupool_pod_share_granted_gpus", "a", "team")] == pytest.approx(1.0)
    assert got[("gpupool_pod_share_memory_used_ratio", "a", "team")] == pytest.approx(1 / 3)
    assert got[("gpupool_pod_share_memory_cap_bytes", "a", "team")] == 6 * GIB
    # the claim: 0.2 s over 0.4 GPU = 0.5; 2 of 8 GiB = 0.25; its name under `claim`, `pod` empty.
    assert got[("gpupool_pod_share_compute_seconds_total", "shared", "team")] == pytest.approx(0.5)
    assert got[("gpupool_pod_share_memory_used_ratio", "shared", "team")] == pytest.approx(0.25)
    assert len([k for k in got if k[0] == "gpupool_pod_share_compute_seconds_total"]) == 2


def test_a_remote_share_on_this_nodes_gpu_server_is_served_under_its_claim(tmp_path: Path, held: list[int]) -> None:
    """The GPU server's workers account a remote share in its directory under remote/shares: the GPU node's
    agent serves it as a claim's share, so autoscaling on a remote pod's claim works as for a local one."""
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    share = HookPod(UID_C, "team/far (claim)", "claim", ("G1",), remote_shares(root) / UID_C,
                    HookLimits(memory_mib=(4096,), cores=(25.0,), gpus=("G1",)))
    prepare_pod(share)
    held.append(write_usage(share.dir, busy_s=[0.5], used=[GIB]))
    assert granted_gpus(root) == pytest.approx({UID_C: 0.25})
    got = samples(root)
    # 0.5 s over 0.25 GPU = 2.0; 1 of 4 GiB = 0.25
    assert got[("gpupool_pod_share_compute_seconds_total", "far", "team")] == pytest.approx(2.0)
    assert got[("gpupool_pod_share_memory_used_ratio", "far", "team")] == pytest.approx(0.25)


def test_a_pod_without_files_has_no_series(tmp_path: Path) -> None:
    hook_paths(tmp_path).pods.mkdir(parents=True)
    assert samples(tmp_path) == {}
