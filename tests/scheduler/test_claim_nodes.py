"""Filter `claim_nodes` through the claim allocator on the in-memory cluster: the answer "may this pod run
on the node" that it keeps per pod shape and node version follows the node's labels and taints as they
change (a node relabelled to match the pod's nodeSelector takes it; once tainted, no longer)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from gpupool.cluster.port import NODES
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.plugins.claim_nodes import NOT_HERE, Args, ClaimNodes
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.test_claim_allocator import allocation, claim, gated_pod, messages, run, setup, ungated, until


async def test_a_node_relabelled_then_tainted_changes_where_the_claim_may_go() -> None:
    """Without the node's version in the remembered answer, p1 would wait for ever (the answer before the
    label) and p2 would go to the tainted node (the answer before the taint)."""
    cluster, svc = await setup()
    claims = svc.claims
    assert claims is not None
    claims.ready = lambda: False  # the test runs each pass itself

    async def node_shows(check: str) -> bool:
        obj = svc.ledger.node_objs["gpu-0001"]
        return (check == "label" and (obj["metadata"].get("labels") or {}).get("zone") == "b") or \
            (check == "taint" and bool((obj.get("spec") or {}).get("taints")))

    try:
        await run(cluster, (claim("c1", "1Gi", "10"), gated_pod("p1", "c1", {"zone": "b"})))
        await until(lambda: _known(svc, "p1"))
        await claims.pass_once()
        assert not await ungated(cluster, "p1")
        (message,) = await messages(cluster, "p1")
        assert message == f"gpupool: claim team-dra/c1: fits no node, e.g. {NOT_HERE}"

        await cluster.patch_node_labels("gpu-0001", {"zone": "b"})
        await until(lambda: node_shows("label"))
        await claims.pass_once()
        assert await ungated(cluster, "p1")
        got = await allocation(cluster, "c1")
        assert got is not None and got["devices"]["results"][0]["pool"] == "gpu-0001"

        await cluster.patch_object(NODES, "gpu-0001", {"spec": {"taints": [
            {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]}})
        await until(lambda: node_shows("taint"))
        await run(cluster, (claim("c2", "1Gi", "10"), gated_pod("p2", "c2", {"zone": "b"})))
        await until(lambda: _known(svc, "p2"))
        await claims.pass_once()
        assert not await ungated(cluster, "p2")
        assert await allocation(cluster, "c2") is None
    finally:
        await svc.stop()


async def _known(svc: ExtenderService, pod: str) -> bool:
    """The allocator has the gated pod pN and its claim cN."""
    claims = svc.claims
    assert claims is not None
    return any(p["metadata"]["name"] == pod for p in claims.gated.values()) and \
        f"team-dra/c{pod[1:]}" in claims.claims


def test_the_nodes_with_devices_follow_a_new_devices_mapping_for_the_same_names() -> None:
    """has_devices keeps its answer for one devices mapping and list of names; the next pass's mapping (a
    node whose devices all went) is read afresh even for an equal list of names."""
    plugin = ClaimNodes(cast(Handle, SimpleNamespace(ledger=None)), Args())
    names = ["a", "b", "c"]
    first = {"a": frozenset({0}), "b": frozenset({0, 1}), "c": frozenset({1})}
    assert plugin.has_devices(first, names).tolist() == [True, True, True]
    assert plugin.has_devices(first, list(names)).tolist() == [True, True, True]
    second = {"a": frozenset({0}), "c": frozenset({1})}
    assert plugin.has_devices(second, list(names)).tolist() == [True, False, True]
    assert plugin.has_devices(second, ["c", "b"]).tolist() == [True, False]
