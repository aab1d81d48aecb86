"""benchmarks/dra_scale.py's pure parts: what it publishes (Nodes, ResourceSlices in the agent's format),
the pods and templates it creates (gated by the webhook's own code for gpupool's part), the unallocated %
on a hand-computed case, and its JSON line's keys. The benchmark itself needs the control plane and runs
outside the test suite."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from gpupool.api.dra import DRIVER, SCHEDULING_GATE, slice_name
from gpupool.api.inventory import read_node
from gpupool.api.names import RESOURCE_GPU
from gpupool.scheduler.claims import gated, usable_devices

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dra_scale", ROOT / "benchmarks" / "dra_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dra_scale"] = module
    spec.loader.exec_module(module)
    return module


ds = _load()


def test_a_node_is_a_gpupool_dra_node_without_device_plugin_slots() -> None:
    node = ds.node_object("dra-00007", 4)
    read = read_node(node)
    assert read is not None
    core, doc = read
    assert core.name == "dra-00007" and len(core.gpus) == 4
    assert {g.memory_mib for g in core.gpus} == {ds.GPU_MIB} and {g.model for g in core.gpus} == {ds.GPU_MODEL}
    assert RESOURCE_GPU not in node["status"]["allocatable"]
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready"]


def test_the_slice_is_the_agents_one_shared_device_per_gpu() -> None:
    (s,) = ds.slice_objects("dra-00001", "uid-1", 4)
    assert s["metadata"]["name"] == slice_name("dra-00001")
    assert s["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = s["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "dra-00001"
    assert spec["pool"] == {"name": "dra-00001", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    for d in spec["devices"]:
        assert d["allowMultipleAllocations"] is True
        assert d["capacity"]["memory"]["value"] == f"{ds.GPU_MIB}Mi"
        assert d["capacity"]["cores"]["value"] == "100"
    # gpupool's allocator sees every GPU as a shared one
    assert usable_devices([s]).shared == {"dra-00001": {0, 1, 2, 3}}


def test_shares_are_eighths_of_a_gpu_and_the_same_list_each_time() -> None:
    assert [ds.share(k) for k in ds.EIGHTHS] == [(10240, 12), (20480, 25), (40960, 50), (81920, 100)]
    sizes = ds.share_sizes(1000, seed=3)
    assert sizes == ds.share_sizes(1000, seed=3) and set(sizes) == set(ds.EIGHTHS)
    assert sizes != ds.share_sizes(1000, seed=4)
    exactly = ds.claim_template(4)["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly == {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "40960Mi", "cores": "50"}}}


def test_gpupools_pods_carry_the_webhooks_gate_and_kube_schedulers_none() -> None:
    plain, gated_pod = ds.claim_pod(12, 2, False), ds.claim_pod(12, 2, True)
    assert plain["metadata"]["name"] == gated_pod["metadata"]["name"] == "claim-00012"
    assert plain["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "share-2of8"}]
    assert not gated(plain) and gated(gated_pod)
    assert gated_pod["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    del gated_pod["spec"]["schedulingGates"]
    assert gated_pod == plain  # nothing else differs between the two parts


def test_apply_patch_adds_and_replaces() -> None:
    doc: dict[str, Any] = {"a": {"b": [1]}}
    out = ds.apply_patch(doc, [{"op": "add", "path": "/a/c", "value": 2},
                               {"op": "replace", "path": "/a/b", "value": []},
                               {"op": "add", "path": "/a/b/-", "value": 5},
                               {"op": "add", "path": "/x~1y", "value": 1}])
    assert out == {"a": {"b": [5], "c": 2}, "x/y": 1} and doc == {"a": {"b": [1]}}


def _claim(results: list[tuple[str, str, str | None]], request_memory: str = "20Gi") -> dict[str, Any]:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "capacity": {"requests": {"memory": request_memory}}}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": p, "device": d,
                 **({"consumedCapacity": {"memory": m}} if m else {})} for p, d, m in results]}}}}


def test_gpu_use_reads_consumed_memory_or_else_the_request() -> None:
    claims = [_claim([("n0", "gpu-0", "81920Mi")]), _claim([("n0", "gpu-1", "10Gi")]),
              _claim([("n0", "gpu-1", None)]),  # no consumedCapacity: its request, 20 GiB
              _claim([("n1", "gpu-0", "40960Mi")]), {"spec": {}, "status": {}}]  # last: not allocated
    assert ds.gpu_use(claims) == {("n0", "gpu-0"): 81920, ("n0", "gpu-1"): 30720, ("n1", "gpu-0"): 40960}


def test_unallocated_pct_is_memory_left_on_gpus_in_use_over_all_gpus() -> None:
    # 2 nodes x 2 GPUs of 8 MiB: one full GPU, one with 2 MiB used, one with 4, one empty.
    # Free on GPUs in use: 0 + 6 + 4 = 10 MiB of 32: 31.25 %. The empty GPU counts as allocatable.
    use = {("n0", "gpu-0"): 8, ("n0", "gpu-1"): 2, ("n1", "gpu-0"): 4}
    assert ds.unallocated_pct(use, total_gpus=4, gpu_mib=8) == 31.25
    assert ds.unallocated_pct({}, total_gpus=4, gpu_mib=8) == 0.0
    assert ds.unallocated_pct({("n0", "gpu-0"): 8, ("n0", "gpu-1"): 8}, total_gpus=4, gpu_mib=8) == 0.0


def test_the_json_line_has_the_issues_keys() -> None:
    parts = {"gpupool": {"claims": 100, "bound": 100, "pods_per_s": 30.0, "unallocated_pct": 1.234,
                         "gpus_used": 39, "nodes_used": 10, "created_per_s": 61.234},
             "kube_scheduler": {"claims": 100, "bound": 98, "pods_per_s": 40.0, "unallocated_pct": 11.7,
                                "gpus_used": 48, "nodes_used": 19, "created_per_s": 80.0}}
    line = ds.result("v1.37.2", 20, 4, parts)
    assert set(ds.RESULT_KEYS) <= set(line)
    assert set(ds.RESULT_KEYS) == {"kubernetes_version", "nodes", "claims", "gpupool_pods_per_s",
                                   "kube_scheduler_pods_per_s", "ratio", "unallocated_pct_gpupool",
                                   "unallocated_pct_kube_scheduler"}
    assert line["ratio"] == 0.75 and line["unallocated_pct_gpupool"] == 1.23
    assert line["kube_scheduler_unbound"] == 2 and line["gpupool_unbound"] == 0
    assert line["gpupool_created_per_s"] == 61.23 and line["kube_scheduler_created_per_s"] == 80.0
    assert json.loads(json.dumps(line)) == line
