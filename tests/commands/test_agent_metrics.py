"""The agent's /metrics content: which pods are tenants of which GPU, and the per-pod device series."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.commands.agent_metrics import NodeMetrics, tenants
from gpupool.exporter.device import device_families

NODE = "n1"


def pod(name: str, uid: str, gpus: list[str], node: str = NODE, phase: str = "Running", served: bool = True) -> Any:
    alloc = {"version": 1, "pod_uid": uid, "node": node,
             "gpus": [{"uuid": g, "index": i, "cores": 25, "memory_mib": 1024} for i, g in enumerate(gpus)]}
    ann = {ANN_ALLOCATION: json.dumps(alloc)}
    if served:
        ann[ANN_ALLOCATED] = "{}"
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": ann},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": phase}}


def test_tenants_are_served_unfinished_pods_of_this_node() -> None:
    pods = [
        pod("a", "u-a", ["GPU-0"]),
        pod("b", "u-b", ["GPU-0", "GPU-1"]),
        pod("waiting", "u-w", ["GPU-1"], served=False),  # Allocate not served yet: no tenant
        pod("done", "u-d", ["GPU-1"], phase="Succeeded"),  # finished: holds nothing
        pod("other", "u-o", ["GPU-9"], node="n2"),  # another node's pod
        {"metadata": {"name": "plain", "uid": "u-p"}, "spec": {"nodeName": NODE}},  # no GPU at all
    ]
    got = {(t.ref.pod, t.gpus) for t in tenants(pods, NODE)}
    assert got == {("a", ("GPU-0",)), ("b", ("GPU-0", "GPU-1"))}


def test_one_series_per_tenant_on_each_of_its_gpus(tmp_path: Path) -> None:
    devices = {u: DeviceInfo(uuid=u, index=i, model="L40S", memory_mib=46068) for i, u in enumerate(["GPU-0", "GPU-1"])}
    agent = SimpleNamespace(table=SimpleNamespace(known=devices),
                            config=SimpleNamespace(node_name=NODE, hook_root=tmp_path))
    metrics = NodeMetrics(agent)  # type: ignore[arg-type]
    metrics.pods = tenants([pod("a", "u-a", ["GPU-0"]), pod("b", "u-b", ["GPU-0", "GPU-1"])], NODE)
    families = {f.name: f for f in device_families(metrics.samples(), metrics.pod_of)}
    fb_used = {(s.labels["UUID"], s.labels["pod"]) for s in families["DCGM_FI_DEV_FB_USED"].samples}
    # a and b on GPU-0, b on GPU-1, plus the unattributed remainder of each GPU (empty pod label)
    assert fb_used == {("GPU-0", "a"), ("GPU-0", "b"), ("GPU-1", "b"), ("GPU-0", ""), ("GPU-1", "")}
    free = {s.labels["UUID"]: s.value for s in families["DCGM_FI_DEV_FB_FREE"].samples}
    assert free == {"GPU-0": 46068.0, "GPU-1": 46068.0}  # nothing measured by the hook: all free
    assert {s.labels["Hostname"] for s in families["DCGM_FI_DEV_FB_FREE"].samples} == {NODE}
    assert metrics.pod_of(99) is None


def test_a_card_is_labelled_with_the_vendor_discovery_gave_it(tmp_path: Path) -> None:
    """An uncatalogued model says nothing of its vendor: the label is discovery's, not a guess from the name."""
    devices = {"A-0": DeviceInfo(uuid="A-0", index=0, model="MI308X", memory_mib=196_608, vendor="amd")}
    agent = SimpleNamespace(table=SimpleNamespace(known=devices),
                            config=SimpleNamespace(node_name=NODE, hook_root=tmp_path))
    metrics = NodeMetrics(agent)  # type: ignore[arg-type]
    families = {f.name: f for f in device_families(metrics.samples(), metrics.pod_of)}
    assert {s.labels["vendor"] for s in families["DCGM_FI_DEV_FB_FREE"].samples} == {"amd"}
