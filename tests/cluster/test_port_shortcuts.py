"""The Node/Pod/Lease shortcuts of the cluster port are written once, on the port, and mean exactly their
generic call in both adapters (the contract test checks the behaviour against a real API server)."""

from __future__ import annotations

import pytest

from gpupool.cluster.kube import KubeCluster
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import NODES, PODS, ClusterPort, Conflict

SHORTCUTS = (
    "list_nodes", "list_pods", "watch_nodes", "watch_pods", "get_node", "get_pod", "create_node", "create_pod",
    "delete_pod", "patch_pod_annotations", "patch_node_annotations", "patch_node_labels", "patch_pod_status",
    "get_lease", "create_lease",
)


@pytest.mark.parametrize("adapter", [KubeCluster, MemoryCluster])
def test_adapters_inherit_the_shortcuts_from_the_port(adapter: type[ClusterPort]) -> None:
    assert ClusterPort in adapter.__mro__  # ClusterPort is a Protocol: issubclass would refuse to answer
    for name in SHORTCUTS:
        assert name not in vars(adapter), f"{adapter.__name__} writes {name} again"
        assert getattr(adapter, name) is getattr(ClusterPort, name)


async def test_the_shortcuts_are_their_generic_calls() -> None:
    c = MemoryCluster()
    node = await c.create_node({"metadata": {"name": "n1", "labels": {"a": "1"}}})
    pod = await c.create_pod({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}})
    assert pod["metadata"]["namespace"] == "default"
    assert await c.get_node("n1") == await c.get_object(NODES, "n1") == node
    assert await c.get_pod("default", "p") == await c.get_object(PODS, "p", "default")
    on_n1 = {"spec.nodeName": "n1"}
    assert await c.list_pods(fields=on_n1) == await c.list_objects(PODS, fields=on_n1)
    assert (await c.list_nodes(labels={"a": "2"}))[0] == []

    rv = pod["metadata"]["resourceVersion"]
    patched = await c.patch_pod_annotations("default", "p", {"k": "v"}, resource_version=rv)
    assert patched["metadata"]["annotations"] == {"k": "v"}
    with pytest.raises(Conflict):  # the precondition reaches the generic patch
        await c.patch_pod_annotations("default", "p", {"k": "w"}, resource_version=rv)
    assert (await c.patch_node_labels("n1", {"a": None, "b": "2"}))["metadata"]["labels"] == {"b": "2"}
    assert (await c.patch_pod_status("default", "p", {"phase": "Running"}))["status"]["phase"] == "Running"

    seen = c.watch_pods("0", fields={"spec.nodeName": "n1"})
    assert (await anext(seen)).object["metadata"]["name"] == "p"
    await c.delete_pod("default", "p", uid=pod["metadata"]["uid"])
    assert (await c.list_pods())[0] == []
    await c.close()
