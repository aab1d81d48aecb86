"""Claims of AMD partitions and Ascend vNPUs through the agent as DRA driver (issue 40), over the fake vendor
libraries (the real amdsmi binding over the fake libamd_smi.so; the fake DCMI library): the card is published
as its partitions, the claim's partition is carved at prepare and handed out with that partition's own
devices, a claim for another AMD mode while partitions are in use is refused, and unprepare releases it
(destroyed by the idle reaping, the AMD card back in SPX/NPS1). Driven over the real unix sockets as kubelet
drives them (tests/agent/dra/test_agent_dra.py's helpers)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import grpc
import pytest

from gpupool.agent.devices.amd import AmdBackend, AmdVendor
from gpupool.agent.devices.ascend import AscendBackend, AscendVendor
from gpupool.agent.devices.discovery import DiscoveryBackend
from gpupool.agent.devices.mig import agent_mig_manager
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.service import Agent
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import RESOURCE_CLAIMS
from gpupool.core.vendors import AMD, ASCEND
from tests.agent.agent_helpers import NODE, agent_config
from tests.agent.dra.test_agent_dra import (
    MIG_CLASS,
    DraRig,
    _eventually_async,
    _partition,
    _pool,
    _register,
    claim,
    prepare,
    ref,
    spec_of,
)
from tests.agent.fakes import ascend as dcmi_fake
from tests.agent.fakes.amd import amd_fake


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return amd_fake.load_binding(tmp_path_factory.mktemp("rocm"))


@asynccontextmanager
async def partition_rig(vendor: str, backend: DiscoveryBackend, source: Any, directory: Path) -> AsyncIterator[DraRig]:
    """The agent as DRA driver over `backend` (the node's label lets it partition idle cards)."""
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "32"}}})
    config = agent_config(directory, dra=True, dra_resync_s=0.05, backend="amdsmi" if vendor == AMD else "dcmi",
                          fake_file=None)
    manager = agent_mig_manager(backend, directory, idle_after_s=0, clock=lambda: 1000.0, allow_mode_switch=True)
    assert manager is not None
    agent = Agent(config, backend, ClusterPortAgent(cluster), mig=manager, vendors={vendor: source})
    await agent.start()
    try:
        info = await _register(config.kubelet_root)
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        yield DraRig(cluster, None, agent, directory, channel, v1_grpc.DRAPluginStub(channel), info)  # type: ignore[arg-type]
        await channel.close()
    finally:
        await agent.stop()


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpp-", dir="/tmp"))  # unix socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def entries(r: DraRig) -> list[tuple[str, int, str | None]]:
    assert r.agent.mig is not None
    return sorted((e.profile, e.start, e.pod) for e in r.agent.mig.entries)


def edits(r: DraRig, uid: str) -> dict[str, Any]:
    edit: dict[str, Any] = spec_of(r, uid)["devices"][0]["containerEdits"]
    return edit


def env_of(edit: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edit["env"])


async def unprepare(r: DraRig, c: dict[str, Any]) -> str:
    reply = await r.stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[ref(c)]), timeout=10)
    error: str = reply.claims[c["metadata"]["uid"]].error
    return error


async def published(r: DraRig) -> list[dict[str, Any]]:
    async def two_slices() -> bool:
        return len(await _pool(r)) == 2

    await _eventually_async(two_slices)
    return await _pool(r)


async def test_a_cpx_nps4_claim_is_carved_handed_its_render_node_and_released(smi: Any, directory: Path) -> None:
    state = directory / "amd.json"
    amd_fake.write_state(state, [amd_fake.card("MI300X", 0), amd_fake.card("MI300X", 1)])
    with patch.dict(os.environ, {amd_fake.STATE_ENV: str(state)}):
        backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: -1)
        async with partition_rig(AMD, backend, AmdVendor(backend), directory) as r:
            devices, counters = await published(r)
            names = [d["name"] for d in devices["spec"]["devices"]]
            # 2 cards x 27 placements (CPX 8+8, QPX 4+4, DPX 2, SPX 1), no shared gpu-<i> device
            assert len(names) == 54 and "gpu-0" not in names and "gpu-1-cpx-nps4-3" in names
            assert [s["name"] for s in counters["spec"]["sharedCounters"]] == ["gpu-0-mig", "gpu-1-mig"]

            c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("cpx", [_partition("gpu-0-cpx-nps4-3")],
                                                                     MIG_CLASS))
            uid = c["metadata"]["uid"]
            assert (await prepare(r, c)).claims[uid].error == ""
            card = amd_fake.read_state(state)["cards"][0]
            assert (card["compute"], card["memory"]) == ("CPX", "NPS4")
            # the mode made all eight partitions: the claim holds XCC 3's, the others are idle (reusable)
            assert entries(r) == [("CPX/NPS4", k, uid if k == 3 else None) for k in range(8)]
            edit = edits(r, uid)
            held = r.agent.mig.holder(uid) if r.agent.mig is not None else None
            assert held is not None
            render = backend.render_nodes(held.gpu)[3]  # partition 3's own node, not the card's eight
            assert [d["path"] for d in edit["deviceNodes"]] == ["/dev/kfd", render]
            e = env_of(edit)
            assert (e["GPUPOOL_ISOLATION"], e["GPUPOOL_MIG_PROFILE"]) == ("mig", "CPX/NPS4")
            assert "NVIDIA_VISIBLE_DEVICES" not in e
            # 192 GiB as AMD SMI reports it (196,592 MiB) over 8, rounded down; 38 of 304 CUs = 12.5 %
            assert (e["GPUPOOL_MEMORY_LIMIT_MIB"], e["GPUPOOL_CORES_PERCENT"]) == ("24574", "12.5")

            async def narrowed() -> bool:  # card 0's slice shows its mode only while the partition is held
                names = [d["name"] for d in (await _pool(r))[0]["spec"]["devices"]]
                return len(names) == 8 + 27 and all(n.startswith("gpu-0-cpx-nps4-") for n in names[:8])

            await _eventually_async(narrowed)
            other = await r.cluster.create_object(RESOURCE_CLAIMS, claim("qpx", [_partition("gpu-0-qpx-nps1-0")],
                                                                         MIG_CLASS))
            error = (await prepare(r, other)).claims[other["metadata"]["uid"]].error
            assert "no free slices for QPX/NPS1" in error  # another mode while XCC 3 is in use: never
            assert entries(r) == [("CPX/NPS4", k, uid if k == 3 else None) for k in range(8)]

            assert await unprepare(r, c) == ""
            assert r.agent.service is not None
            await r.agent.service.housekeeping()  # idle for 0 s of 0: every partition destroyed (released)
            assert entries(r) == []
            card = amd_fake.read_state(state)["cards"][0]
            assert (card["compute"], card["memory"]) == ("SPX", "NPS1")

            async def every_mode_again() -> bool:
                return len((await _pool(r))[0]["spec"]["devices"]) == 54

            await _eventually_async(every_mode_again)


async def test_a_vir08_claim_is_carved_as_a_vnpu_handed_its_node_and_destroyed_after_unprepare(
        directory: Path) -> None:
    state = directory / "dcmi.json"
    dcmi_fake.write_state(state, [{"card_id": 0, "chips": [dcmi_fake.card_910b(0)]}])
    with patch.dict(os.environ, {dcmi_fake.STATE_ENV: str(state)}):
        backend = AscendBackend(str(dcmi_fake.library()), numa_reader=lambda bus: 0)
        async with partition_rig(ASCEND, backend, AscendVendor(backend), directory) as r:
            devices, counters = await published(r)
            names = [d["name"] for d in devices["spec"]["devices"]]
            assert len(names) == 4 * 15 and "gpu-0-vir08-0" in names and "gpu-0-vir16-14" in names
            assert counters["spec"]["sharedCounters"][0]["counters"]["aicore"] == {"value": "30"}

            c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("vir", [_partition("gpu-0-vir08-2")],
                                                                     MIG_CLASS))
            uid = c["metadata"]["uid"]
            assert (await prepare(r, c)).claims[uid].error == ""
            assert entries(r) == [("vir08", 2, uid)]
            assert [(v["vdev_id"], v["template"]) for v in dcmi_fake.chip_state(state, 0)["vnpus"]] == [(102, "vir08")]
            held = r.agent.mig.holder(uid) if r.agent.mig is not None else None
            assert held is not None and held.uuid == "102"  # vNPU id: chip base 100 + slot 2
            edit = edits(r, uid)
            assert edit["deviceNodes"][0] == {"path": "/dev/davinci102", "hostPath": "/dev/vdavinci102",
                                              "permissions": "rw"}
            e = env_of(edit)
            assert (e["ASCEND_VISIBLE_DEVICES"], e["ASCEND_RUNTIME_OPTIONS"], e["GPUPOOL_MIG_PROFILE"]) == (
                "102", "VIRTUAL", "vir08")
            # 8 of the catalogue's 30 AI Cores: 266 milli, 26.6 %; 65,536 MiB x 17,476 / 65,536 = 17,476 MiB
            assert (e["GPUPOOL_MEMORY_LIMIT_MIB"], e["GPUPOOL_CORES_PERCENT"]) == ("17476", "26.6")

            assert await unprepare(r, c) == ""
            assert entries(r) == [("vir08", 2, None)]
            assert r.agent.service is not None
            await r.agent.service.housekeeping()
            assert entries(r) == []
            assert dcmi_fake.chip_state(state, 0).get("vnpus", []) == []
