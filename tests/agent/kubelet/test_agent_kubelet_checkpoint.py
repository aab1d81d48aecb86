"""Reading kubelet's device-manager checkpoint: which containers of a pod kubelet has recorded."""

from __future__ import annotations

import json
from pathlib import Path

from gpupool.agent.kubelet.kubelet_checkpoint import FILE_NAME, recorded_containers


def write(directory: Path, entries: list[dict[str, object]]) -> None:
    doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"gpupool.io/gpu": ["G::0"]}}, "Checksum": 1}
    (directory / FILE_NAME).write_text(json.dumps(doc))


def test_only_the_pods_entries_for_the_resource_count(tmp_path: Path) -> None:
    write(tmp_path, [
        # DeviceIDs by NUMA node (kubelet 1.20 on) and as a plain list (older): neither shape is read
        {"PodUID": "u1", "ContainerName": "prep", "ResourceName": "gpupool.io/gpu", "DeviceIDs": {"-1": ["G::0"]}},
        {"PodUID": "u1", "ContainerName": "train", "ResourceName": "gpupool.io/gpu", "DeviceIDs": ["G::1"]},
        {"PodUID": "u1", "ContainerName": "nic", "ResourceName": "example.com/nic", "DeviceIDs": ["n0"]},
        {"PodUID": "u2", "ContainerName": "main", "ResourceName": "gpupool.io/gpu", "DeviceIDs": ["G::2"]},
    ])
    assert recorded_containers(tmp_path, "u1", "gpupool.io/gpu") == {"prep", "train"}
    assert recorded_containers(tmp_path, "u3", "gpupool.io/gpu") == set()


def test_a_missing_checkpoint_is_a_reason_not_an_empty_record(tmp_path: Path) -> None:
    # a running kubelet always has one: its absence says this is not kubelet's directory
    reason = recorded_containers(tmp_path, "u1", "gpupool.io/gpu")
    assert isinstance(reason, str) and "does not exist" in reason


def test_an_unexpected_file_is_a_reason_not_an_answer(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text('{"Data": {"Entries": []}}')
    reason = recorded_containers(tmp_path, "u1", "gpupool.io/gpu")
    assert isinstance(reason, str) and "not a kubelet device-manager checkpoint as expected" in reason
    (tmp_path / FILE_NAME).write_text("{half")
    assert isinstance(recorded_containers(tmp_path, "u1", "gpupool.io/gpu"), str)
