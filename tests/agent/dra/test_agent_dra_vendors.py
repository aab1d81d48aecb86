"""Claims of Ascend and AMD cards through the agent as DRA driver (issue 40): the claim's CDI spec holds that
vendor's devices (here the fake backend's environment-only ones) and no NVIDIA variable; a share the vendor's
cards cannot be held to is refused at prepare with the reason. Driven over the real unix sockets as kubelet
drives them (tests/agent/dra/test_agent_dra.py's helpers)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.service import Agent
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import RESOURCE_CLAIMS
from tests.agent.agent_helpers import NODE, agent_config
from tests.agent.dra.test_agent_dra import DraRig, _register, claim, prepare, share, spec_of

ASCEND_SHARED = "/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"


@asynccontextmanager
async def vendor_rig(vendor: str, model: str, memory_mib: int) -> AsyncIterator[DraRig]:
    """The agent as DRA driver on three fake cards of `vendor`."""
    directory = Path(tempfile.mkdtemp(prefix="gpv-", dir="/tmp"))  # unix socket paths stay short
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "32"}}})
    backend = FakeBackend(parse_fake_description(
        {"vendor": vendor, "gpus": [{"count": 3, "uuid_prefix": f"{vendor}-card", "model": model,
                                     "memory_mib": memory_mib}]}, "test"))
    config = agent_config(directory, dra=True, dra_resync_s=0.05)
    agent = Agent(config, backend, ClusterPortAgent(cluster))
    await agent.start()
    try:
        info = await _register(config.kubelet_root)
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        yield DraRig(cluster, backend, agent, directory, channel, v1_grpc.DRAPluginStub(channel), info)
        await channel.close()
    finally:
        await agent.stop()
        shutil.rmtree(directory, ignore_errors=True)


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


async def test_a_whole_ascend_card_claim_gets_the_chips_devices_and_no_nvidia_variable() -> None:
    async with vendor_rig("ascend", "Ascend910B", 65536) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("infer", [share("gpu-2", None, None)]))
        uid = c["metadata"]["uid"]
        reply = await prepare(r, c)
        assert reply.claims[uid].error == ""
        spec = spec_of(r, uid)
        env = env_of(spec)
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        # gpu-2 is the third card (index 2); a whole card under the class's hook is served as none on Ascend
        assert {k: env[k] for k in ("ASCEND_VISIBLE_DEVICES", "GPUPOOL_FAKE_DEVICE_NODES", "GPUPOOL_ISOLATION",
                                    "GPUPOOL_MEMORY_LIMIT_MIB")} == {
            "ASCEND_VISIBLE_DEVICES": "2", "GPUPOOL_FAKE_DEVICE_NODES": f"/dev/davinci2,{ASCEND_SHARED}",
            "GPUPOOL_ISOLATION": "none", "GPUPOOL_MEMORY_LIMIT_MIB": "65536"}
        assert "mounts" not in spec["devices"][0]["containerEdits"]  # no library for a whole card here


async def test_a_share_of_an_ascend_card_is_refused_at_prepare_with_the_reason() -> None:
    async with vendor_rig("ascend", "Ascend910B", 65536) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("share", [share("gpu-0", "16Gi", "25")]))
        uid = c["metadata"]["uid"]
        reply = await prepare(r, c)
        assert "gpupool has no memory or compute limiter for ascend cards" in reply.claims[uid].error


async def test_an_amd_card_claim_names_kfd_and_its_render_node() -> None:
    async with vendor_rig("amd", "MI300X", 196592) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("train", [share("gpu-1", None, None)]))
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        env = env_of(spec_of(r, uid))
        assert env["GPUPOOL_FAKE_DEVICE_NODES"] == "/dev/kfd,/dev/dri/renderD129"  # index 1: minor 128 + 1
        assert "NVIDIA_VISIBLE_DEVICES" not in env and "ASCEND_VISIBLE_DEVICES" not in env
