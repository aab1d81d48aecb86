"""Inventory annotation and labels: published at start, merged (never replacing other keys), rewritten only
when the content changes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpupool.agent.devices.inventory import LABEL_COUNT, LABEL_MEMORY, LABEL_MODEL, LABEL_PRESENT, label_value
from gpupool.agent.port import ClusterPortAgent
from gpupool.api.inventory import decode_inventory, node_from_object
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import NODE, rig


class LabelledCluster(ClusterPortAgent):
    """ClusterPortAgent plus node labels kept by the fake itself (the memory cluster has no label API yet),
    shown on the node objects it returns, as a real API server would."""

    def __init__(self, port: MemoryCluster, labels: dict[str, str]) -> None:
        super().__init__(port)
        self.labels = dict(labels)
        self.label_patches = 0

    async def get_node(self, name: str) -> dict[str, Any]:
        node = await super().get_node(name)
        node["metadata"]["labels"] = dict(self.labels)
        return node

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        self.label_patches += 1
        for k, v in labels.items():
            if v is None:
                self.labels.pop(k, None)
            else:
                self.labels[k] = v
        return await self.get_node(name)


async def test_inventory_annotation_is_published_and_readable_by_the_scheduler() -> None:
    async with rig() as r:
        node = await r.cluster.get_node(NODE)
        doc = decode_inventory(node["metadata"]["annotations"][ANN_INVENTORY])
        assert doc.node == NODE and doc.split == 4 and doc.driver == "570.86" and doc.cuda == "12.8"
        assert [g.uuid for g in doc.gpus] == [f"GPU-aaaa-{i}" for i in range(4)]
        assert doc.gpus[0].nvlink_peers == [1] and doc.gpus[2].numa_node == 1
        assert node["metadata"]["annotations"]["keep/me"] == "yes"  # merge, not replace
        core_node = node_from_object(node)
        assert core_node is not None and len(core_node.gpus) == 4 and core_node.gpus[0].memory_mib == 81920


async def test_labels_and_change_only_writes() -> None:
    async with rig() as r:
        cluster = LabelledCluster(r.cluster, {"zone": "a"})
        r.agent.cluster = cluster
        r.agent.publisher.cluster = cluster
        r.agent.publisher.last = None  # force a comparison against the node
        await r.agent._publish()
        labels = cluster.labels
        assert labels == {
            "zone": "a",
            LABEL_PRESENT: "true",
            LABEL_MODEL: "A100-80GB",
            LABEL_COUNT: "4",
            LABEL_MEMORY: "81920",
            "gpupool.io/mig.capable": "true",  # A100-80GB has MIG geometry
            "gpupool.io/mig.mode": "disabled",
            "gpupool.io/nvlink.present": "true",
            "gpupool.io/driver.major": "570",
            "gpupool.io/driver.minor": "86",
            "gpupool.io/cuda.major": "12",
            "gpupool.io/cuda.minor": "8",
            **{f"gpupool.io/validation.{step}": "true" for step in ("driver", "toolkit", "isolation", "workload")},
        }
        rv = (await r.cluster.get_node(NODE))["metadata"]["resourceVersion"]
        patches = cluster.label_patches
        for _ in range(3):  # several refresh rounds with nothing changed: no write at all
            r.agent.publisher.last = None
            await r.agent._publish()
        assert (await r.cluster.get_node(NODE))["metadata"]["resourceVersion"] == rv
        assert cluster.label_patches == patches
        # a health change is published
        r.backend.inject_xid("GPU-aaaa-3", 79)
        for _ in range(500):  # bounded wait for the inventory loop
            doc = decode_inventory((await r.cluster.get_node(NODE))["metadata"]["annotations"][ANN_INVENTORY])
            if not doc.gpus[3].healthy:
                break
            await asyncio.sleep(0.02)
        assert [g.healthy for g in doc.gpus] == [True, True, True, False]


def test_label_value_sanitises_model_names() -> None:
    assert label_value("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert label_value("Tesla V100 (PCIe) ") == "Tesla-V100-PCIe"
    assert len(label_value("x" * 100)) == 63
