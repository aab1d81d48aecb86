"""Attacks on the agent's Allocate, each with its outcome: a pod that bypasses the scheduler never gets the
share of the pod the scheduler bound; a repeated call gets the same answer; an Allocate reads the pods of
its own node only, and never the Node object. The real agent behind a stand-in kubelet over unix sockets,
on the embedded cluster."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpupool.agent.state.checkpoint import Checkpoint
from gpupool.api.names import ANN_ALLOCATED
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import PODS, Kind, Obj, Selector
from tests.agent.agent_helpers import NODE, RESOURCE, answering_mps, count_node_calls, pod_object, rig, scheduler_binds

# Pod a is bound by the scheduler with 4096 MiB and 25 % of GPU-aaaa-0 (hook isolation: limits as environment).
A_SHARE = {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-0", "GPUPOOL_MEMORY_LIMIT_MIB": "4096", "GPUPOOL_CORES_PERCENT": "25"}


def share(envs: Mapping[str, str]) -> dict[str, str]:
    return {k: envs[k] for k in A_SHARE}


async def test_a_pod_bound_with_node_name_never_gets_the_scheduled_pods_share() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        # b bypasses the scheduler: bound by spec.nodeName, no allocation, one GPU like a
        await r.cluster.create_pod(pod_object("b", 1, node=NODE))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/b", 1)  # kubelet admits b
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details()
        assert "ambiguous" in details and "default/a" in details and "default/b" in details
        assert "bound without gpupool's scheduler" in details
        # nothing was handed out or written: nobody is marked, nothing checkpointed
        for name in ("a", "b"):
            assert ANN_ALLOCATED not in (await r.cluster.get_pod("default", name))["metadata"]["annotations"]
        checkpoint = Checkpoint(r.config.checkpoint_path, NODE)
        assert checkpoint.load() is None and checkpoint.entries == {}

        # kubelet fails b's admission; a's own call then gets exactly a's share
        r.kubelet.release("default/b")
        await r.cluster.patch_pod_status("default", "b", {"phase": "Failed", "reason": "UnexpectedAdmissionError"})
        resp = await r.kubelet.allocate(RESOURCE, "default/a", 1)
        assert share(resp.envs) == A_SHARE


async def test_a_rogue_pod_of_another_size_is_refused_for_lacking_an_allocation() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        await r.cluster.create_pod(pod_object("b", 2, node=NODE))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate(RESOURCE, "default/b", 2)  # b is the only candidate of 2 devices
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "pod default/b (uid" in err.value.details() and "has no gpupool.io/allocation" in err.value.details()
        for name in ("a", "b"):
            assert ANN_ALLOCATED not in (await r.cluster.get_pod("default", name))["metadata"]["annotations"]
        # a's own call (1 device: b cannot be its subject) still gets exactly a's share
        assert share((await r.kubelet.allocate(RESOURCE, "default/a", 1)).envs) == A_SHARE


async def test_a_repeated_allocate_gets_the_same_answer_even_from_a_restarted_agent(tmp_path: Path) -> None:
    async with rig(mps=answering_mps(tmp_path, ["GPU-aaaa-0"])) as r:  # MPS shares need the GPU's daemon
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)], isolation="mps")
        first = await r.kubelet.allocate(RESOURCE, "default/a", 1)
        ids = r.kubelet.assigned["default/a"]
        marker_before = (await r.cluster.get_pod("default", "a"))["metadata"]["annotations"][ANN_ALLOCATED]
        assert json.loads(marker_before)["devices"] == ids

        again = await r.kubelet.allocate_ids(RESOURCE, ids)  # kubelet restarted before writing its checkpoint
        assert again == first  # the whole answer: environment, the MPS pipe mount, annotations, CDI devices
        await r.cluster.patch_pod_status("default", "a", {"phase": "Running"})
        await r.restart_agent()
        await r.kubelet.wait_for(lambda k: len(k.registrations) == 2 and len(k.healthy(RESOURCE)) == 16)
        calls = count_node_calls(r)
        assert await r.kubelet.allocate_ids(RESOURCE, ids) == first
        # one marker, written once; the repeat neither read nor wrote the Node
        after = await r.cluster.get_pod("default", "a")
        assert after["metadata"]["annotations"][ANN_ALLOCATED] == marker_before
        assert (calls.node_reads, calls.node_writes) == (0, 0)


async def test_other_device_ids_are_no_repeat() -> None:
    async with rig() as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        await r.kubelet.allocate(RESOURCE, "default/a", 1)
        free = sorted(set(r.kubelet.healthy(RESOURCE)) - set(r.kubelet.assigned["default/a"]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, free[:1])
        assert "no pod bound to node gpu-node-1 waits for an Allocate of 1 device(s)" in err.value.details()


class RecordingCluster(MemoryCluster):
    """Records every list and watch the agent asks of the cluster, with its selectors."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, dict[str, str]]] = []

    async def list_objects(
        self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> tuple[list[Obj], str]:
        self.asked.append((kind.kind, dict(fields or {})))
        return await super().list_objects(kind, namespace=namespace, labels=labels, fields=fields)

    def watch_objects(self, kind: Kind, resource_version: str, **selectors: Any):  # type: ignore[no-untyped-def]
        self.asked.append((f"watch {kind.kind}", dict(selectors.get("fields") or {})))
        return super().watch_objects(kind, resource_version, **selectors)


async def test_allocate_reads_the_pods_of_its_own_node_only() -> None:
    cluster = RecordingCluster()
    for other in ("other-node-1", "other-node-2"):  # pods elsewhere, which the agent has no business reading
        await cluster.create_pod(pod_object(f"p-{other}", 1, node=other))
    async with rig(cluster=cluster) as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        cluster.asked.clear()
        calls = count_node_calls(r)
        resp = await r.kubelet.allocate(RESOURCE, "default/a", 1)  # GetPreferredAllocation, then Allocate
        assert share(resp.envs) == A_SHARE
        pod_reads = [fields for kind, fields in cluster.asked if kind.endswith(PODS.kind)]
        assert pod_reads and all(fields == {"spec.nodeName": NODE} for fields in pod_reads)
        assert (calls.node_reads, calls.node_writes) == (0, 0)  # nor the Node object

    # the embedded API server applies the selector as the real one does
    pods, _ = await cluster.list_pods(fields={"spec.nodeName": NODE})
    assert {p["metadata"]["name"] for p in pods} == {"a"}
