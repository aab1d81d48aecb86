"""Device metrics (dcgm-exporter names/labels), per-pod split on shared GPUs, and PID -> pod mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.exporter import (
    DEVICE_METRICS,
    DeviceCollector,
    DeviceSample,
    PodInfo,
    PodRef,
    ProcessSample,
    create_metrics_app,
    parse_cgroup,
    proc_pod_mapper,
    read_cgroup,
    resolve,
)
from gpupool.exporter.cgroup import CgroupRef, container_id

FIXTURES = Path(__file__).parent / "fixtures"
UID = "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e"
CID = "0f3c9a1b2d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container", "namespace", "pod"}


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


@pytest.mark.parametrize(
    ("fixture", "container"),
    [
        ("cgroup-v1-cgroupfs.txt", CID),
        ("cgroup-v1-systemd-docker.txt", CID),
        ("cgroup-v2-containerd.txt", CID),
        ("cgroup-v2-crio-guaranteed.txt", CID),
        ("cgroup-v2-kind-nested.txt", CID),
        ("cgroup-v2-pod-level.txt", None),
    ],
)
def test_pod_uid_and_container_from_cgroup(fixture: str, container: str | None) -> None:
    ref = parse_cgroup((FIXTURES / fixture).read_text())
    assert ref is not None
    assert ref.pod_uid == UID
    assert ref.container_id == container


@pytest.mark.parametrize("fixture", ["cgroup-v2-host-process.txt", "cgroup-v2-user-session.txt"])
def test_processes_outside_pods_map_to_nothing(fixture: str) -> None:
    assert parse_cgroup((FIXTURES / fixture).read_text()) is None
    assert parse_cgroup("") is None


def test_resolve_to_pod_and_container_names() -> None:
    pods = {UID: PodInfo("team-a", "train-0", {container_id(f"containerd://{CID}"): "trainer"})}
    text = (FIXTURES / "cgroup-v2-containerd.txt").read_text()
    assert resolve(text, pods) == PodRef("team-a", "train-0", "trainer")
    assert resolve((FIXTURES / "cgroup-v2-pod-level.txt").read_text(), pods) == PodRef("team-a", "train-0", "")
    assert resolve(text, {}) is None  # pod not (yet) known to the agent


def test_read_cgroup_from_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text((FIXTURES / "cgroup-v1-cgroupfs.txt").read_text())
    text = read_cgroup(4242, tmp_path)
    assert text is not None and parse_cgroup(text) is not None
    assert read_cgroup(4243, tmp_path) is None  # exited


@settings(max_examples=80, deadline=None)
@given(uid=st.uuids(), cid=st.text("0123456789abcdef", min_size=64, max_size=64),
       qos=st.sampled_from(["", "burstable", "besteffort"]),
       runtime=st.sampled_from(["cri-containerd", "crio", "docker"]), v1=st.booleans())
def test_every_kubelet_layout_round_trips(uid: Any, cid: str, qos: str, runtime: str, v1: bool) -> None:
    """Whatever the QoS class, driver and runtime, the UID and container ID the kubelet wrote come back."""
    u = str(uid)
    if v1:  # cgroupfs driver, one line per hierarchy
        path = "/kubepods" + (f"/{qos}" if qos else "") + f"/pod{u}/{cid}"
        text = f"12:memory:{path}\n11:devices:{path}\n0::/\n"
    else:  # systemd driver, unified hierarchy
        slice_ = "kubepods" + (f"-{qos}" if qos else "")
        parent = "/kubepods.slice" + (f"/{slice_}.slice" if qos else "")
        text = f"0::{parent}/{slice_}-pod{u.replace('-', '_')}.slice/{runtime}-{cid}.scope\n"
    assert parse_cgroup(text) == CgroupRef(u, cid)


def test_proc_pod_mapper(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text((FIXTURES / "cgroup-v2-containerd.txt").read_text())
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "cgroup").write_text((FIXTURES / "cgroup-v2-host-process.txt").read_text())
    mapper = proc_pod_mapper(lambda: {UID: PodInfo("team-a", "train-0", {CID: "trainer"})}, tmp_path)
    assert mapper(77) == PodRef("team-a", "train-0", "trainer")
    assert mapper(78) is None  # a host daemon
    assert mapper(79) is None  # gone


def sample(**kw: Any) -> DeviceSample:
    base: dict[str, Any] = dict(index=0, uuid="GPU-aaaa", model="NVIDIA A100-SXM4-40GB", hostname="node-1",
                                gpu_util=80.0, fb_used_mib=20000.0, fb_total_mib=40960.0, temperature_c=61.0,
                                power_w=250.5, pci_bus_id="00000000:07:00.0")
    base.update(kw)
    return DeviceSample(**base)


def test_shared_gpu_is_split_per_pod_over_http(serve_app: Any) -> None:
    a, b = PodRef("team-a", "train", "main"), PodRef("team-b", "infer", "srv")
    owners = {100: a, 101: a, 200: b}
    gpu0 = sample(processes=(ProcessSample(100, 6000, 30), ProcessSample(101, 2000, 10),
                             ProcessSample(200, 9000, 35), ProcessSample(300, 1000, 1)),
                  last_xid=79, xid_count=2)
    gpu1 = sample(index=1, uuid="GPU-bbbb", gpu_util=0.0, fb_used_mib=0.0, minor=3)
    registry = CollectorRegistry()
    DeviceCollector(lambda: [gpu0, gpu1], owners.get, registry)
    with serve_app(create_metrics_app(registry)) as url:
        m = series(httpx.get(f"{url}/metrics", timeout=30).text)
    assert set(DEVICE_METRICS) <= set(m)
    for name in DEVICE_METRICS:
        for labels, _ in m[name]:
            assert set(labels) == DCGM_LABELS | {"vendor"}, name  # dcgm-exporter's labels, and gpupool's vendor

    def at(name: str, uuid: str, pod: str) -> float:
        hits = [v for lv, v in m[name] if lv["UUID"] == uuid and lv["pod"] == pod]
        assert len(hits) == 1
        return hits[0]

    # team-a has two processes: 6000 + 2000 MiB and 30 + 10 %
    assert at("DCGM_FI_DEV_FB_USED", "GPU-aaaa", "train") == 8000
    assert at("DCGM_FI_DEV_GPU_UTIL", "GPU-aaaa", "train") == 40
    assert at("DCGM_FI_DEV_FB_USED", "GPU-aaaa", "infer") == 9000
    # the rest (pid 300 of no known pod, plus the driver) stays unattributed: 20000 - 17000, 80 - 75
    assert at("DCGM_FI_DEV_FB_USED", "GPU-aaaa", "") == 3000
    assert at("DCGM_FI_DEV_GPU_UTIL", "GPU-aaaa", "") == 5
    assert sum(v for lv, v in m["DCGM_FI_DEV_FB_USED"] if lv["UUID"] == "GPU-aaaa") == 20000
    assert at("DCGM_FI_DEV_FB_FREE", "GPU-aaaa", "") == 20960
    assert at("DCGM_FI_DEV_XID_ERRORS", "GPU-aaaa", "") == 79
    assert at("DCGM_EXP_XID_ERRORS_COUNT", "GPU-aaaa", "") == 2
    assert at("DCGM_FI_DEV_POWER_USAGE", "GPU-aaaa", "") == 250.5
    labels = next(lv for lv, _ in m["DCGM_FI_DEV_GPU_TEMP"] if lv["UUID"] == "GPU-bbbb")
    assert labels == {"gpu": "1", "UUID": "GPU-bbbb", "pci_bus_id": "00000000:07:00.0", "device": "nvidia3",
                           "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": "node-1", "vendor": "nvidia",
                           "container": "", "namespace": "", "pod": ""}
    pods_on_a = {(lv["namespace"], lv["pod"], lv["container"]) for lv, _ in m["DCGM_FI_DEV_GPU_UTIL"]
                 if lv["UUID"] == "GPU-aaaa"}
    assert pods_on_a == {("team-a", "train", "main"), ("team-b", "infer", "srv"), ("", "", "")}


def test_per_pod_shares_never_exceed_the_device_reading() -> None:
    # NVML process samples can run ahead of the device counter; the pods then share the device value.
    a, b = PodRef("ns", "a"), PodRef("ns", "b")
    s = sample(gpu_util=50.0, fb_used_mib=1000.0,
               processes=(ProcessSample(1, 1500, 60), ProcessSample(2, 500, 40)))
    registry = CollectorRegistry()
    DeviceCollector(lambda: [s], {1: a, 2: b}.get, registry)
    m = series(generate_latest(registry).decode())
    util = {lv["pod"]: v for lv, v in m["DCGM_FI_DEV_GPU_UTIL"]}
    mem = {lv["pod"]: v for lv, v in m["DCGM_FI_DEV_FB_USED"]}
    assert util == pytest.approx({"a": 30.0, "b": 20.0, "": 0.0})  # 60:40 of 50 %
    assert mem == pytest.approx({"a": 750.0, "b": 250.0, "": 0.0})  # 3:1 of 1000 MiB


def test_a_failing_sampler_yields_an_empty_scrape() -> None:
    def broken() -> list[DeviceSample]:
        raise OSError("NVML gone")

    registry = CollectorRegistry()
    DeviceCollector(broken, registry=registry)
    assert "DCGM_FI_DEV_GPU_UTIL" not in series(generate_latest(registry).decode())
