"""Node validation in the running agent: a fault injected through the fake backend (or its file) withholds
every GPU from kubelet (slots Unhealthy), publishes why (condition, labels, inventory), and a fix gives
them back; labels and condition are written only when they change."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.port import ClusterPortAgent
from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import NODES
from tests.agent.agent_helpers import NODE, RESOURCE, Rig, eventually, rig

STEPS = ("driver", "toolkit", "isolation", "workload")


class CountingCluster(ClusterPortAgent):
    """Counts the agent's writes to its Node (labels, annotations, conditions) against the memory cluster."""

    def __init__(self, port: MemoryCluster) -> None:
        super().__init__(port)
        self.label_patches = 0
        self.condition_patches = 0

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        self.label_patches += 1
        return await super().patch_node_labels(name, labels)

    async def patch_node_conditions(self, name: str, conditions: list[dict[str, Any]],
                                    resource_version: str) -> dict[str, Any]:
        self.condition_patches += 1
        return await super().patch_node_conditions(name, conditions, resource_version)


def _healthy_slots(r: Rig) -> int:
    return len(r.kubelet.healthy(RESOURCE))


async def _node(r: Rig) -> dict[str, Any]:
    return await r.cluster.get_node(NODE)


def _condition(node: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in node["status"].get("conditions") or [] if c["type"] == "GpupoolReady"]
    assert len(found) == 1, node["status"]
    return found[0]


async def _revalidated(r: Rig) -> None:
    passes = r.agent.validation_passes
    r.agent.revalidate()
    await eventually(lambda: r.agent.validation_passes > passes)


async def test_each_step_fault_withholds_the_gpus_and_its_fix_gives_them_back() -> None:
    async with rig(validation_retry_s=3600, validation_interval_s=3600) as r:  # only revalidate() runs passes
        assert _healthy_slots(r) == 16
        assert _condition(await _node(r))["status"] == "True"
        for step in STEPS:
            r.backend.fail_validation(step, f"{step} broke")
            await _revalidated(r)
            await r.kubelet.wait_for(lambda k: not k.healthy(RESOURCE))
            node = await _node(r)
            c = _condition(node)
            assert (c["status"], c["reason"], c["message"]) == ("False", f"{step.capitalize()}Failed",
                                                                 f"{step}: {step} broke")
            labels = node["metadata"]["labels"]
            assert labels[f"gpupool.io/validation.{step}"] == "false"
            doc = decode_inventory(node["metadata"]["annotations"][ANN_INVENTORY])
            assert [g.healthy for g in doc.gpus] == [False] * 4
            assert [(v.step, v.state) for v in doc.validation][STEPS.index(step)] == (step, "false")
            r.backend.fix_validation(step)
            await _revalidated(r)
            await r.kubelet.wait_for(lambda k: len(k.healthy(RESOURCE)) == 16)
            assert _condition(await _node(r))["status"] == "True"


async def test_labels_and_condition_are_patched_only_when_they_change() -> None:
    async with rig(validation_retry_s=3600, validation_interval_s=3600) as r:
        counting = CountingCluster(r.cluster)
        r.agent.publisher.cluster = counting
        for _ in range(3):  # passes that change nothing write nothing
            await _revalidated(r)
            r.agent.publisher.last = None  # compare against the node itself, not the last snapshot
            await r.agent._publish()
        assert (counting.label_patches, counting.condition_patches) == (0, 0)
        r.backend.fail_validation("workload", "CUDA error 999")
        await _revalidated(r)
        await eventually(lambda: counting.condition_patches == 1)
        await eventually(lambda: counting.label_patches == 1)
        for _ in range(3):  # the same fault again: nothing new to write
            await _revalidated(r)
            r.agent.publisher.last = None
            await r.agent._publish()
        assert (counting.label_patches, counting.condition_patches) == (1, 1)


async def test_kubelets_conditions_are_kept_beside_ours() -> None:
    async with rig(validation_retry_s=3600, validation_interval_s=3600) as r:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready"}
        ours = _condition(await _node(r))
        await r.cluster.patch_object(NODES, NODE, {"status": {"conditions": [ready, ours]}}, subresource="status")
        r.backend.fail_validation("driver", "NVML: driver not loaded")
        await _revalidated(r)
        await eventually(lambda: r.agent.publisher.condition_writes >= 2)
        conditions = (await _node(r))["status"]["conditions"]
        assert [c["type"] for c in conditions] == ["Ready", "GpupoolReady"]
        assert conditions[0] == ready and conditions[1]["status"] == "False"


def test_the_fake_file_injects_and_fixes_validation_faults(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    doc: dict[str, Any] = {"gpus": [{"uuid": "GPU-a", "model": "L40S", "memory_mib": 46068}]}
    path.write_text(json.dumps(doc))
    backend = FakeBackend.from_file(path)
    assert [backend.validation_fault(s) for s in STEPS] == [None] * 4
    path.write_text(json.dumps({**doc, "validation": {"toolkit": "envvar accepted"}}))
    assert [backend.validation_fault(s) for s in STEPS] == [None, "envvar accepted", None, None]
    path.write_text(json.dumps(doc))  # fixed: the file changed again (size differs)
    assert backend.validation_fault("toolkit") is None
    path.write_text(json.dumps({**doc, "validation": {"bogus": "x"}}))
    fault = backend.validation_fault("driver")
    assert fault is not None and "validation.bogus" in fault  # a wrong key fails loudly, naming it
