"""Isolation mig through the device plugin, on the fake MIG driver (A100-80GB geometry: 3g.40gb at starts 0
and 4, 4g.40gb at 0): Allocate carves the instance the allocation names before it answers and hands the
container its MIG device; kubelet asking again gets the same device; the inventory lists the instances; a
pod's instance is released when the pod is gone and destroyed once idle long enough; crashes between
carving and the checkpoint are completed by the restarted agent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import MigManager
from gpupool.agent.kubelet.device_plugin import STEP_CARVED
from gpupool.api.allocation import AllocationDoc, GrantDoc, MigGrantDoc
from gpupool.api.inventory import MigInstanceDoc, decode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.core.mig import PlacedInstance
from tests.agent.agent_helpers import NODE, RESOURCE, Rig, pod_object, rig

GPU = "GPU-aaaa-0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MigNode:
    """The node's MIG hardware (outlives agent restarts) and a factory of the agent's MIG manager."""

    def __init__(self, directory: Path) -> None:
        self.driver = FakeMigDriver({GPU: "A100-80GB"})
        self.clock = Clock()
        self.checkpoint = directory / "mig.json"

    def manager(self) -> MigManager:
        return MigManager(self.driver, self.checkpoint, self.clock, idle_after_s=600)


async def bind_mig_pod(cluster: MemoryCluster, name: str, profile: str, start: int) -> dict[str, Any]:
    """What the scheduler writes for a MIG pod: the GPU, and the instance (profile, start) it planned."""
    created = await cluster.create_pod(pod_object(name, 1))
    uid = created["metadata"]["uid"]
    grant = GrantDoc(uuid=GPU, index=0, memory_mib=40960, cores=42.9, mig=MigGrantDoc(profile=profile, start=start))
    doc = AllocationDoc(pod_uid=uid, node=NODE, isolation="mig", gpus=[grant])
    await cluster.patch_pod_annotations("default", name, {ANN_ALLOCATION: doc.model_dump_json(exclude_none=True)})
    await cluster.create_binding("default", name, uid, NODE)
    return await cluster.get_pod("default", name)


def fake_uuid(node: MigNode, start: int) -> str:
    (uuid,) = [i.uuid for i in node.driver.instances(GPU) if i.start == start]
    assert uuid is not None
    return uuid


async def instances(r: Rig) -> list[MigInstanceDoc]:
    text = (await r.cluster.get_node(NODE))["metadata"]["annotations"][ANN_INVENTORY]
    (gpu,) = [g for g in decode_inventory(text).gpus if g.uuid == GPU]
    assert gpu.mig
    return gpu.mig_instances


async def test_allocate_carves_the_planned_instance_and_hands_its_mig_device(tmp_path: Path) -> None:
    node = MigNode(tmp_path)
    async with rig(mig=node.manager) as r:
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 4)
        resp = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        assert node.driver.layout(GPU) == [PlacedInstance("3g.40gb", 4)]
        mig_uuid = fake_uuid(node, 4)
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid and mig_uuid.startswith("MIG-")
        assert (resp.envs["GPUPOOL_ISOLATION"], resp.envs["GPUPOOL_MIG_PROFILE"]) == ("mig", "3g.40gb")
        # hardware isolation: no interception library, no MPS
        assert not resp.mounts and not any(k.startswith("CUDA_MPS") for k in resp.envs)
        # kubelet asking again: the same answer, no second instance
        again = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        assert again.SerializeToString(deterministic=True) == resp.SerializeToString(deterministic=True)
        assert len(node.driver.instances(GPU)) == 1
        want = [MigInstanceDoc(profile="3g.40gb", start=4, used=True, uuid=mig_uuid)]
        await eventually_async(lambda: instances(r), want)


async def test_a_gone_pods_instance_turns_idle_then_is_destroyed(tmp_path: Path) -> None:
    node = MigNode(tmp_path)
    async with rig(mig=node.manager) as r:
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 0)
        await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        uuid = fake_uuid(node, 0)
        await r.cluster.delete_pod("default", "m")
        service = r.agent.service
        assert service is not None
        assert await service.housekeeping() is True  # released: idle, kept for reuse
        idle = [MigInstanceDoc(profile="3g.40gb", start=0, used=False, uuid=uuid)]
        await eventually_async(lambda: instances(r), idle)
        node.clock.now += 599  # idle 599 s of 600: kept
        assert await service.housekeeping() is False and len(node.driver.instances(GPU)) == 1
        node.clock.now += 1
        assert await service.housekeeping() is True
        assert node.driver.instances(GPU) == []
        await eventually_async(lambda: instances(r), [])


async def test_the_managers_refusal_and_a_missing_manager_refuse_allocate_with_the_reason(tmp_path: Path) -> None:
    node = MigNode(tmp_path)
    async with rig(mig=node.manager) as r:
        await bind_mig_pod(r.cluster, "first", "3g.40gb", 4)
        await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        await bind_mig_pod(r.cluster, "second", "3g.40gb", 4)  # the same slices, held by the first pod
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::1"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no free slices for 3g.40gb on GPU-aaaa-0 at start(s) [4]" in err.value.details()
    async with rig() as r:  # an agent without a MIG manager (no GPU in MIG mode)
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 4)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        assert "asks for isolation mig, but the agent on gpu-node-1 manages no MIG devices" in err.value.details()


class Crash(BaseException):
    """The agent process dies here."""


@pytest.mark.parametrize("pod_deleted", [False, True])
async def test_a_crash_after_carving_is_completed_by_the_restarted_agent(tmp_path: Path, pod_deleted: bool) -> None:
    """The instance exists but no answer was checkpointed: kubelet's retry gets that very instance; if the
    pod is gone instead, the restarted agent's reconcile makes it idle (never a second instance)."""
    crashed = asyncio.Event()

    def crash_after_carving(step: str) -> None:
        if step == STEP_CARVED and not crashed.is_set():
            crashed.set()
            raise Crash("crash after carving")

    node = MigNode(tmp_path)
    async with rig(mig=node.manager, step=crash_after_carving) as r:
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 4)
        call = asyncio.create_task(r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"]))
        await asyncio.wait_for(crashed.wait(), 10)
        uuid = fake_uuid(node, 4)
        if pod_deleted:
            await r.cluster.delete_pod("default", "m")
        await r.restart_agent()
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        await r.kubelet.wait_for(lambda k: len(k.registrations) == 2)
        if pod_deleted:
            want = [MigInstanceDoc(profile="3g.40gb", start=4, used=False, uuid=uuid)]
            await eventually_async(lambda: instances(r), want)
        else:
            resp = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
            assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert len(node.driver.instances(GPU)) == 1


async def eventually_async(get, want: object, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Await `get()` until it equals `want`; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (got := await get()) != want:
        if loop.time() > deadline:
            raise AssertionError(f"{got!r} != {want!r}")
        await asyncio.sleep(0.02)



def test_the_agent_gets_a_mig_manager_only_where_a_gpu_is_in_mig_mode(tmp_path: Path) -> None:
    from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
    from gpupool.agent.devices.mig import agent_mig_manager

    def backend(mig: bool) -> FakeBackend:
        gpus = [{"uuid": "GPU-m0", "model": "A100-80GB", "memory_mib": 81920, "mig": mig},
                {"uuid": "GPU-m1", "model": "A100-80GB", "memory_mib": 81920}]
        return FakeBackend(parse_fake_description({"gpus": gpus}, "test"))

    manager = agent_mig_manager(backend(True), tmp_path, idle_after_s=600)
    assert manager is not None and manager.backend.gpu_uuids() == ["GPU-m0"]  # only the MIG-mode GPU
    assert manager.path == tmp_path / "mig.json" and manager.idle_after_s == 600
    assert agent_mig_manager(backend(False), tmp_path, idle_after_s=600) is None
    assert agent_mig_manager(object(), tmp_path, idle_after_s=600) is None  # a backend without MIG support
