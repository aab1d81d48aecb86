"""Node changes in the ledger: which ones rebuild the capacity view, and what happens to allocations."""

from __future__ import annotations

import copy
import json

from gpupool.api.allocation import encode_allocation
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.core.model import Allocation, GPUGrant
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.ledger import Ledger
from tests.scheduler.conftest import gpu_pod, small_scenario


def _bound_pod(node: dict, name: str, index: int, cores: int) -> dict:
    gpu = json.loads(node["metadata"]["annotations"][ANN_INVENTORY])["gpus"][index]
    pod = gpu_pod(name, cores=cores)
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["spec"]["nodeName"] = node["metadata"]["name"]
    grant = GPUGrant(uuid=gpu["uuid"], index=index, milli=cores * 10, memory_mib=gpu["memory_mib"] * cores // 100)
    allocation = Allocation(pod=name, node=node["metadata"]["name"], grants=(grant,), policy="firstfit")
    pod["metadata"]["annotations"][ANN_ALLOCATION] = encode_allocation(allocation, f"uid-{name}", "hook", "")
    return pod


def test_other_annotation_changes_do_not_rebuild_but_inventory_changes_do():
    nodes = node_objects(small_scenario(nodes=2, gpus=2))
    ledger = Ledger(nodes)
    ledger.apply_pod("ADDED", _bound_pod(nodes[0], "a", 1, 40))
    generation = ledger.generation
    noted = copy.deepcopy(nodes[0])
    noted["metadata"]["annotations"]["example.com/note"] = "{}"
    assert ledger.apply_node("MODIFIED", noted) is False and ledger.generation == generation
    sick = copy.deepcopy(noted)
    inventory = json.loads(sick["metadata"]["annotations"][ANN_INVENTORY])
    inventory["gpus"][0]["healthy"] = False
    sick["metadata"]["annotations"][ANN_INVENTORY] = json.dumps(inventory)
    assert ledger.apply_node("MODIFIED", sick) is True and ledger.generation == generation + 1
    i = ledger.state.index["gpu-0000"]
    assert not ledger.state.gpu_healthy[i, 0]
    # the allocation on GPU 1 survives the rebuild: 1000 - 400 milli left there
    assert int(ledger.state.gpu_milli_free[i, 1]) == 600 and set(ledger.entries) == {"uid-a"}


def test_removed_node_strands_its_allocations_until_their_pods_go():
    nodes = node_objects(small_scenario(nodes=2, gpus=2))
    ledger = Ledger(nodes)
    pod = _bound_pod(nodes[1], "b", 0, 50)
    ledger.apply_pod("ADDED", pod)
    ledger.apply_node("DELETED", nodes[1])
    assert len(ledger.state) == 1 and ledger.entries == {} and set(ledger.stranded) == {"uid-b"}
    assert [e["pod"] for e in ledger.dump()["stranded"]] == ["default/b"]
    ledger.apply_pod("DELETED", pod)
    assert ledger.stranded == {}


def test_malformed_inventory_is_reported_per_node():
    nodes = node_objects(small_scenario(nodes=2, gpus=1))
    nodes[1]["metadata"]["annotations"][ANN_INVENTORY] = '{"version": 1, "node": "x", "gpus": [{"index": 0}]}'
    ledger = Ledger(nodes)
    assert len(ledger.state) == 1
    assert "gpu-0001" in ledger.node_errors and "invalid gpupool.io/inventory" in ledger.node_errors["gpu-0001"]


def test_node_changes_held_for_one_refresh_are_rebuilt_once():
    nodes = node_objects(small_scenario(nodes=3, gpus=2))
    ledger = Ledger(nodes[:1])
    ledger.apply_pod("ADDED", _bound_pod(nodes[0], "a", 1, 40))
    generation = ledger.generation
    relabelled = copy.deepcopy(nodes[0])
    relabelled["metadata"]["labels"] = {**relabelled["metadata"].get("labels", {}), "zone": "b"}
    changes = [("ADDED", nodes[1]), ("ADDED", nodes[2]), ("MODIFIED", relabelled), ("DELETED", nodes[2])]
    assert [ledger.apply_node(t, o, rebuild=False) for t, o in changes] == [True] * 4
    # Nothing rebuilt yet: the capacity view is the one before the burst.
    assert ledger.stale and ledger.generation == generation and len(ledger.state) == 1
    assert ledger.refresh() is True and ledger.refresh() is False
    assert ledger.generation == generation + 1 and not ledger.stale
    assert sorted(ledger.state.index) == ["gpu-0000", "gpu-0001"]
    # The allocation on gpu-0000's GPU 1 was taken again by the one rebuild: 1000 - 400 milli left.
    i = ledger.state.index["gpu-0000"]
    assert int(ledger.state.gpu_milli_free[i, 1]) == 600 and set(ledger.entries) == {"uid-a"}


def test_every_node_event_gives_the_node_a_new_version_even_without_a_rebuild():
    """node_versions (what node_rules.MayRunCache keys its answers by) changes on a change that leaves
    capacity alone, for that node only, and on one that rebuilds (labels); a removed node has none; a relist
    gives every node a new one."""
    nodes = node_objects(small_scenario(nodes=2, gpus=2))
    ledger = Ledger(nodes)
    first = dict(ledger.node_versions)
    assert set(first) == {"gpu-0000", "gpu-0001"}
    noted = copy.deepcopy(nodes[0])
    noted["metadata"]["annotations"]["example.com/note"] = "{}"
    assert ledger.apply_node("MODIFIED", noted) is False  # no rebuild: capacity is the same
    assert ledger.node_versions["gpu-0000"] != first["gpu-0000"]
    assert ledger.node_versions["gpu-0001"] == first["gpu-0001"]
    noted_version = ledger.node_versions["gpu-0000"]
    labelled = copy.deepcopy(noted)
    labelled["metadata"]["labels"]["zone"] = "b"
    ledger.apply_node("MODIFIED", labelled)
    assert ledger.node_versions["gpu-0000"] not in (first["gpu-0000"], noted_version)
    ledger.apply_node("DELETED", nodes[1])
    assert "gpu-0001" not in ledger.node_versions
    before = dict(ledger.node_versions)
    ledger.replace_nodes(nodes)
    assert set(ledger.node_versions) == {"gpu-0000", "gpu-0001"}
    assert ledger.node_versions["gpu-0000"] not in (before["gpu-0000"], first["gpu-0000"])
    assert ledger.node_versions["gpu-0001"] != first["gpu-0001"]
