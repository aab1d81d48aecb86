"""One node served by the device plugin and the DRA driver at once (`dra` with `device_plugin_with_dra`), driven
the way kubelet drives each: the stand-in kubelet registers the device plugin and calls Allocate over its
socket; kubelet's plugin watcher half registers the DRA driver and calls NodePrepareResources over the
socket the driver names. Both forms serve shares of the same GPUs, and what one form withholds (validation)
or holds (MIG instances, hook directories) the other does too.

Expected answers are written from the allocation and the claim, and the documented contract
(docs/agent.md, docs/claims.md), not from the agent's code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpupool.agent.config import ConfigError, load_config
from gpupool.agent.dra.cdi import cdi_path
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.state.hookdir import hook_paths, read_limits
from gpupool.api.dra import TAINT_NOT_READY
from gpupool.api.names import ANN_ALLOCATED
from gpupool.cluster.port import RESOURCE_CLAIMS, RESOURCE_SLICES
from gpupool.core.mig import PlacedInstance
from tests.agent.agent_helpers import RESOURCE, Rig, four_gpus, pod_object, rig, scheduler_binds
from tests.agent.dra.test_agent_dra import MIG_CLASS, _eventually_async, _partition, _register, claim, ref, share
from tests.agent.test_agent_mig_wiring import GPU as MIG_GPU
from tests.agent.test_agent_mig_wiring import MigNode, bind_mig_pod, fake_uuid
from tests.agent.test_agent_validation_service import _revalidated

MIB = 1 << 20
SLOTS = 16  # four GPUs, split 4 (agent_helpers)


@asynccontextmanager
async def both_rig(mig: MigNode | None = None, **overrides: Any) -> AsyncIterator[Rig]:
    """The agent on four A100-80GB GPUs as device plugin and DRA driver; with `mig`, GPU 0 is in MIG mode
    (the fake MIG driver of `mig`, which outlives agent restarts as the hardware does)."""
    gpus = four_gpus()
    if mig is not None:
        gpus = replace(gpus, devices=(replace(gpus.devices[0], mig_enabled=True), *gpus.devices[1:]))
    async with rig(gpus, mig=None if mig is None else mig.manager, dra=True, device_plugin_with_dra=True,
                   dra_resync_s=0.05, **overrides) as r:
        yield r


async def prepare(r: Rig, c: dict[str, Any]) -> v1.NodePrepareResourceResponse:
    """kubelet's DRA half: find the driver through its registration socket, then prepare `c` on it."""
    info = await _register(r.config.kubelet_root)
    async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
        reply = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[ref(c)]), timeout=10)
    answer: v1.NodePrepareResourceResponse = reply.claims[c["metadata"]["uid"]]
    return answer


async def slice_taints(r: Rig) -> dict[str, list[str]]:
    slices, _ = await r.cluster.list_objects(RESOURCE_SLICES)
    return {d["name"]: [t["key"] for t in d.get("taints", [])] for s in slices for d in s["spec"]["devices"]}


def claim_env(r: Rig, uid: str) -> dict[str, str]:
    spec = json.loads(cdi_path(r.config.cdi_dir, uid).read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def claim_limits_path(r: Rig, uid: str) -> Path:
    spec = json.loads(cdi_path(r.config.cdi_dir, uid).read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]}
    return Path(mounts["/run/gpupool/limits"])


def test_device_plugin_with_dra_needs_dra(tmp_path: Path) -> None:
    base = {"node_name": "n", "backend": "fake", "fake_file": tmp_path / "gpus.yaml"}
    with pytest.raises(ConfigError, match="device_plugin_with_dra serves the device plugin beside the DRA driver"):
        load_config(None, {**base, "device_plugin_with_dra": True}, {})
    config = load_config(None, base, {"GPUPOOL_AGENT_DRA": "true", "GPUPOOL_AGENT_DEVICE_PLUGIN_WITH_DRA": "true"})
    assert (config.dra, config.device_plugin_with_dra) == (True, True)


def test_the_flag_without_dra_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpupool.cli import main

    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "fake", "--fake-file",
                                       str(Path(__file__).parents[1] / "fixtures_two_gpus.yaml"),
                                       "--device-plugin-with-dra", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "device_plugin_with_dra" in result.output and "it needs dra" in result.output
    assert "Traceback" not in result.output


async def test_both_sockets_are_registered_and_both_offer_every_gpu() -> None:
    async with both_rig() as r:
        assert r.kubelet.registrations == [(RESOURCE, "gpupool.sock")]
        assert len(r.kubelet.healthy(RESOURCE)) == SLOTS
        info = await _register(r.config.kubelet_root)
        assert (info.type, Path(info.endpoint).is_socket()) == ("DRAPlugin", True)

        async def published() -> bool:
            return sorted(await slice_taints(r)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]

        await _eventually_async(published)


async def test_an_allocate_and_a_prepare_on_one_gpu_are_both_served_each_with_its_own_share(tmp_path: Path) -> None:
    hook_paths(tmp_path / "hook").pods.mkdir(parents=True)  # what `gpupool agent` installs at start
    async with both_rig(hook_root=tmp_path / "hook") as r:
        # the device plugin: 8 GiB and 30 % of GPU 2 for a pod the scheduler bound
        await scheduler_binds(r.cluster, pod_object("dp", 1), [("GPU-aaaa-2", 2, 8192, 30.0)])
        resp = await r.kubelet.allocate(RESOURCE, "default/dp", 1)
        assert {k: resp.envs[k] for k in ("NVIDIA_VISIBLE_DEVICES", "GPUPOOL_MEMORY_LIMIT_MIB",
                                          "GPUPOOL_CORES_PERCENT", "GPUPOOL_ISOLATION")} == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-2", "GPUPOOL_MEMORY_LIMIT_MIB": "8192",
            "GPUPOOL_CORES_PERCENT": "30", "GPUPOOL_ISOLATION": "hook"}
        pod = await r.cluster.get_pod("default", "dp")
        assert ANN_ALLOCATED in pod["metadata"]["annotations"]
        # the DRA driver: 16 GiB and 50 % of the same GPU for a claim
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("dra", [share("gpu-2", "16Gi", "50")]))
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).error == ""
        env = claim_env(r, uid)
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == (
            "GPU-aaaa-2", "16384", "50")
        # each reads its own limits file: the pod's cap is 8 GiB, the claim's 16 GiB
        pod_mounts = {m.container_path: m.host_path for m in resp.mounts}
        pod_limits = read_limits(Path(pod_mounts["/run/gpupool/limits"]))
        claim_limits = read_limits(claim_limits_path(r, uid))
        assert pod_limits is not None and claim_limits is not None
        assert (pod_limits["limit"][0], claim_limits["limit"][0]) == (8192 * MIB, 16384 * MIB)
        # housekeeping keeps what both forms hold (the pod is on the node, the claim prepared)
        assert r.agent.service is not None
        await r.agent.service.housekeeping()
        assert Path(pod_mounts["/run/gpupool/limits"]).exists() and claim_limits_path(r, uid).exists()


async def test_a_failed_validation_withdraws_both_forms_and_the_fix_gives_both_back() -> None:
    async with both_rig(validation_retry_s=3600, validation_interval_s=3600) as r:  # passes: revalidate() only
        r.backend.fail_validation("toolkit", "toolkit broke")
        await _revalidated(r)
        await r.kubelet.wait_for(lambda k: not k.healthy(RESOURCE))

        async def all_tainted() -> bool:
            return set(map(tuple, (await slice_taints(r)).values())) == {(TAINT_NOT_READY,)}

        await _eventually_async(all_tainted)
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("late", [share("gpu-0", "1Gi", "10")]))
        assert "holds its GPUs back" in (await prepare(r, c)).error
        await scheduler_binds(r.cluster, pod_object("late", 1), [("GPU-aaaa-0", 0, 1024, 10.0)])
        with pytest.raises(grpc.aio.AioRpcError):
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        r.backend.fix_validation("toolkit")
        await _revalidated(r)
        await r.kubelet.wait_for(lambda k: len(k.healthy(RESOURCE)) == SLOTS)

        async def untainted() -> bool:
            return set(map(tuple, (await slice_taints(r)).values())) == {()}

        await _eventually_async(untainted)
        assert (await prepare(r, c)).error == ""


async def test_a_restarted_agent_registers_both_again_and_repeats_both_answers() -> None:
    async with both_rig() as r:
        await scheduler_binds(r.cluster, pod_object("dp", 1), [("GPU-aaaa-1", 1, 4096, 20.0)])
        first_allocate = await r.kubelet.allocate(RESOURCE, "default/dp", 1)
        ids = r.kubelet.assigned["default/dp"]
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("dra", [share("gpu-1", "4Gi", "20")]))
        first_prepare = await prepare(r, c)
        assert first_prepare.error == ""
        await r.restart_agent()
        await r.kubelet.wait_for(lambda k: len(k.registrations) == 2 and len(k.healthy(RESOURCE)) == SLOTS)
        # kubelet asking again after the restart (before it recorded the answers) gets the same ones
        assert await r.kubelet.allocate_ids(RESOURCE, ids) == first_allocate
        assert await prepare(r, c) == first_prepare


async def test_mig_instances_of_pods_and_of_claims_are_both_held_by_housekeeping_and_restarts(tmp_path: Path) -> None:
    """A device-plugin pod's instance (3g.40gb at 4) and a claim's partition (3g.40gb at 0) on one MIG GPU:
    housekeeping long after their instances were carved destroys neither, and the restarted agent's
    reconciliation keeps both with their holders."""
    node = MigNode(tmp_path)
    async with both_rig(mig=node) as r:
        await bind_mig_pod(r.cluster, "m", "3g.40gb", 4)
        resp = await r.kubelet.allocate_ids(RESOURCE, [f"{MIG_GPU}::0"])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == fake_uuid(node, 4)
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("infer", [_partition("gpu-0-3g40gb-0")], MIG_CLASS))
        assert (await prepare(r, c)).error == ""
        both = [PlacedInstance("3g.40gb", 0), PlacedInstance("3g.40gb", 4)]
        assert sorted(node.driver.layout(MIG_GPU), key=lambda p: p.start) == both
        node.clock.now += 10 * 600  # far past the idle time: only a holder keeps an instance now
        assert r.agent.service is not None
        await r.agent.service.housekeeping()
        assert sorted(node.driver.layout(MIG_GPU), key=lambda p: p.start) == both
        await r.restart_agent()
        assert r.agent.mig is not None and r.agent.service is not None
        await r.agent.service.housekeeping()
        assert sorted(node.driver.layout(MIG_GPU), key=lambda p: p.start) == both
        pod = await r.cluster.get_pod("default", "m")
        holders = {e.start: e.pod for e in r.agent.mig.entries}
        assert holders == {0: c["metadata"]["uid"], 4: pod["metadata"]["uid"]}


async def test_a_claim_kube_scheduler_placed_over_a_device_plugin_pod_is_not_prepared_until_it_fits() -> None:
    """kube-scheduler's own allocator weighs a claim against other claims only (the slice offers the whole
    GPU), so on a node serving both forms it can place one where a device-plugin pod already holds the room.
    The node refuses to over-commit the GPU: GPU 2 (80 GiB) holds a pod's 60 GiB and 30 %; a claim of 24 GiB
    (84 GiB together) is refused with the reason and no CDI spec, as is one whose compute would make 110 %;
    16 GiB and 50 % fits; another GPU is untouched; once the pod is gone, kubelet's retry prepares the first."""
    async with both_rig() as r:
        await scheduler_binds(r.cluster, pod_object("dp", 1), [("GPU-aaaa-2", 2, 61440, 30.0)])
        over = await r.cluster.create_object(RESOURCE_CLAIMS, claim("over", [share("gpu-2", "24Gi", "20")]))
        fits = await r.cluster.create_object(RESOURCE_CLAIMS, claim("fits", [share("gpu-2", "16Gi", "50")]))
        busy = await r.cluster.create_object(RESOURCE_CLAIMS, claim("busy", [share("gpu-2", "1Gi", "30")]))
        other = await r.cluster.create_object(RESOURCE_CLAIMS, claim("other", [share("gpu-3", "70Gi", "90")]))
        refused = (await prepare(r, over)).error
        assert refused == ("claim team-a/over: GPU 2 of gpu-node-1 has too little free compute or memory beside what "
                           "this node's pods and prepared claims hold (a GPU is never over-committed; the claim "
                           "waits until they free it)"), refused
        assert not cdi_path(r.config.cdi_dir, over["metadata"]["uid"]).exists()
        assert (await prepare(r, fits)).error == ""  # 76 GiB and 80 % with the pod
        assert "too little free compute or memory" in (await prepare(r, busy)).error  # 110 % of compute
        assert (await prepare(r, other)).error == ""
        await r.cluster.delete_pod("default", "dp")
        assert (await prepare(r, over)).error == ""  # 40 GiB and 70 % with the claim prepared before
        assert cdi_path(r.config.cdi_dir, over["metadata"]["uid"]).exists()
