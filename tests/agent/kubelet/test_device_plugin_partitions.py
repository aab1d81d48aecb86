"""The device plugin beside the DRA driver on cards in partition mode (issue 40): an AMD or Ascend card whose
partitions the node's MIG manager holds for claims is not offered to pods (its slots Unhealthy, a grant of it
refused) until its last partition is destroyed, when ListAndWatch offers it again; an NVIDIA GPU in MIG mode
keeps its slots (the plugin carves MIG instances for isolation-mig pods) but refuses any other grant of it.

Driven as kubelet drives the agent: the stand-in kubelet over the device plugin's unix socket (registration,
ListAndWatch, Allocate), kubelet's DRA half over the driver's socket (NodePrepareResources / Unprepare); the
AMD and Ascend cards are the fake vendor libraries under the agent's real adapters."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import grpc
import pytest

from gpupool.agent.devices.amd import AmdBackend, AmdVendor
from gpupool.agent.devices.ascend import AscendBackend, AscendVendor
from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryBackend
from gpupool.agent.devices.mig import agent_mig_manager
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.service import Agent
from gpupool.api.names import ANN_ALLOCATED
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import RESOURCE_CLAIMS
from gpupool.core.vendors import AMD, ASCEND
from tests.agent.agent_helpers import NODE, RESOURCE, agent_config, four_gpus, pod_object, rig, scheduler_binds
from tests.agent.dra.test_agent_dra import MIG_CLASS, _partition, _register, claim, ref
from tests.agent.fakes import ascend as dcmi_fake
from tests.agent.fakes.amd import amd_fake
from tests.agent.test_agent_mig_wiring import GPU as MIG_GPU
from tests.agent.test_agent_mig_wiring import MigNode, bind_mig_pod
from tests.harness.kubelet import StandInKubelet

IDLE_AFTER_S = 60.0  # the manager's idle time before a partition is destroyed (the test's clock moves past it)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Both:
    cluster: MemoryCluster
    kubelet: StandInKubelet
    agent: Agent
    dra: v1_grpc.DRAPluginStub
    clock: Clock

    def devices(self) -> dict[str, DeviceInfo]:
        assert self.agent.table is not None
        return self.agent.table.known

    def cards(self) -> list[str]:
        """The node's card UUIDs in index order."""
        return [d.uuid for d in sorted(self.devices().values(), key=lambda d: d.index)]

    def slots(self, card: str) -> set[str]:
        """The health kubelet last heard for the card's slots."""
        devices = self.kubelet.plugins[RESOURCE].devices
        return {h for d, h in devices.items() if d.startswith(card + "::")}

    async def bind_whole(self, name: str, card: str) -> None:
        """A pod the scheduler granted the whole card `card`."""
        dev = self.devices()[card]
        await scheduler_binds(self.cluster, pod_object(name, 1), [(card, dev.index, dev.memory_mib, 100.0)])

    async def prepare(self, c: dict[str, Any]) -> str:
        reply = await self.dra.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[ref(c)]), timeout=10)
        error: str = reply.claims[c["metadata"]["uid"]].error
        return error

    async def unprepare(self, c: dict[str, Any]) -> str:
        reply = await self.dra.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[ref(c)]), timeout=10)
        error: str = reply.claims[c["metadata"]["uid"]].error
        return error

    async def reap(self) -> None:
        """Let every idle partition outlive the idle time, then run the housekeeping that destroys them."""
        self.clock.now += IDLE_AFTER_S + 1
        assert self.agent.service is not None
        await self.agent.service.housekeeping()


@asynccontextmanager
async def both(vendor: str, backend: DiscoveryBackend, source: Any, label: bool = False) -> AsyncIterator[Both]:
    """The agent over `backend` as device plugin and DRA driver together, with the node's MIG manager over the
    vendor's partitions (`label`: the node lets the agent partition idle cards)."""
    directory = Path(tempfile.mkdtemp(prefix="gpd-", dir="/tmp"))  # unix socket paths stay short
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "32"}}})
    config = agent_config(directory, dra=True, device_plugin_with_dra=True, dra_resync_s=0.05, fake_file=None,
                          backend="amdsmi" if vendor == AMD else "dcmi")
    clock = Clock()
    manager = agent_mig_manager(backend, directory, idle_after_s=IDLE_AFTER_S, clock=clock, allow_mode_switch=label)
    assert manager is not None
    kubelet = StandInKubelet(directory)
    await kubelet.start()
    agent = Agent(config, backend, ClusterPortAgent(cluster), mig=manager, vendors={vendor: source})
    await agent.start()
    try:
        await kubelet.wait_for(lambda k: RESOURCE in k.plugins and k.plugins[RESOURCE].updates > 0)
        info = await _register(config.kubelet_root)
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
            yield Both(cluster, kubelet, agent, v1_grpc.DRAPluginStub(channel), clock)
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return amd_fake.load_binding(tmp_path_factory.mktemp("rocm"))


async def refused(r: Both, pod: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.kubelet.allocate(RESOURCE, f"default/{pod}", 1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details: str = err.value.details()
    return details


async def marked(r: Both, pod: str) -> bool:
    return ANN_ALLOCATED in (await r.cluster.get_pod("default", pod))["metadata"]["annotations"]


async def test_an_ascend_card_with_vnpus_is_withheld_until_its_last_vnpu_is_destroyed(tmp_path: Path) -> None:
    state = tmp_path / "dcmi.json"
    # chip 0 holds a vNPU carved before the agent started (vNPU ids are the chip's base 100 + index)
    vnpu = {"vdev_id": 100, "template": "vir04", "in_use": False}
    dcmi_fake.write_state(state, [{"card_id": 0, "chips": [dcmi_fake.card_910b(0, vnpus=[vnpu])]},
                                  {"card_id": 1, "chips": [dcmi_fake.card_910b(1)]}])
    with patch.dict(os.environ, {dcmi_fake.STATE_ENV: str(state)}):
        backend = AscendBackend(str(dcmi_fake.library()), numa_reader=lambda bus: 0)
        async with both(ASCEND, backend, AscendVendor(backend)) as r:
            split, whole = r.cards()
            assert r.slots(split) == {"Unhealthy"} and r.slots(whole) == {"Healthy"}
            assert len(r.kubelet.healthy(RESOURCE)) == 4  # split 4: the whole chip's slots only

            # a claim's vNPU carved on chip 0 beside the one it had: chip 0 stays out of the device plugin
            c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("vir", [_partition("gpu-0-vir08-1")],
                                                                     MIG_CLASS))
            assert await r.prepare(c) == ""
            assert [v["vdev_id"] for v in dcmi_fake.chip_state(state, 0)["vnpus"]] == [100, 101]

            await r.bind_whole("on-split", split)  # a pod granted chip 0 whole is never handed it
            why = await refused(r, "on-split")
            assert f"was granted ascend card {split}, which is in partition mode" in why
            assert not await marked(r, "on-split")
            r.kubelet.release("default/on-split")
            # a pod of the whole chip is served as before: its device node and ASCEND_VISIBLE_DEVICES
            await r.cluster.delete_pod("default", "on-split")
            await r.bind_whole("on-whole", whole)
            answer = await r.kubelet.allocate(RESOURCE, "default/on-whole", 1)
            assert answer.envs["ASCEND_VISIBLE_DEVICES"] == "1"
            assert await marked(r, "on-whole")

            # the claim goes, both vNPUs are destroyed once idle long enough: chip 0 is offered again
            assert await r.unprepare(c) == ""
            await r.reap()
            assert dcmi_fake.chip_state(state, 0).get("vnpus", []) == []
            await r.kubelet.wait_for(lambda k: r.slots(split) == {"Healthy"})
            await r.bind_whole("later", split)
            answer = await r.kubelet.allocate(RESOURCE, "default/later", 1)
            assert answer.envs["ASCEND_VISIBLE_DEVICES"] == "0"


async def test_an_amd_card_in_a_partition_mode_is_withheld_until_it_is_back_in_spx(smi: Any, tmp_path: Path) -> None:
    state = tmp_path / "amd.json"
    # card 0 was left in CPX/NPS4 (eight partitions); card 1 is whole (SPX/NPS1)
    amd_fake.write_state(state, [amd_fake.card("MI300X", 0, compute="CPX", memory="NPS4"),
                                 amd_fake.card("MI300X", 1)])
    with patch.dict(os.environ, {amd_fake.STATE_ENV: str(state)}):
        backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: -1)
        async with both(AMD, backend, AmdVendor(backend)) as r:
            split, whole = r.cards()
            assert r.slots(split) == {"Unhealthy"} and r.slots(whole) == {"Healthy"}

            c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("cpx", [_partition("gpu-0-cpx-nps4-3")],
                                                                     MIG_CLASS))
            assert await r.prepare(c) == ""
            await r.bind_whole("on-split", split)
            why = await refused(r, "on-split")
            assert f"was granted amd card {split}, which is in partition mode" in why
            assert r.slots(split) == {"Unhealthy"}

            assert await r.unprepare(c) == ""
            await r.reap()
            card = amd_fake.read_state(state)["cards"][0]
            assert (card["compute"], card["memory"]) == ("SPX", "NPS1")
            await r.kubelet.wait_for(lambda k: r.slots(split) == {"Healthy"})
            # the pod refused before is served now that the card is whole (kubelet's retry)
            r.kubelet.release("default/on-split")
            answer = await r.kubelet.allocate(RESOURCE, "default/on-split", 1)
            assert [d.host_path for d in answer.devices][0] == "/dev/kfd"
            assert await marked(r, "on-split")


async def test_the_label_puts_every_partitionable_amd_card_in_partition_mode(smi: Any, tmp_path: Path) -> None:
    """With gpupool.io/mig-mode-switch=allowed the DRA driver publishes a whole MI300X as its partitions: the
    device plugin does not offer it, while the MI210 (no partition modes) stays a whole card."""
    state = tmp_path / "amd.json"
    amd_fake.write_state(state, [amd_fake.card("MI300X", 0), amd_fake.card("MI210", 1)])
    with patch.dict(os.environ, {amd_fake.STATE_ENV: str(state)}):
        backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: -1)
        async with both(AMD, backend, AmdVendor(backend), label=True) as r:
            mi300x, mi210 = r.cards()
            assert r.slots(mi300x) == {"Unhealthy"} and r.slots(mi210) == {"Healthy"}
            await r.bind_whole("big", mi300x)
            assert "which is in partition mode" in await refused(r, "big")


async def test_an_nvidia_mig_gpu_keeps_its_slots_for_mig_pods_and_refuses_a_whole_grant(tmp_path: Path) -> None:
    node = MigNode(tmp_path)
    gpus = four_gpus()
    gpus = replace(gpus, devices=(replace(gpus.devices[0], mig_enabled=True), *gpus.devices[1:]))
    async with rig(gpus, mig=node.manager, dra=True, device_plugin_with_dra=True, dra_resync_s=0.05) as r:
        slots = r.kubelet.plugins[RESOURCE].devices
        assert {h for d, h in slots.items() if d.startswith(MIG_GPU + "::")} == {"Healthy"}
        await scheduler_binds(r.cluster, pod_object("share", 1), [(MIG_GPU, 0, 20480, 25.0)])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, [f"{MIG_GPU}::0"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"GPU {MIG_GPU} under isolation hook, but the GPU is in MIG mode" in err.value.details()
        assert node.driver.layout(MIG_GPU) == []
        await r.cluster.delete_pod("default", "share")
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 4)  # the same slot serves a MIG pod
        answer = await r.kubelet.allocate_ids(RESOURCE, [f"{MIG_GPU}::0"])
        assert answer.envs["GPUPOOL_MIG_PROFILE"] == "3g.40gb"
