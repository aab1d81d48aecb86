"""The fake GPU description: what it accepts, and errors that name the field for what it does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.agent.devices.discovery import DiscoveryError, GpuProcess
from gpupool.agent.devices.fake import FakeBackend, FakeGPUFileError, load_fake_file, parse_fake_description

GOOD = """
driver_version: "570.86"
gpus:
  - uuid: GPU-one
    model: H100-80GB
    memory_mib: 81559
    numa_node: 0
    nvlink_peers: [1]
  - count: 2
    uuid_prefix: GPU-many
    model: H100-80GB
    memory_mib: 81559
    healthy: false
"""


def write(tmp_path: Path, text: str, name: str = "gpus.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_description_with_count_shorthand(tmp_path: Path) -> None:
    discovered, unhealthy = load_fake_file(write(tmp_path, GOOD))
    assert [(d.uuid, d.index) for d in discovered.devices] == [("GPU-one", 0), ("GPU-many-0", 1), ("GPU-many-1", 2)]
    assert discovered.driver_version == "570.86" and discovered.vendor == "nvidia"
    assert unhealthy == {"GPU-many-0", "GPU-many-1"}
    gpu = discovered.devices[0].to_gpu()
    assert (gpu.model, gpu.memory_mib, gpu.nvlink_peers, gpu.numa_node) == ("H100-80GB", 81559, (1,), 0)
    assert discovered.nvlink_matrix()[1][0] is True


def test_json_description(tmp_path: Path) -> None:
    path = write(
        tmp_path, json.dumps({"vendor": "acme", "gpus": [{"uuid": "X-1", "model": "m", "memory_mib": 1}]}), "gpus.json"
    )
    backend = FakeBackend.from_file(path)
    assert backend.discover().devices[0].vendor == "acme"
    assert backend.probe("X-1") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus:\n  - uuid: G-1\n    memory_mib: 10\n", "gpus[0].model: Field required"),
        (
            "gpus:\n  - uuid: G-1\n    model: m\n    memory_mib: -5\n",
            "gpus[0].memory_mib: Input should be greater than 0",
        ),
        ("gpus:\n  - model: m\n    memory_mib: 5\n", "gpus[0]: Value error, give either uuid"),
        ("gpus: []\n", "gpus: List should have at least 1 item"),
        ("gpus:\n  - uuid: G-1\n    model: m\n    memory_mib: 5\n    colour: red\n", "gpus[0].colour: Extra inputs"),
        (
            "gpus:\n  - {uuid: G-1, model: m, memory_mib: 5}\n  - {uuid: G-1, model: m, memory_mib: 5}\n",
            "UUID 'G-1' appears twice",
        ),
        ("gpus:\n  - {uuid: G-1, model: m, memory_mib: 5, nvlink_peers: [3]}\n", "gpus[0].nvlink_peers: [3]"),
        ("gpus: [\n", "not valid YAML"),
        ("- just a list\n", "document: Input should be a valid dictionary"),
    ],
)
def test_malformed_file_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(FakeGPUFileError) as err:
        load_fake_file(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FakeGPUFileError, match="cannot read"):
        load_fake_file(tmp_path / "absent.yaml")


def test_fault_injection() -> None:
    backend = FakeBackend.from_file(Path(__file__).parents[1] / "fixtures_two_gpus.yaml")
    backend.inject_xid("GPU-f-0", 79)
    event = backend.wait_event(1.0)
    assert event is not None and (event.uuid, event.xid) == ("GPU-f-0", 79)
    assert backend.probe("GPU-f-0") == "Xid 79"
    assert backend.wait_event(0.01) is None
    backend.remove("GPU-f-1")
    assert [d.uuid for d in backend.discover().devices] == ["GPU-f-0"]
    assert backend.probe("GPU-f-1") == "GPU is not present"
    backend.heal("GPU-f-0")
    backend.heal("GPU-f-1")
    assert backend.probe("GPU-f-0") is None and len(backend.discover().devices) == 2


def test_processes_by_host_pid_through_the_same_port_as_nvml() -> None:
    backend = FakeBackend(parse_fake_description({"gpus": [{"count": 2, "model": "A10", "memory_mib": 23028}]}, "t"))
    g0, g1 = (d.uuid for d in backend.discover().devices)
    backend.run_process(g0, 31337, 2048.0, sm_percent=55.0)
    backend.run_process(g1, 31338, 512.0)
    assert backend.processes(g0) == (GpuProcess(31337, 2048.0),)
    first = backend.process_utilization(g0, 0)
    assert [(s.pid, s.sm_percent) for s in first] == [(31337, 55.0)]
    # as NVML: only samples newer than the time stamp given; the next query has a newer one
    assert backend.process_utilization(g0, first[0].timestamp_us + 100) == ()
    assert backend.process_utilization(g0, first[0].timestamp_us)[0].timestamp_us > first[0].timestamp_us
    backend.end_process(31337)
    assert backend.processes(g0) == ()
    backend.remove(g1)
    with pytest.raises(DiscoveryError, match="not present"):
        backend.processes(g1)


def test_node_field_gives_each_node_its_own_uuids(tmp_path: Path) -> None:
    """One description (the chart's ConfigMap, mounted on every node) with {node} in its UUIDs: each agent's
    GPUs are named after its node, so two nodes never share a UUID; without a node name it stays an error."""
    path = write(tmp_path, "gpus:\n  - count: 2\n    uuid_prefix: GPU-{node}\n    model: L40S\n    memory_mib: 46068\n"
                           "  - uuid: GPU-{node}-solo\n    model: A10\n    memory_mib: 23028\n")
    a = FakeBackend.from_file(path, node="node-a").discover()
    b = FakeBackend.from_file(path, node="10.0.0.7").discover()
    assert [d.uuid for d in a.devices] == ["GPU-node-a-0", "GPU-node-a-1", "GPU-node-a-solo"]
    assert [d.uuid for d in b.devices] == ["GPU-10.0.0.7-0", "GPU-10.0.0.7-1", "GPU-10.0.0.7-solo"]
    with pytest.raises(FakeGPUFileError, match=r"gpus\[0\]\.uuid_prefix"):
        load_fake_file(path)
    # the validation section, read again when the file changes, keeps the node's names valid
    backend = FakeBackend.from_file(path, node="node-a")
    path.write_text(path.read_text() + "validation:\n  toolkit: too old\n")
    assert backend.validation_fault("toolkit") == "too old"


# --- FakeContainerDevices: what a fake non-NVIDIA card's container is told (issue 40) ---------------------------
def test_fake_container_devices_hand_env_only_in_the_vendors_shapes() -> None:
    from gpupool.agent.devices.discovery import DeviceInfo
    from gpupool.agent.devices.fake import FakeContainerDevices
    from gpupool.agent.devices.vendor import Partition

    card = DeviceInfo(uuid="C3", index=3, model="Ascend910B", memory_mib=65536, vendor="ascend")
    vnpu = Partition("C3", "151", "vir08", 3, 16384, 8)
    whole = FakeContainerDevices("ascend").container_devices(card)
    assert whole.device_nodes == () and whole.env == {
        "ASCEND_VISIBLE_DEVICES": "3",
        "GPUPOOL_FAKE_DEVICE_NODES": "/dev/davinci3,/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"}
    part = FakeContainerDevices("ascend").container_devices(card, vnpu)
    assert part.device_nodes == () and part.env == {
        "ASCEND_VISIBLE_DEVICES": "151", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL",
        "GPUPOOL_FAKE_DEVICE_NODES": "/dev/vdavinci151,/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"}
    amd = FakeContainerDevices("amd").container_devices(DeviceInfo("A", 0, "MI300X", 196592, vendor="amd"))
    assert amd.env == {"GPUPOOL_FAKE_DEVICE_NODES": "/dev/kfd,/dev/dri/renderD128"}
    other = FakeContainerDevices("hygon").container_devices(DeviceInfo("D7", 0, "K100", 65536, vendor="hygon"))
    assert other.env == {"GPUPOOL_FAKE_VISIBLE_DEVICES": "D7"}
