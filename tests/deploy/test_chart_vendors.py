"""The chart on AMD and Ascend nodes: the agent DaemonSet mounts what AMD SMI (backend amdsmi) and DCMI
(backend dcmi) need from the host, only for that backend; NVIDIA (nvml) and fake renders get none of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, Render, assert_valid_kubernetes, run_helm
from tests.deploy.test_chart_render import K8S_VERSIONS, container, env_of, pod_specs

# what the agent always has from the host (device-plugin socket, MPS pipes, the interception library)
BASE_HOST_PATHS = {"/var/lib/kubelet/device-plugins": "Directory", "/run/gpupool/mps": "DirectoryOrCreate",
                   "/run/gpupool/hook": "DirectoryOrCreate"}
ASCEND_SHARED = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_INSIDE = "/usr/local/Ascend/driver"  # where gpupool.agent.devices.ascend looks for libdcmi.so

AMD = {"agent": {"backend": "amdsmi"}}
ASCEND = {"agent": {"backend": "dcmi"}}
ASCEND_TWO_CHIPS = {"agent": {"backend": "dcmi", "ascend": {"chips": [0, 3], "driverDir": "/opt/ascend/driver"}}}


def agent_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return pod_specs(objs)["agent"]


def host_paths(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The agent's hostPath volumes beyond the usual three: path -> type."""
    vols = [v["hostPath"] for v in agent_spec(objs)["volumes"] if "hostPath" in v]
    return {v["path"]: v["type"] for v in vols if v["path"] not in BASE_HOST_PATHS}


def mounts(objs: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    """Each of the agent's mounts of a hostPath volume: container path -> (host path, read-only)."""
    spec = agent_spec(objs)
    by_name = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    (agent,) = spec["containers"]
    return {m["mountPath"]: (by_name[m["name"]], bool(m.get("readOnly"))) for m in agent["volumeMounts"]
            if m["name"] in by_name and by_name[m["name"]] not in BASE_HOST_PATHS}


@pytest.mark.parametrize("values", [AMD, ASCEND, ASCEND_TWO_CHIPS], ids=["amdsmi", "dcmi", "dcmi-two-chips"])
def test_lint_strict(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("version", [K8S_VERSIONS[0], K8S_VERSIONS[-1]])
@pytest.mark.parametrize("values", [AMD, ASCEND_TWO_CHIPS], ids=["amdsmi", "dcmi"])
def test_every_object_is_valid_kubernetes(render: Render, values: dict[str, Any], version: str) -> None:
    assert_valid_kubernetes(render(values), version)


def test_amd_nodes_get_kfd_and_dri(render: Render) -> None:
    objs = render(AMD)
    assert host_paths(objs) == {"/dev/kfd": "CharDevice", "/dev/dri": "Directory", "/opt/rocm": "Directory"}
    # at the host's own paths, where libamd_smi opens them, and writable (its ioctls need the nodes open rw);
    # the node's ROCm read-only, where ROCM_PATH tells the amdsmi binding to load libamd_smi.so from
    assert mounts(objs) == {"/dev/kfd": ("/dev/kfd", False), "/dev/dri": ("/dev/dri", False),
                            "/opt/rocm": ("/opt/rocm", True)}
    env = env_of(container(objs, "agent", "agent"))
    assert env["ROCM_PATH"] == "/opt/rocm" and "LD_LIBRARY_PATH" not in env


def test_ascend_nodes_get_each_chip_the_shared_nodes_and_the_driver_read_only(render: Render) -> None:
    objs = render(ASCEND_TWO_CHIPS)
    assert host_paths(objs) == {"/dev/davinci0": "CharDevice", "/dev/davinci3": "CharDevice",
                                **dict.fromkeys(ASCEND_SHARED, "CharDevice"), "/opt/ascend/driver": "Directory"}
    assert mounts(objs) == {"/dev/davinci0": ("/dev/davinci0", False), "/dev/davinci3": ("/dev/davinci3", False),
                            **{p: (p, False) for p in ASCEND_SHARED},
                            DRIVER_INSIDE: ("/opt/ascend/driver", True)}
    # libdcmi.so's own dependencies are found in the driver's library folders
    assert env_of(container(objs, "agent", "agent"))["LD_LIBRARY_PATH"].split(":") == [
        f"{DRIVER_INSIDE}/lib64/driver", f"{DRIVER_INSIDE}/lib64/common", f"{DRIVER_INSIDE}/lib64"]


def test_ascend_defaults_are_eight_chips_and_the_usual_driver_directory(render: Render) -> None:
    paths = host_paths(render(ASCEND))
    assert sorted(p for p in paths if p.startswith("/dev/davinci") and p[-1].isdigit()) == [
        f"/dev/davinci{i}" for i in range(8)]
    assert paths[DRIVER_INSIDE] == "Directory"


@pytest.mark.parametrize("values", [None, {"agent": {"backend": "fake"}}], ids=["nvml", "fake"])
def test_nvidia_and_fake_nodes_get_no_vendor_paths(render: Render, values: dict[str, Any] | None) -> None:
    objs = render(values)
    assert host_paths(objs) == {}
    assert not [v["name"] for v in agent_spec(objs)["volumes"] if v["name"].startswith(("amd-", "ascend-"))]


@pytest.mark.parametrize("values", [AMD, ASCEND], ids=["amdsmi", "dcmi"])
def test_the_agent_stays_unprivileged_and_reads_its_backend(render: Render, values: dict[str, Any]) -> None:
    from gpupool.agent.config import load_config

    agent = container(render(values), "agent", "agent")
    sc = agent["securityContext"]
    assert sc.get("privileged") is not True and sc["capabilities"] == {"drop": ["ALL"]}
    assert load_config(env=env_of(agent)).backend == values["agent"]["backend"]


@pytest.mark.parametrize(("setting", "message"), [
    ("agent.ascend.chips={-1}", "/agent/ascend/chips/0"),
    ("agent.ascend.chips={1,1}", "/agent/ascend/chips"),
    ("agent.ascend.driverDir=Ascend/driver", "/agent/ascend/driverDir"),
    ("agent.ascend.npus=8", "additional properties 'npus' not allowed"),
])
def test_bad_ascend_values_are_refused(helm: Path, setting: str, message: str) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), "--set", "agent.backend=dcmi", "--set", setting)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
