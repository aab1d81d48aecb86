"""The real agent driven by a stand-in kubelet over unix sockets: registration, device list updates,
Allocate identity and limits, bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from gpupool.agent.identify import ANN_ALLOCATED
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.agent.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import (
    NODE,
    RESOURCE,
    Rig,
    answering_mps,
    count_node_calls,
    eventually,
    pod_object,
    rig,
    scheduler_binds,
)
from tests.harness.kubelet import StandInKubelet


def slots_of(kubelet: StandInKubelet, uuid: str) -> dict[str, str]:
    return {d: h for d, h in kubelet.plugins[RESOURCE].devices.items() if d.startswith(uuid + "::")}


async def test_registration_and_options() -> None:
    async with rig() as r:
        assert r.kubelet.registrations == [(RESOURCE, "gpupool.sock")]
        options = r.kubelet.plugins[RESOURCE].options
        assert options.get_preferred_allocation_available is True
        assert options.pre_start_required is False
        devices = r.kubelet.plugins[RESOURCE].devices
        # 4 GPUs x split 4 = 16 slots, all healthy, named <uuid>::<n>
        assert len(devices) == 16
        assert set(devices.values()) == {"Healthy"}
        assert "GPU-aaaa-3::3" in devices


async def test_list_and_watch_reports_numa_topology() -> None:
    async with rig() as r:
        async with grpc.aio.insecure_channel(f"unix://{r.config.plugin_socket_path}") as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            first = await stream.read()
            stream.cancel()
        numa = {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices}
        assert numa["GPU-aaaa-0::0"] == [0]
        assert numa["GPU-aaaa-3::1"] == [1]


async def test_xid_marks_only_that_gpu_and_it_recovers_after_probe() -> None:
    async with rig() as r:
        k = r.kubelet
        r.backend.inject_xid("GPU-aaaa-1", 79)  # fell off the bus
        await k.wait_for(lambda k: set(slots_of(k, "GPU-aaaa-1").values()) == {"Unhealthy"})
        assert len(k.healthy(RESOURCE)) == 12  # the other three GPUs keep their 12 slots
        # still broken: re-probes fail, so it stays unhealthy over several probe intervals
        updates = k.plugins[RESOURCE].updates
        calls = r.backend.discover_calls
        await eventually(lambda: r.backend.discover_calls >= calls + 2)
        assert set(slots_of(k, "GPU-aaaa-1").values()) == {"Unhealthy"}
        assert k.plugins[RESOURCE].updates == updates
        r.backend.heal("GPU-aaaa-1")
        await k.wait_for(lambda k: len(k.healthy(RESOURCE)) == 16)


async def test_application_xids_are_ignored() -> None:
    async with rig() as r:
        for xid in (13, 31, 43, 45, 68, 109):
            r.backend.inject_xid("GPU-aaaa-0", xid, breaks=False)
        r.backend.inject_xid("GPU-aaaa-2", 48, breaks=True)  # double-bit ECC: a real fault, sent last
        await r.kubelet.wait_for(lambda k: set(slots_of(k, "GPU-aaaa-2").values()) == {"Unhealthy"})
        assert set(slots_of(r.kubelet, "GPU-aaaa-0").values()) == {"Healthy"}


async def test_unattributed_event_reprobes_and_marks_only_failing_gpu() -> None:
    async with rig() as r:
        r.backend.remove("GPU-aaaa-3")  # vanished silently
        r.backend.inject_xid(None, 79, breaks=False)  # an event NVML could not tie to a device
        await r.kubelet.wait_for(lambda k: set(slots_of(k, "GPU-aaaa-3").values()) == {"Unhealthy"})
        assert len(r.kubelet.healthy(RESOURCE)) == 12


async def test_vanished_gpu_turns_unhealthy_and_inventory_says_so() -> None:
    async with rig() as r:
        r.backend.remove("GPU-aaaa-0")
        await r.kubelet.wait_for(lambda k: set(slots_of(k, "GPU-aaaa-0").values()) == {"Unhealthy"})

        async def inventory_healthy() -> dict[str, bool]:
            node = await r.cluster.get_node(NODE)
            doc = json.loads(node["metadata"]["annotations"]["gpupool.io/inventory"])
            return {g["uuid"]: g["healthy"] for g in doc["gpus"]}

        for _ in range(500):  # the inventory loop publishes within a few intervals; this only bounds the wait
            if (await inventory_healthy())["GPU-aaaa-0"] is False:
                break
            await asyncio.sleep(0.02)
        assert await inventory_healthy() == {
            "GPU-aaaa-0": False,
            "GPU-aaaa-1": True,
            "GPU-aaaa-2": True,
            "GPU-aaaa-3": True,
        }


async def test_allocate_unknown_device_ids_is_invalid_argument() -> None:
    async with rig() as r:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-nope::0"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device IDs ['GPU-nope::0']" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::4"])  # split is 4: slots 0..3 only
        assert "unknown device IDs ['GPU-aaaa-0::4']" in err.value.details()
        # the plugin keeps serving
        await scheduler_binds(r.cluster, pod_object("ok", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        resp = await r.kubelet.allocate(RESOURCE, "default/ok", 1)
        assert resp.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "4096"


async def test_allocate_with_no_waiting_pod_fails_and_never_guesses() -> None:
    async with rig() as r:
        # created but never bound: kubelet cannot be admitting it here, and the agent does not list it
        await r.cluster.create_pod(pod_object("unbound", 1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/ghost", 1)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details()
        assert "no pod bound to node gpu-node-1 waits for an Allocate of 1 device(s)" in details
        assert "not guessing" in details and "unbound" not in details


async def test_allocate_count_mismatch_is_refused() -> None:
    async with rig() as r:
        await scheduler_binds(
            r.cluster, pod_object("two", 2), [("GPU-aaaa-0", 0, 81920, 100.0), ("GPU-aaaa-1", 1, 81920, 100.0)]
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/other", 1)
        details = err.value.details()
        assert "no pod bound to node gpu-node-1 waits for an Allocate of 1 device(s)" in details
        assert "pods waiting here for other counts: default/two asks for 2" in details
        # nothing was written: the right call still gets the pod's grant
        resp = await r.kubelet.allocate(RESOURCE, "default/two", 2)
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-0,GPU-aaaa-1"


async def test_two_waiting_pods_of_different_sizes_each_get_their_own_grant() -> None:
    async with rig() as r:
        # bound back to back (the second past the scheduler's hold on the first): kubelet's call sizes differ
        await scheduler_binds(r.cluster, pod_object("one", 1), [("GPU-aaaa-3", 3, 4096, 25.0)])
        await scheduler_binds(
            r.cluster, pod_object("pair", 2), [("GPU-aaaa-1", 1, 81920, 100.0), ("GPU-aaaa-2", 2, 81920, 100.0)]
        )
        pair = await r.kubelet.allocate(RESOURCE, "default/pair", 2)
        one = await r.kubelet.allocate(RESOURCE, "default/one", 1)
        assert (pair.envs["NVIDIA_VISIBLE_DEVICES"], pair.envs["GPUPOOL_MEMORY_LIMIT_MIB"]) == (
            "GPU-aaaa-1,GPU-aaaa-2", "81920,81920"
        )
        assert (one.envs["NVIDIA_VISIBLE_DEVICES"], one.envs["GPUPOOL_MEMORY_LIMIT_MIB"]) == ("GPU-aaaa-3", "4096")
        for name in ("one", "pair"):
            marker = json.loads((await r.cluster.get_pod("default", name))["metadata"]["annotations"][ANN_ALLOCATED])
            assert marker["devices"] == r.kubelet.assigned[f"default/{name}"]


async def test_two_waiting_pods_of_the_same_size_are_refused_as_ambiguous() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("late", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        await scheduler_binds(r.cluster, pod_object("next", 1), [("GPU-aaaa-1", 1, 8192, 50.0)])
        for key in ("default/late", "default/next"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await r.kubelet.allocate(RESOURCE, key, 1)
            details = err.value.details()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "ambiguous: default/late, default/next could each be the pod" in details
        for name in ("late", "next"):
            assert ANN_ALLOCATED not in (await r.cluster.get_pod("default", name))["metadata"]["annotations"]
        # kubelet fails late's admission: next is then the only candidate and gets its own grant
        await r.cluster.patch_pod_status("default", "late", {"phase": "Failed"})
        resp = await r.kubelet.allocate(RESOURCE, "default/next", 1)
        assert (resp.envs["NVIDIA_VISIBLE_DEVICES"], resp.envs["GPUPOOL_MEMORY_LIMIT_MIB"]) == ("GPU-aaaa-1", "8192")


async def preferred_ids(r: Rig, size: int) -> list[str]:
    """GetPreferredAllocation for one container of `size` devices, every healthy slot available."""
    available = sorted(r.kubelet.healthy(RESOURCE))
    async with grpc.aio.insecure_channel(f"unix://{r.config.plugin_socket_path}") as channel:
        reply = await pb_grpc.DevicePluginStub(channel).GetPreferredAllocation(
            pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
            ])
        )
    return list(reply.container_responses[0].deviceIDs)


async def test_preferred_allocation_follows_the_only_waiting_pod_of_that_size() -> None:
    async with rig() as r:
        # nothing waits: no preference, kubelet's own order (the first free slot)
        assert await preferred_ids(r, 1) == ["GPU-aaaa-0::0"]
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-3", 3, 4096, 25.0)])
        await scheduler_binds(
            r.cluster, pod_object("b", 2), [("GPU-aaaa-1", 1, 81920, 100.0), ("GPU-aaaa-2", 2, 81920, 100.0)]
        )
        assert await preferred_ids(r, 1) == ["GPU-aaaa-3::0"]  # a's GPU
        assert await preferred_ids(r, 2) == ["GPU-aaaa-1::0", "GPU-aaaa-2::0"]  # one slot on each of b's GPUs
        # a second pod of size 1 waits too: the call could be for either, so no preference (and no failure)
        await scheduler_binds(r.cluster, pod_object("c", 1), [("GPU-aaaa-2", 2, 4096, 25.0)])
        assert await preferred_ids(r, 1) == ["GPU-aaaa-0::0"]
        assert await preferred_ids(r, 2) == ["GPU-aaaa-1::0", "GPU-aaaa-2::0"]


async def test_allocate_records_marker_never_touches_the_node_and_prefers_granted_gpu(tmp_path: Path) -> None:
    async with rig(mps=answering_mps(tmp_path, ["GPU-aaaa-3"])) as r:
        pod = await scheduler_binds(r.cluster, pod_object("p", 1), [("GPU-aaaa-3", 3, 20000, 50.0)], isolation="mps")
        calls = count_node_calls(r)
        resp = await r.kubelet.allocate(RESOURCE, "default/p", 1)  # GetPreferredAllocation, then Allocate
        assert r.kubelet.assigned["default/p"][0].startswith("GPU-aaaa-3::")
        assert resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
        assert [(m.container_path, m.host_path) for m in resp.mounts] == [
            ("/run/gpupool/mps", "/run/gpupool/mps/GPU-aaaa-3")
        ]
        # identification needs the pods only: the Node object is neither read nor written
        assert (calls.node_reads, calls.node_writes) == (0, 0)
        node = await r.cluster.get_node(NODE)
        assert node["metadata"]["annotations"]["keep/me"] == "yes"
        after = await r.cluster.get_pod("default", "p")
        marker = json.loads(after["metadata"]["annotations"][ANN_ALLOCATED])
        assert marker["node"] == NODE and marker["devices"] == r.kubelet.assigned["default/p"]
        assert pod["metadata"]["uid"] == after["metadata"]["uid"]
        # a second Allocate of other devices, with the pod already served, finds no waiting pod and is refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/p-again", 1)
        assert "no pod bound to node gpu-node-1 waits" in err.value.details()
        assert (calls.node_reads, calls.node_writes) == (0, 0)


async def test_cdi_mode_returns_cdi_devices() -> None:
    async with rig(cdi=True, cdi_kind="nvidia.com/gpu") as r:
        await scheduler_binds(r.cluster, pod_object("c", 1), [("GPU-aaaa-1", 1, 1024, 10.0)])
        resp = await r.kubelet.allocate(RESOURCE, "default/c", 1)
        assert [d.name for d in resp.cdi_devices] == ["nvidia.com/gpu=GPU-aaaa-1"]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_allocate_to_unhealthy_gpu_is_refused() -> None:
    async with rig() as r:
        r.backend.inject_xid("GPU-aaaa-2", 79)
        await r.kubelet.wait_for(lambda k: len(k.healthy(RESOURCE)) == 12)
        await scheduler_binds(r.cluster, pod_object("late", 1), [("GPU-aaaa-2", 2, 1024, 10.0)])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/late", 1)
        assert "GPU-aaaa-2, which is unhealthy (Xid 79)" in err.value.details()


class RacingCluster(ClusterPortAgent):
    """Runs `before` once, right before the agent's first pod annotation write (a concurrent update)."""

    def __init__(self, port: MemoryCluster, before: Callable[[], Awaitable[None]]) -> None:
        super().__init__(port)
        self.before: Callable[[], Awaitable[None]] | None = before

    async def patch_pod_annotations(self, namespace, name, annotations, resource_version=None):  # type: ignore[no-untyped-def]
        if self.before is not None:
            before, self.before = self.before, None
            await before()
        return await super().patch_pod_annotations(namespace, name, annotations, resource_version)


async def test_marker_write_survives_a_concurrent_status_update() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("busy", 1), [("GPU-aaaa-0", 0, 2048, 20.0)])
        assert r.agent.service is not None
        r.agent.service.cluster = RacingCluster(
            r.cluster, lambda: r.cluster.patch_pod_status("default", "busy", {"conditions": [{"type": "X"}]})
        )
        resp = await r.kubelet.allocate(RESOURCE, "default/busy", 1)
        assert resp.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "2048"
        assert ANN_ALLOCATED in (await r.cluster.get_pod("default", "busy"))["metadata"]["annotations"]


async def test_a_pod_replaced_under_the_same_name_is_never_marked() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("twin", 1), [("GPU-aaaa-0", 0, 2048, 20.0)])

        async def replace() -> None:
            await r.cluster.delete_pod("default", "twin")
            await r.cluster.create_pod(pod_object("twin", 1))

        assert r.agent.service is not None
        r.agent.service.cluster = RacingCluster(r.cluster, replace)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/twin", 1)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the pod was replaced by another with uid" in err.value.details()
        assert ANN_ALLOCATED not in (await r.cluster.get_pod("default", "twin"))["metadata"]["annotations"]
