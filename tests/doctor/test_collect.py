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


def _daemonset(env: dict[str, str], release: str = "gpupool") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": f"{release}-agent", "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "gpupool", "app.kubernetes.io/instance": release,
                                    "app.kubernetes.io/component": "agent"}},
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


async def _findings_with_releases(*releases: str, option: str = "") -> list[tuple[str, str, Status, str]]:
    cluster = MemoryCluster()
    await cluster.create_object(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for release in releases:
        await cluster.create_object(DAEMONSETS, _daemonset({}, release))
    await cluster.create_node(_node("a", "20"))
    findings = await Doctor(cluster, Options(namespace=NS, release=option), clock=lambda: 0.0).run()
    return [(f.area, f.subject, f.status, f.detail) for f in findings]


def test_the_release_is_found_in_the_namespace_when_not_named() -> None:
    """The trial installs release `gp`: the doctor's defaults check it without --release (it expected
    `gpupool` before, and failed every section of a healthy release)."""
    found = asyncio.run(_findings_with_releases("gp"))
    assert found[0] == ("api", "release gp", Status.INFO, f"the only release of the chart in {NS}: checking it")
    nodes = [f for f in found if f[:2] == ("agent", "node a")]
    assert nodes == [("agent", "node a", Status.OK, "2 GPU(s), 20 slots allocatable, driver 570")]
    # Named, it is taken as given: a release that is not there fails its sections (not the lookup).
    named = asyncio.run(_findings_with_releases("gp", option="other"))
    assert not any(f[1].startswith("release ") for f in named)
    assert ("agent", "DaemonSet (agent)", Status.FAIL, "the release has no agent DaemonSet") in named


def test_no_release_or_several_is_one_line_that_says_what_to_do() -> None:
    none = asyncio.run(_findings_with_releases())
    assert none == [("api", f"release in {NS}", Status.FAIL, f"no release of the gpupool chart in namespace {NS}")]
    several = asyncio.run(_findings_with_releases("gp", "blue"))
    assert several == [("api", f"release in {NS}", Status.FAIL, "several releases of the chart: blue, gp")]
