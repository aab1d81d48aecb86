"""The agent as DRA driver (gpupool.agent.dra.driver), driven the way kubelet drives it: registration on the
plugins_registry socket, then NodePrepareResources / NodeUnprepareResources on the socket it names, over
real unix sockets; claims and the ResourceSlice live in the in-memory cluster.

Expected answers are written from the claim's allocation and the documented contract (docs/claims.md,
gpupool.api.dra), not from the driver's code."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import MigManager
from gpupool.agent.dra.cdi import cdi_path
from gpupool.agent.dra.claims import CHECKPOINT_FILE
from gpupool.agent.enforce.watchdog import Limit
from gpupool.agent.kubelet.dra_service import DraServer
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.proto import dra_v1beta1_pb2 as v1beta1
from gpupool.agent.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from gpupool.agent.proto import pluginregistration_v1_pb2 as reg
from gpupool.agent.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from gpupool.agent.service import Agent
from gpupool.agent.state.hookdir import read_limits
from gpupool.api.dra import DRIVER, TAINT_NOT_READY, TAINT_UNHEALTHY
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.agent.agent_helpers import NODE, agent_config, eventually, four_gpus

MIB = 1 << 20
MIG_GPU = "GPU-aaaa-0"
MIG_CLASS = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "mig"}}}]


@dataclass
class DraRig:
    cluster: MemoryCluster
    backend: FakeBackend
    agent: Agent
    directory: Path
    channel: grpc.aio.Channel
    stub: v1_grpc.DRAPluginStub
    info: reg.PluginInfo

    @property
    def server(self) -> DraServer:
        assert self.agent.dra_server is not None
        return self.agent.dra_server

    mig: Callable[[], MigManager] | None = None

    async def restart(self) -> None:
        await self.agent.stop()
        self.agent = Agent(self.agent.config, self.backend, ClusterPortAgent(self.cluster),
                           mig=None if self.mig is None else self.mig())
        await self.agent.start()


async def _register(kubelet_root: Path) -> reg.PluginInfo:
    """What kubelet's plugin watcher does with a new socket in plugins_registry."""
    socket = kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info: reg.PluginInfo = await stub.GetInfo(reg.InfoRequest(), timeout=5)
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
    return info


@asynccontextmanager
async def dra_rig(mig: bool = False, **overrides: Any) -> AsyncIterator[DraRig]:
    """The agent as DRA driver on four A100-80GB GPUs; with `mig`, GPU 0 is in MIG mode (fake MIG driver,
    which outlives agent restarts as the hardware does)."""
    directory = Path(tempfile.mkdtemp(prefix="gpd-", dir="/tmp"))  # unix socket paths stay short
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "32"}}})
    gpus = four_gpus()
    if mig:
        gpus = replace(gpus, devices=(replace(gpus.devices[0], mig_enabled=True), *gpus.devices[1:]))
    backend = FakeBackend(gpus)
    config = agent_config(directory, dra=True, kubelet_root=directory / "kubelet", cdi_dir=directory / "cdi",
                          dra_resync_s=0.05, **overrides)
    make_mig: Callable[[], MigManager] | None = None
    if mig:
        hardware = FakeMigDriver({MIG_GPU: "A100-80GB"})
        make_mig = lambda: MigManager(hardware, directory / "mig.json", lambda: 1000.0, idle_after_s=0)  # noqa: E731
    agent = Agent(config, backend, ClusterPortAgent(cluster), mig=None if make_mig is None else make_mig())
    await agent.start()
    try:
        info = await _register(config.kubelet_root)
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        r = DraRig(cluster, backend, agent, directory, channel, v1_grpc.DRAPluginStub(channel), info, make_mig)
        yield r
        await channel.close()
    finally:
        await r.agent.stop() if "r" in locals() else await agent.stop()
        shutil.rmtree(directory, ignore_errors=True)


def claim(name: str, results: list[dict[str, Any]], configs: list[dict[str, Any]] | None = None,
          namespace: str = "team-a") -> dict[str, Any]:
    """An allocated claim, as kube-scheduler leaves it (status.allocation); the API gives it its UID."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {
            "results": results,
            "config": configs if configs is not None else [
                {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "hook"}}}],
        }}},
    }


def share(device: str, memory: str | None, cores: str | None, request: str = "gpu") -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, "shareID": f"share-{device}",
            **({"consumedCapacity": consumed} if consumed else {})}


def ref(c: dict[str, Any]) -> v1.Claim:
    m = c["metadata"]
    return v1.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


async def prepare(r: DraRig, *claims: dict[str, Any]) -> v1.NodePrepareResourcesResponse:
    reply: v1.NodePrepareResourcesResponse = await r.stub.NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=[ref(c) for c in claims]), timeout=10)
    return reply


def spec_of(r: DraRig, uid: str) -> dict[str, Any]:
    return dict(json.loads(cdi_path(r.agent.config.cdi_dir, uid).read_text()))


async def test_registration_names_the_driver_and_both_service_versions() -> None:
    async with dra_rig() as r:
        assert (r.info.type, r.info.name) == ("DRAPlugin", DRIVER)
        assert list(r.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # v1 preferred
        assert Path(r.info.endpoint).is_socket()
        assert r.server.registrations == 1


async def test_a_share_claim_becomes_one_cdi_device_with_its_limits() -> None:
    async with dra_rig() as r:
        c = claim("train", [share("gpu-2", "8Gi", "30")])
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        reply = await prepare(r, c)
        answer = reply.claims[uid]
        assert answer.error == ""
        assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids), d.share_id)
                for d in answer.devices] == [(["gpu"], NODE, "gpu-2", [f"gpu.gpupool.io/claim={uid}"], "share-gpu-2")]
        spec = spec_of(r, uid)
        assert (spec["kind"], [d["name"] for d in spec["devices"]]) == ("gpu.gpupool.io/claim", [uid])
        edits = spec["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        # gpu-2 is GPU-aaaa-2 (index 2); 8Gi = 8192 MiB; isolation hook from the class
        assert {k: env[k] for k in ("NVIDIA_VISIBLE_DEVICES", "GPUPOOL_MEMORY_LIMIT_MIB", "GPUPOOL_CORES_PERCENT",
                                    "GPUPOOL_ISOLATION")} == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-2", "GPUPOOL_MEMORY_LIMIT_MIB": "8192", "GPUPOOL_CORES_PERCENT": "30",
            "GPUPOOL_ISOLATION": "hook"}
        mounts = {m["containerPath"]: m for m in edits["mounts"]}
        assert "ro" in mounts["/run/gpupool/limits"]["options"]
        assert "rw" in mounts["/run/gpupool/hook"]["options"]
        assert all("ro" in mounts[p]["options"] for p in ("/usr/local/lib/gpupool/libgpupool_hook.so",
                                                           "/etc/ld.so.preload"))
        limits = read_limits(Path(mounts["/run/gpupool/limits"]["hostPath"]))
        assert limits is not None and limits["ndev"] == 1
        assert limits["limit"][0] == 8192 * MIB and limits["cores"][0] == 300_000  # 30 % in parts per million


async def test_prepare_again_is_the_same_answer_also_after_a_restart_without_the_claim() -> None:
    async with dra_rig() as r:
        c = claim("train", [share("gpu-0", "1Gi", "10")])
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        first = await prepare(r, c)
        assert first.claims[uid].error == ""
        assert await prepare(r, c) == first
        await r.restart()
        # The restarted agent answers from its checkpoint: the claim is not even read again.
        await r.cluster.delete_object(RESOURCE_CLAIMS, "train", namespace="team-a")
        info = await _register(r.agent.config.kubelet_root)
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
            again = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[ref(c)]), timeout=10)
            assert again == first
            # ... and the restarted agent unprepares what the first one prepared
            gone = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[ref(c)]), timeout=10)
        assert dict(gone.claims) == {uid: v1.NodeUnprepareResourceResponse(error="")}
        assert not cdi_path(r.agent.config.cdi_dir, uid).exists()
        assert not (r.agent.config.hook_root / "claims" / uid).exists()
        doc = json.loads((r.agent.config.checkpoint_path / CHECKPOINT_FILE).read_text())
        assert doc["claims"] == []


async def test_unprepare_of_an_unknown_claim_succeeds() -> None:
    async with dra_rig() as r:
        reply = await r.stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace="x", name="y", uid="never-seen")]), timeout=10)
        assert dict(reply.claims) == {"never-seen": v1.NodeUnprepareResourceResponse(error="")}


async def test_prepared_hook_claims_are_what_the_watchdog_holds() -> None:
    """The second line (the watchdog) holds a prepared hook claim's pods to the claim's share; a whole GPU
    (isolation none) has no second line."""
    async with dra_rig() as r:
        hook = await r.cluster.create_object(RESOURCE_CLAIMS, claim("train", [share("gpu-2", "8Gi", "30")]))
        whole = await r.cluster.create_object(RESOURCE_CLAIMS, claim("serve", [share("gpu-1", None, None)], [
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "none"}}}]))
        reply = await prepare(r, hook, whole)
        assert [reply.claims[c["metadata"]["uid"]].error for c in (hook, whole)] == ["", ""]
        assert r.agent._watched_claims() == {"team-a/train": {"GPU-aaaa-2": Limit(8192, 30.0, elastic=False)}}


async def test_the_tenants_claim_config_cannot_choose_the_isolation() -> None:
    """A claim's own config (FromClaim) is the tenant's: isolation none there would lift the hook's caps."""
    async with dra_rig() as r:
        configs = [
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "hook"}}},
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"isolation": "none"}}},
        ]
        c = claim("sly", [share("gpu-1", "2Gi", "5")], configs)
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        env = dict(e.split("=", 1) for e in spec_of(r, uid)["devices"][0]["containerEdits"]["env"])
        assert env["GPUPOOL_ISOLATION"] == "hook" and env["GPUPOOL_MEMORY_LIMIT_MIB"] == "2048"


@pytest.mark.parametrize(("results", "configs", "expected"), [
    # isolation none serves whole GPUs only: a partial share would run uncapped
    ([share("gpu-0", "8Gi", "30")],
     [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "none"}}}],
     "isolation none, which serves whole GPUs only"),
    ([{**share("gpu-0", "1Gi", "10"), "adminAccess": True}], None, "admin access to gpu-0 is not served"),
    ([share("gpu-9", "1Gi", "10")], None, "has no GPU gpu-9"),
    ([share("nic-0", "1Gi", "10")], None, "device 'nic-0' is not one gpupool publishes"),
    ([{**share("gpu-0", "1Gi", "10"), "pool": "other-node"}], None, "devices of other nodes' pools"),
])
async def test_claims_that_cannot_be_served_get_a_clear_error(results: list[dict[str, Any]],
                                                              configs: list[dict[str, Any]] | None,
                                                              expected: str) -> None:
    async with dra_rig() as r:
        c = claim("bad", results, configs)
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        answer = (await prepare(r, c)).claims[uid]
        assert expected in answer.error and not answer.devices
        assert not cdi_path(r.agent.config.cdi_dir, uid).exists()


async def test_a_replaced_or_unallocated_claim_is_refused() -> None:
    async with dra_rig() as r:
        c = claim("old", [share("gpu-0", "1Gi", "10")])
        await r.cluster.create_object(RESOURCE_CLAIMS, c)
        stale = v1.Claim(namespace="team-a", name="old", uid="uid-old")  # kubelet's view of the earlier object
        reply = await r.stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[stale]), timeout=10)
        assert "is now another object" in reply.claims["uid-old"].error
        pending = await r.cluster.create_object(RESOURCE_CLAIMS, {**claim("pending", []), "status": {}})
        assert "is not allocated" in (await prepare(r, pending)).claims[pending["metadata"]["uid"]].error
        missing = v1.Claim(namespace="team-a", name="nope", uid="uid-x")
        reply = await r.stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[missing]), timeout=10)
        assert "not found" in reply.claims["uid-x"].error


async def test_v1beta1_kubelets_are_served_too() -> None:
    async with dra_rig() as r:
        c = claim("old-kubelet", [share("gpu-3", None, None)])  # no consumedCapacity: the whole GPU
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        stub = v1beta1_grpc.DRAPluginStub(r.channel)
        m = c["metadata"]
        reply = await stub.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(
            claims=[v1beta1.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])]), timeout=10)
        assert [(d.device_name, list(d.cdi_device_ids)) for d in reply.claims[uid].devices] == [
            ("gpu-3", [f"gpu.gpupool.io/claim={uid}"])]
        env = dict(e.split("=", 1) for e in spec_of(r, uid)["devices"][0]["containerEdits"]["env"])
        assert (env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == ("81920", "100")


async def test_memory_only_share_gets_no_compute_cap() -> None:
    """cores 0 consumed (the request policy's default): it competes for compute, uncapped (100)."""
    async with dra_rig() as r:
        c = claim("mem", [share("gpu-1", "4Gi", "0")])
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        env = dict(e.split("=", 1) for e in spec_of(r, uid)["devices"][0]["containerEdits"]["env"])
        assert (env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == ("4096", "100")


# --- the ResourceSlice --------------------------------------------------------------------------------------


async def _slice(r: DraRig) -> dict[str, Any]:
    slices, _ = await r.cluster.list_objects(RESOURCE_SLICES)
    assert len(slices) == 1
    return dict(slices[0])


def _taints(s: dict[str, Any]) -> dict[str, list[str]]:
    return {d["name"]: [t["key"] for t in d.get("taints", [])] for d in s["spec"]["devices"]}


async def test_the_slice_shows_each_gpu_with_its_capacity_and_is_owned_by_the_node() -> None:
    async with dra_rig() as r:
        s = await _slice(r)
        node = await r.cluster.get_node(NODE)
        assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
        assert s["spec"]["pool"]["name"] == NODE
        assert s["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        devices = {d["name"]: d for d in s["spec"]["devices"]}
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        gpu1 = devices["gpu-1"]
        assert gpu1["attributes"]["uuid"] == {"string": "GPU-aaaa-1"}
        assert gpu1["attributes"]["nvlinkPeers"] == {"string": "0"}
        assert gpu1["capacity"]["memory"]["value"] == "81920Mi" and gpu1["allowMultipleAllocations"] is True
        assert _taints(s) == {f"gpu-{i}": [] for i in range(4)}


async def test_an_unhealthy_gpu_is_tainted_and_the_taint_goes_when_it_recovers() -> None:
    async with dra_rig() as r:
        first = await _slice(r)
        r.backend.inject_xid("GPU-aaaa-2", 79)  # fallen off the bus: probes fail until healed
        await eventually(lambda: r.agent.table is not None and "GPU-aaaa-2" in r.agent.table.tracker.faults)
        got: dict[str, Any] = {}

        async def tainted() -> bool:
            got.update(await _slice(r))
            return _taints(got)["gpu-2"] == [TAINT_UNHEALTHY]

        await _eventually_async(tainted)
        assert {k: v for k, v in _taints(got).items() if k != "gpu-2"} == {"gpu-0": [], "gpu-1": [], "gpu-3": []}
        assert got["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]
        r.backend.heal("GPU-aaaa-2")

        async def clean() -> bool:
            return _taints(await _slice(r))["gpu-2"] == []

        await _eventually_async(clean)


async def test_a_node_failing_validation_taints_every_device() -> None:
    async with dra_rig() as r:
        assert r.agent.table is not None
        await r.agent.table.withhold("toolkit: accept-nvidia-visible-devices-envvar-when-unprivileged = true")

        async def tainted() -> bool:
            return set(map(tuple, _taints(await _slice(r)).values())) == {(TAINT_NOT_READY,)}

        await _eventually_async(tainted)
        c = claim("late", [share("gpu-0", "1Gi", "10")])
        c = await r.cluster.create_object(RESOURCE_CLAIMS, c)
        uid = c["metadata"]["uid"]
        assert "holds its GPUs back" in (await prepare(r, c)).claims[uid].error


async def test_a_deleted_slice_is_put_back_and_an_unchanged_one_is_not_rewritten() -> None:
    """kubelet deletes a driver's slices when it starts; the driver's resync puts them back."""
    async with dra_rig() as r:
        s = await _slice(r)
        version = s["metadata"]["resourceVersion"]
        assert r.agent.dra is not None and not await r.agent.dra.publish(s["metadata"]["ownerReferences"][0]["uid"])
        assert (await _slice(r))["metadata"]["resourceVersion"] == version
        await r.cluster.delete_object(RESOURCE_SLICES, s["metadata"]["name"])

        async def back() -> bool:
            slices, _ = await r.cluster.list_objects(RESOURCE_SLICES)
            return len(slices) == 1

        await _eventually_async(back)


async def _eventually_async(check: Any, timeout: float = 10.0) -> None:
    """Poll an async check until it holds; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the timeout")
        await asyncio.sleep(0.02)



async def test_prepares_are_counted_on_the_agents_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.agent.agent_helpers import scrape_metrics

    async with dra_rig() as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("m", [share("gpu-0", "1Gi", "10")]))
        await prepare(r, c)
        await prepare(r, c)  # a repeat answered from the checkpoint: not a second preparation
        bad = await r.cluster.create_object(RESOURCE_CLAIMS, claim("bad", [share("gpu-7", "1Gi", "10")]))
        await prepare(r, bad)
        text = await scrape_metrics(r)  # type: ignore[arg-type]
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name.startswith("gpupool_dra_")}
        assert samples["gpupool_dra_claims_prepared"] == 1
        assert samples["gpupool_dra_prepare_seconds_count"] == 1 and samples["gpupool_dra_prepare_seconds_sum"] > 0
        assert samples["gpupool_dra_prepare_errors_total"] == 1


# --- MIG partitions ---------------------------------------------------------------------------------------


async def _pool(r: DraRig) -> list[dict[str, Any]]:
    slices, _ = await r.cluster.list_objects(RESOURCE_SLICES)
    return sorted(slices, key=lambda s: str(s["metadata"]["name"]))


def _partition(name: str) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": name}


def _mig_instances(r: DraRig) -> list[tuple[str, int, str | None]]:
    assert r.agent.mig is not None
    return [(e.profile, e.start, e.pod) for e in r.agent.mig.entries]


async def test_a_gpu_in_mig_mode_is_published_as_partitions_beside_the_shared_gpus() -> None:
    async with dra_rig(mig=True) as r:
        async def two_slices() -> bool:
            return len(await _pool(r)) == 2

        await _eventually_async(two_slices)
        devices_slice, counters_slice = await _pool(r)
        names = [d["name"] for d in devices_slice["spec"]["devices"]]
        assert [n for n in names if not n.startswith("gpu-0-")] == ["gpu-1", "gpu-2", "gpu-3"]
        assert len(names) == 3 + 25 and "gpu-0" not in names  # A100-80GB: 25 placements
        assert [c["name"] for c in counters_slice["spec"]["sharedCounters"]] == ["gpu-0-mig"]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in (devices_slice, counters_slice)} == {2}
        assert devices_slice["spec"]["pool"]["generation"] == counters_slice["spec"]["pool"]["generation"]


async def test_a_mig_claim_is_carved_at_prepare_held_while_prepared_and_released_by_unprepare() -> None:
    async with dra_rig(mig=True) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("infer", [_partition("gpu-0-3g40gb-4")], MIG_CLASS))
        uid = c["metadata"]["uid"]
        first = await prepare(r, c)
        assert first.claims[uid].error == ""
        assert _mig_instances(r) == [("3g.40gb", 4, uid)]
        assert r.agent.mig is not None
        entry = r.agent.mig.holder(uid)
        assert entry is not None and entry.uuid is not None and entry.uuid.startswith("MIG-")
        env = dict(e.split("=", 1) for e in spec_of(r, uid)["devices"][0]["containerEdits"]["env"])
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPUPOOL_ISOLATION"], env["GPUPOOL_MIG_PROFILE"]) == (
            entry.uuid, "mig", "3g.40gb")
        assert "mounts" not in spec_of(r, uid)["devices"][0]["containerEdits"]  # hardware isolation: no library
        assert await prepare(r, c) == first  # kubelet asking again: same device, no second instance
        # Housekeeping (no pod on the node holds it) keeps the instance: the prepared claim does, even
        # with the instances' idle time at 0 s.
        assert r.agent.service is not None
        await r.agent.service.housekeeping()
        assert _mig_instances(r) == [("3g.40gb", 4, uid)]
        # ... also across a restart of the agent (reconciled with the DRA checkpoint)
        await r.restart()
        assert _mig_instances(r) == [("3g.40gb", 4, uid)]
        info = await _register(r.agent.config.kubelet_root)
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
            gone = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[ref(c)]), timeout=10)
        assert gone.claims[uid].error == ""
        assert _mig_instances(r) == [("3g.40gb", 4, None)]  # idle: the next claim of its profile reuses it
        await r.agent.service.housekeeping()  # idle for 0 s of 0: destroyed
        assert _mig_instances(r) == []


@pytest.mark.parametrize(("results", "configs", "message"), [
    ([share("gpu-0", "1Gi", "10")], None, "GPU gpu-0 is in MIG mode; it serves MIG partitions only"),
    ([_partition("gpu-1-3g40gb-4")], MIG_CLASS, "gpu-1-3g40gb-4: the GPU is not in MIG mode"),
    ([_partition("gpu-0-3g40gb-2")], MIG_CLASS, "A100-80GB has no MIG profile 3g.40gb at slice 2"),
    ([_partition("gpu-0-3g40gb-4")], None, "MIG partitions are served only by isolation mig"),
])
async def test_claims_the_mig_gpu_cannot_serve_are_refused(results: list[dict[str, Any]],
                                                           configs: list[dict[str, Any]] | None,
                                                           message: str) -> None:
    async with dra_rig(mig=True) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("bad", results, configs))
        assert message in (await prepare(r, c)).claims[c["metadata"]["uid"]].error
        assert _mig_instances(r) == []


# --- memory oversubscription ---------------------------------------------------------------------------------


async def test_a_class_with_memory_oversubscription_puts_it_in_the_claims_limits_file() -> None:
    """Class `memoryOversubscription: "1.5"`: an 8 GiB share may allocate 4 GiB more from host memory; the
    agent writes that next to the cap in limits.v1 (at offset 1688, native/gp.h), where only it can."""
    async with dra_rig() as r:
        config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {
            "isolation": "hook", "memoryOversubscription": "1.5"}}}]
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("spill", [share("gpu-1", "8Gi", "25")], config))
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        mounts = {m["containerPath"]: m for m in spec_of(r, uid)["devices"][0]["containerEdits"]["mounts"]}
        limits = read_limits(Path(mounts["/run/gpupool/limits"]["hostPath"]))
        assert limits is not None
        assert limits["limit"][0] == 8192 * MIB and limits["oversub"][0] == 4096 * MIB


@pytest.mark.parametrize(("params", "message"), [
    ({"isolation": "mps", "memoryOversubscription": "1.5"}, "hook and remote only (its class gives mps)"),
    ({"isolation": "hook", "memoryOversubscription": "8"}, "a factor from 1 to 4"),
])
async def test_oversubscription_the_driver_cannot_serve_is_refused(params: dict[str, str], message: str) -> None:
    async with dra_rig() as r:
        config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params}}]
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("bad", [share("gpu-1", "8Gi", "25")], config))
        assert message in (await prepare(r, c)).claims[c["metadata"]["uid"]].error


async def test_the_tenants_claim_config_cannot_grant_oversubscription() -> None:
    async with dra_rig() as r:
        config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "hook"}}},
                  {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
                      "memoryOversubscription": "4"}}}]
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("sneaky", [share("gpu-1", "8Gi", "25")], config))
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        mounts = {m["containerPath"]: m for m in spec_of(r, uid)["devices"][0]["containerEdits"]["mounts"]}
        limits = read_limits(Path(mounts["/run/gpupool/limits"]["hostPath"]))
        assert limits is not None and limits["oversub"][0] == 0
