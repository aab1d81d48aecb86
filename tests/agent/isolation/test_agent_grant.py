from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.isolation.grant import ContainerGrant, Refused, build_grant
from gpupool.api.allocation import AllocationDoc, GrantDoc

DEVICES = {f"G{i}": DeviceInfo(uuid=f"G{i}", index=i, model="A100", memory_mib=40960) for i in range(3)}


def doc(*grants: tuple[str, int, float], isolation: str = "hook") -> AllocationDoc:
    return AllocationDoc(
        pod_uid="u",
        node="n",
        isolation=isolation,
        gpus=[GrantDoc(uuid=u, index=int(u[1:]), memory_mib=m, cores=c) for u, m, c in grants],
    )


def config(**kw: object) -> AgentConfig:
    return AgentConfig(node_name="n", **kw)  # type: ignore[arg-type]


def grant(d: AllocationDoc, unhealthy: dict[str, str] | None = None, **kw: object) -> ContainerGrant:
    g = build_grant(d, "main", DEVICES, unhealthy or {}, config(**kw), "ns/p")
    assert isinstance(g, ContainerGrant), g
    return g


def test_hook_share_sets_limits_and_injects_the_interception_library() -> None:
    g = grant(doc(("G1", 10240, 25.0)), hook_root=Path("/host/hook"))
    assert g.envs == {
        "NVIDIA_VISIBLE_DEVICES": "G1",
        "GPUPOOL_MEMORY_LIMIT_MIB": "10240",
        "GPUPOOL_CORES_PERCENT": "25",
        "GPUPOOL_ISOLATION": "hook",
        "GPUPOOL_HOOK_DIR": "/run/gpupool/hook",
        "GPUPOOL_CORES_MODE": "hard",
    }
    # the library, the preload list and the container's limits read-only, its own accounting directory
    # read-write (a sibling of the limits directory on the host, never above it)
    assert [(m.container_path, m.host_path, m.read_only) for m in g.mounts] == [
        ("/usr/local/lib/gpupool/libgpupool_hook.so", "/host/hook/lib/libgpupool_hook.so", True),
        ("/etc/ld.so.preload", "/host/hook/lib/ld.so.preload", True),
        ("/run/gpupool/limits", "/host/hook/pods/u/main/limits", True),
        ("/run/gpupool/hook", "/host/hook/pods/u/main/hook", False),
    ]
    limits = g.hook_pod.limits if g.hook_pod is not None else None
    assert limits is not None and (limits.memory_mib, limits.cores, limits.mode) == ((10240,), (25.0,), "hard")
    assert g.hook_pod is not None and g.hook_pod.dir == Path("/host/hook/pods/u/main") and g.hook_pod.gpus == ("G1",)
    assert g.cdi_devices == []


def test_mps_share_sets_mps_limits_and_mounts_the_gpus_pipe_dir() -> None:
    g = grant(doc(("G2", 4096, 12.5), isolation="mps"), mps_root=Path("/host/mps"))
    assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12.5"
    assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert g.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpupool/mps"
    assert [(m.container_path, m.host_path) for m in g.mounts] == [("/run/gpupool/mps", "/host/mps/G2")]


def test_whole_gpus_need_no_mps_and_list_every_gpu_in_order() -> None:
    g = grant(doc(("G2", 40960, 100.0), ("G0", 40960, 100.0), isolation="mps"))
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == "G2,G0"
    assert g.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "40960,40960"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in g.envs and g.mounts == []


def test_cdi() -> None:
    g = grant(doc(("G0", 1024, 10.0)), cdi=True, cdi_kind="example.com/gpu")
    assert g.cdi_devices == ["example.com/gpu=G0"] and g.envs["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_empty_isolation_uses_the_agent_default() -> None:
    assert grant(doc(("G0", 1024, 10.0), isolation=""), isolation="mps").envs["GPUPOOL_ISOLATION"] == "mps"


@pytest.mark.parametrize(
    ("d", "unhealthy", "reason"),
    [
        (doc(("G9", 1024, 10.0)), {}, "GPU G9, which this node (n) does not have"),
        (doc(("G1", 1024, 10.0)), {"G1": "Xid 79"}, "GPU G1, which is unhealthy (Xid 79)"),
        (doc(("G1", 50000, 10.0)), {}, "granted 50000 MiB on GPU G1, which has 40960 MiB"),
        (doc(("G1", 1024, 10.0), isolation="mig"), {}, "isolation mig, but no MIG device for GPU(s) G1"),
        (doc(("G0", 1024, 10.0), ("G1", 1024, 10.0), isolation="mps"), {}, "MPS sharing serves one GPU per container"),
        (doc(), {}, "grants no GPUs to container main"),
    ],
)
def test_refusals(d: AllocationDoc, unhealthy: dict[str, str], reason: str) -> None:
    result = build_grant(d, "main", DEVICES, unhealthy, config(), "ns/p")
    assert isinstance(result, Refused) and reason in result.reason and "ns/p" in result.reason
