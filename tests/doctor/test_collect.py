"""The doctor's node section read through the cluster port: which way the DaemonSet says its agents serve
GPUs decides what each GPU node must show (slots at the kubelet, devices in its ResourceSlice, or both)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.api.dra import DRIVER
from gpupool.api.inventory import encode_inventory
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import NAMESPACES, RESOURCE_SLICES
from gpupool.core.model import GPU
from gpupool.doctor.checks import Status
from gpupool.doctor.collect import DAEMONSETS, Doctor, Options

NS = "gpupool-system"


def _node(name: str, slots: str | None) -> dict[str, Any]:
    gpus = [GPU(uuid=f"GPU-{name}-{i}", index=i, model="L4", memory_mib=23034) for i in range(2)]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"gpupool.io/gpu-node": "true"},
                         "annotations": {"gpupool.io/inventory": encode_inventory(name, gpus, split=10, driver="570")}},
            "status": {"allocatable": {} if slots is None else {"gpupool.io/gpu": slots}}}


def _daemonset(env: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "gpupool-agent", "namespace": NS,
                         "labels": {"app.kubernetes.io/instance": "gpupool", "app.kubernetes.io/component": "agent"}},
            "spec": {"template": {"spec": {"nodeSelector": {"gpupool.io/gpu-node": "true"}, "containers": [
                {"name": "agent", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}}}


def _slice(node: str, devices: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}"} for i in range(devices)]}}


async def _node_findings(env: dict[str, str], nodes: list[dict[str, Any]],
                         slices: list[dict[str, Any]]) -> dict[str, tuple[Status, str]]:
    cluster = MemoryCluster()
    await cluster.create_object(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await cluster.create_object(DAEMONSETS, _daemonset(env))
    for n in nodes:
        await cluster.create_node(n)
    for s in slices:
        await cluster.create_object(RESOURCE_SLICES, s)
    findings = await Doctor(cluster, Options(namespace=NS), clock=lambda: 0.0).run()
    return {f.subject: (f.status, f.detail) for f in findings if f.area == "agent" and f.subject.startswith("node ")}


def test_dra_only_nodes_are_checked_by_their_slices() -> None:
    got = asyncio.run(_node_findings({"GPUPOOL_AGENT_DRA": "true"}, [_node("a", None), _node("b", None)],
                                     [_slice("a", 2)]))
    assert got["node a"] == (Status.OK, "2 GPU(s), 2 device(s) in its ResourceSlice, driver 570")
    assert got["node b"][0] is Status.FAIL and "no ResourceSlice of driver gpu.gpupool.io" in got["node b"][1]


def test_nodes_serving_both_need_slots_and_a_slice_and_device_plugin_nodes_only_slots() -> None:
    both = {"GPUPOOL_AGENT_DRA": "true", "GPUPOOL_AGENT_DEVICE_PLUGIN_WITH_DRA": "true"}
    got = asyncio.run(_node_findings(both, [_node("a", "20"), _node("b", None)], [_slice("a", 2), _slice("b", 2)]))
    assert got["node a"] == (Status.OK, "2 GPU(s), 20 slots allocatable, 2 device(s) in its ResourceSlice, driver 570")
    assert got["node b"][0] is Status.FAIL and "allocatable gpupool.io/gpu is 0" in got["node b"][1]
    plugin = asyncio.run(_node_findings({}, [_node("a", "20")], []))
    assert plugin["node a"] == (Status.OK, "2 GPU(s), 20 slots allocatable, driver 570")
