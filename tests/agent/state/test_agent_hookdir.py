"""The host side of isolation hook: install, per-pod directories, and usage read back from what the real
library (built here, against the fake driver) writes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.agent.config import AgentConfig
from gpupool.agent.isolation.grant import Refused, build_grant
from gpupool.agent.state.hook_metrics import HookUsageCollector
from gpupool.agent.state.hookdir import (
    CONTAINER_HOOK_DIR,
    CONTAINER_LIBRARY,
    HookLimits,
    HookPod,
    PodGpuUsage,
    accounting_dir,
    claim_dir,
    container_dir,
    cores_mode_of,
    hook_paths,
    install_library,
    learnt_scales,
    limits_bytes,
    limits_dir,
    pod_dir,
    prepare_hook_pod,
    prepare_pod,
    read_all,
    read_usage,
    write_squeeze,
)
from gpupool.api.allocation import AllocationDoc, GrantDoc
from tests.native.native_helpers import GIB, Built, Pod, build_all, have_cc, kernel_log

UID_A = "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e"
UID_B = "0f0e0d0c-0b0a-4909-8807-060504030201"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert have_cc(), "no C compiler: these tests build the interception library (set CC)"
    return build_all(tmp_path_factory.mktemp("native"))


def test_install_puts_the_library_and_a_preload_list_naming_its_container_path(tmp_path: Path) -> None:
    source = tmp_path / "lib.so"
    source.write_bytes(b"\x7fELF-fake")
    paths = install_library(tmp_path / "root", source)
    assert paths.library.read_bytes() == b"\x7fELF-fake"
    assert paths.preload.read_text() == CONTAINER_LIBRARY + "\n"
    assert paths.pods.is_dir()


def test_pod_directories_are_made_at_allocate_and_swept_when_the_pod_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    pod_a = HookPod(UID_A, "ns/a", "main", ("GPU-1",), container_dir(root, UID_A, "main"))
    assert prepare_hook_pod(root, pod_a, []) is False  # not installed: an embedded agent writes nothing
    assert not root.exists()
    hook_paths(root).pods.mkdir(parents=True)
    assert prepare_hook_pod(root, pod_a, [])
    assert pod_a.dir.is_dir() and (pod_a.dir.stat().st_mode & 0o777) == 0o777
    pod_b = HookPod(UID_B, "ns/b", "main", ("GPU-1",), container_dir(root, UID_B, "main"))
    prepare_hook_pod(root, pod_b, [{"metadata": {"uid": UID_A}}])
    assert pod_a.dir.is_dir() and pod_b.dir.is_dir()
    prepare_hook_pod(root, pod_b, [{"metadata": {"uid": UID_B}}])  # pod A left the node
    assert not pod_dir(root, UID_A).exists() and pod_b.dir.is_dir()


@pytest.mark.parametrize("uid", ["../etc", "a/b", "", ".."])
def test_a_uid_never_escapes_the_pods_directory(tmp_path: Path, uid: str) -> None:
    with pytest.raises(ValueError):
        pod_dir(tmp_path, uid)


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", ".", "Main", "-a", "a" * 64])
def test_a_container_name_never_escapes_its_pods_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not usable as a container name"):
        container_dir(tmp_path, UID_A, name)


def _doc() -> AllocationDoc:
    return AllocationDoc(version=1, pod_uid=UID_A, node="n", policy="", isolation="hook", time="",
                         gpus=[GrantDoc(uuid="G0", index=0, memory_mib=1024, cores=30.0)], containers=[])


def test_the_cores_mode_comes_from_the_pods_annotation_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from gpupool.agent.devices.discovery import DeviceInfo

    devices = {"G0": DeviceInfo(uuid="G0", index=0, model="A100", memory_mib=40960)}
    config = AgentConfig(node_name="n", hook_root=tmp_path)
    pods = [{"metadata": {"uid": UID_A, "annotations": {"gpupool.io/cores-mode": "elastic"}}}]
    mode = cores_mode_of(pods, UID_A)
    grant = build_grant(_doc(), "main", devices, {}, config, "ns/a", mode)
    assert not isinstance(grant, Refused) and grant.envs["GPUPOOL_CORES_MODE"] == "elastic"
    refused = build_grant(_doc(), "main", devices, {}, config, "ns/a", "greedy")
    assert isinstance(refused, Refused) and "gpupool.io/cores-mode='greedy'" in refused.reason


def _usage_caught_up(directory: Path, ran_s: float, timeout_s: float = 10.0) -> PodGpuUsage:
    """The container's one usage record once its busy time has caught up with `ran_s` (what the device ran),
    less what the poller's first reading leaves uncounted (it only sets where counting starts, a few ms of
    kernels). Fails with the last figures if that does not happen within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_usage(directory)
        if len(records) == 1 and records[0].busy_seconds >= ran_s - 0.01:
            return records[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"the file's busy time never reached the device's {ran_s:.3f} s: {records}")
        time.sleep(0.005)


def test_usage_written_by_the_library_is_read_back_and_dead_processes_drop_out(
    built: Built, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    pod = HookPod(UID_A, "team/trainer", "main", ("GPU-11111111-2222-3333-4444-555555555555",),
                  container_dir(root, UID_A, "main"))
    prepare_hook_pod(root, pod, [])
    probe = Pod(built, tmp_path / "gpu", pod.dir, memory_mib="10240", cores="50",
                extra={"NVIDIA_VISIBLE_DEVICES": pod.gpus[0]}).start()
    try:
        assert probe.alloc("mem", 3 * GIB)[0] == 0
        assert probe.ask("launch kernel 2000 0.3 4")[0] == 0
        # what the device itself ran for the probe (its kernel log); the library's poller writes the NVML
        # samples of it into the file a poll or two after the last kernel: wait for them, not for a time
        ran = sum(end - start for pid, start, end in kernel_log(tmp_path / "gpu") if pid == probe.pid) / 1e9
        usage = _usage_caught_up(pod.dir, ran)
        assert (usage.limit_bytes, usage.used_bytes, usage.processes) == (10 * GIB, 3 * GIB, 1)
        assert usage.gpu == pod.gpus[0] and usage.label == "team/trainer" and usage.cores_percent == 50
        assert 0.05 < usage.busy_seconds < 0.3  # capped at 50 % of ~0.3 s
        assert usage.busy_seconds <= ran + 0.005  # never more than the device ran
        registry = CollectorRegistry()
        registry.register(HookUsageCollector(root))
        text = generate_latest(registry).decode()
        assert (f'gpupool_pod_gpu_memory_used_bytes{{container="main",gpu="{pod.gpus[0]}",pod="team/trainer",'
                f'pod_uid="{UID_A}"}} 3.221225472e+09') in text
        assert "gpupool_pod_gpu_busy_seconds_total{" in text
    finally:
        probe.proc.send_signal(signal.SIGKILL)
        probe.close()
    (usage,) = read_all(root)
    assert (usage.used_bytes, usage.processes) == (0, 0)  # kill -9: nothing left counted



def test_a_dra_claims_usage_is_read_beside_the_containers(built: Built, tmp_path: Path) -> None:
    """A claim's hook directory (claims/<UID>, gpupool.agent.dra.driver) is read for the metrics like a container's."""
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    gpu = "GPU-11111111-2222-3333-4444-555555555555"
    claim = HookPod(UID_B, "team/c (claim)", "claim", (gpu,), claim_dir(root, UID_B),
                    HookLimits(memory_mib=(4096,), cores=(20.0,), gpus=(gpu,)))
    prepare_pod(claim)
    probe = Pod(built, tmp_path / "gpu", claim.dir, memory_mib="4096", cores="20",
                extra={"NVIDIA_VISIBLE_DEVICES": gpu}).start()
    try:
        assert probe.alloc("mem", GIB)[0] == 0
        usage = [u for u in read_all(root) if u.pod_uid == UID_B]
        assert [(u.label, u.gpu, u.limit_bytes, u.used_bytes, u.cores_percent) for u in usage] == [
            ("team/c (claim)", gpu, 4 * GIB, GIB, 20.0)]
    finally:
        probe.proc.send_signal(signal.SIGKILL)
        probe.close()

# ---- limits.v1: what the agent writes for the library ----------------------------------------------------
def test_limits_file_layout_is_the_librarys_struct() -> None:
    """Byte for byte what struct gp_limits in native/gp.h reads (offsets checked there by static asserts)."""
    data = limits_bytes(HookLimits(memory_mib=(10240, 0), cores=(30.0, 100.0), mode="elastic",
                                   gpus=("GPU-a", "GPU-b"), accounting_dir="/run/gpupool/hook"))
    assert len(data) == 2048
    assert data[0:8] == b"GPLIMIT1"
    assert int.from_bytes(data[8:12], "little") == 1 and int.from_bytes(data[12:16], "little") == 2  # version, GPUs
    assert int.from_bytes(data[16:24], "little") == 10240 * 1024 * 1024  # limit[0], bytes
    assert int.from_bytes(data[24:32], "little") == 0  # limit[1]: no memory cap
    assert int.from_bytes(data[144:152], "little") == 300_000  # cores_ppm[0]
    assert int.from_bytes(data[152:160], "little") == 0  # 100 %: no compute cap
    assert int.from_bytes(data[272:280], "little") == 1  # elastic
    assert data[280:408] == bytes(128)  # no squeeze
    assert data[408:413] == b"GPU-a" and data[413] == 0 and data[472:477] == b"GPU-b"
    assert data[1432:1450] == b"/run/gpupool/hook\0"


@pytest.mark.parametrize(("limits", "message"), [
    (HookLimits(memory_mib=(1,), cores=(30.0, 40.0)), "one value per GPU"),
    (HookLimits(memory_mib=(1,), cores=(0.0,)), "out of range"),
    (HookLimits(memory_mib=(-1,), cores=(30.0,)), "out of range"),
    (HookLimits(memory_mib=(1,), cores=(30.0,), mode="greedy"), "cores mode"),
    (HookLimits(memory_mib=(1,), cores=(30.0,), accounting_dir="relative"), "absolute path"),
    (HookLimits(memory_mib=(1,) * 17, cores=(30.0,) * 17), "1 to 16 GPUs"),
    (HookLimits(memory_mib=(1, 1), cores=(30.0, 30.0), nvml_scale_ppm=(1_600_000,)), "NVML scales"),
    (HookLimits(memory_mib=(1,), cores=(30.0,), nvml_scale_ppm=(-1,)), "none negative"),
])
def test_limits_the_file_cannot_hold_are_refused(limits: HookLimits, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        limits_bytes(limits)


def test_prepare_writes_the_limits_apart_from_the_writable_accounting(tmp_path: Path) -> None:
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    pod = HookPod(UID_A, "ns/a", "main", ("GPU-1",), container_dir(root, UID_A, "main"),
                  HookLimits(memory_mib=(4096,), cores=(50.0,), gpus=("GPU-1",), accounting_dir=CONTAINER_HOOK_DIR))
    assert prepare_hook_pod(root, pod, [])
    limits = limits_dir(pod.dir) / "limits.v1"
    assert limits.stat().st_mode & 0o777 == 0o644 and limits_dir(pod.dir).stat().st_mode & 0o777 == 0o755
    assert accounting_dir(pod.dir).stat().st_mode & 0o777 == 0o777
    assert not limits_dir(pod.dir).is_relative_to(accounting_dir(pod.dir))  # siblings: nothing writable above it
    assert int.from_bytes(limits.read_bytes()[16:24], "little") == 4096 << 20


def test_usage_of_a_granted_container_reports_the_agents_limits_not_the_containers_copy(
    built: Built, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    directory = container_dir(root, UID_A, "main")
    probe_pod = Pod(built, tmp_path / "gpu", directory, memory_mib="10240", cores="50", granted=True)
    pod = HookPod(UID_A, "team/trainer", "main", (), directory)
    prepare_hook_pod(root, pod, [])
    probe_pod.write_limits()  # what the agent grants (hook dir in the test's own layout)
    probe = probe_pod.start()
    try:
        assert probe.alloc("mem", 3 * GIB)[0] == 0
        usage_file = accounting_dir(directory) / "usage.v1"
        with usage_file.open("r+b") as f:  # the tenant rewrites the header's limit and cores in its copy
            f.seek(16)
            f.write(bytes(8))
            f.seek(144)
            f.write(bytes(8))
        (usage,) = read_usage(directory)
        assert (usage.limit_bytes, usage.cores_percent, usage.used_bytes) == (10 * GIB, 50.0, 3 * GIB)
        written = write_squeeze(directory, {0: 20})
        assert written is not None and written.changed and written.enforced
        assert read_usage(directory)[0].squeeze_percent == 20.0
        squeeze = int.from_bytes((limits_dir(directory) / "limits.v1").read_bytes()[280:288], "little")
        assert squeeze == 200_000  # in place in the agent's file, which the library maps read-only
    finally:
        probe.proc.send_signal(signal.SIGKILL)
        probe.close()


def test_the_scale_a_library_learnt_is_read_from_its_usage_file_and_values_it_would_not_use_are_dropped(
        tmp_path: Path) -> None:
    assert learnt_scales(tmp_path) == ()  # no usage.v1 yet
    data = bytearray(2048 + 256 * 264)
    data[0:8] = (0x314C4F4F50555047).to_bytes(8, "little")  # usage.v1's magic (native/gp.h GP_MAGIC)
    data[12:16] = (3).to_bytes(4, "little")  # three GPUs
    for i, ppm in enumerate([1_600_000, 30_000_000, 40_000, 999]):  # scale_ppm[] at 1848, int64
        data[1848 + 8 * i:1856 + 8 * i] = ppm.to_bytes(8, "little", signed=True)
    (tmp_path / "usage.v1").write_bytes(bytes(data))
    # 20x and 0.04x are outside what the library itself would divide by; the fourth is past ndev
    assert learnt_scales(tmp_path) == (1_600_000, 0, 0)
    (tmp_path / "usage.v1").write_bytes(bytes(100))  # short or foreign: nothing
    assert learnt_scales(tmp_path) == ()
