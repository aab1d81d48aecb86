"""The committed stubs match the .proto, and the method paths are the ones kubelet calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpupool.agent.proto import deviceplugin_v1beta1_pb2 as pb

ROOT = Path(__file__).resolve().parents[3]


def test_committed_stubs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_detects_a_stale_stub(tmp_path: Path) -> None:
    package = tmp_path / "gpupool" / "agent" / "proto"
    package.mkdir(parents=True)
    for f in (ROOT / "src" / "gpupool" / "agent" / "proto").glob("deviceplugin_v1beta1_pb2*"):
        (package / f.name).write_text(f.read_text())
    grpc_file = package / "deviceplugin_v1beta1_pb2_grpc.py"
    grpc_file.write_text(grpc_file.read_text().replace("/v1beta1.DevicePlugin/Allocate", "/v1beta1.DevicePlugin/Alloc"))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check", "--out-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "stale: " in result.stdout and "Alloc" in result.stdout


def test_wire_names_match_kubelet() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert [m.full_name for m in services["DevicePlugin"].methods] == [
        "v1beta1.DevicePlugin.GetDevicePluginOptions",
        "v1beta1.DevicePlugin.ListAndWatch",
        "v1beta1.DevicePlugin.GetPreferredAllocation",
        "v1beta1.DevicePlugin.Allocate",
        "v1beta1.DevicePlugin.PreStartContainer",
    ]
    assert [m.full_name for m in services["Registration"].methods] == ["v1beta1.Registration.Register"]
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    assert {f.name: f.number for f in pb.Device.DESCRIPTOR.fields} == {"ID": 1, "health": 2, "topology": 3}
    assert {f.name: f.number for f in pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields} == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
