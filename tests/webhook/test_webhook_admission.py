"""The webhook over real TLS on 127.0.0.1: AdmissionReviews in, decisions and JSON patches out.

Every accepted patch is applied with the `jsonpatch` library (as the API server would) and the result
is checked again: against the Kubernetes schemas, by the shared pod parser, and by /validate.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from gpupool.api.names import ANN_ALLOCATION, ANN_ISOLATION, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.api.pod import parse_pod
from tests.webhook.helpers import SCHEDULER_SA, Served, pod, review

K8S_VERSIONS = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]


async def admit(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await served.client.post(path, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == body["request"]["uid"]
    return out["response"]


def patched(obj: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    if "patch" not in resp:
        return obj
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    return jsonpatch.apply_patch(obj, ops)


def schema_valid(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


async def mutate_then_validate(served: Served, obj: dict[str, Any]) -> dict[str, Any]:
    """The API server's order: mutating webhook, patch applied, then validating webhook."""
    resp = await admit(served, "/mutate", review(obj))
    assert resp["allowed"], resp
    result = patched(obj, resp)
    schema_valid(result)
    assert parse_pod(result).errors == []
    again = await admit(served, "/validate", review(result))
    assert again["allowed"], again
    return result


# --- accepted pods ----------------------------------------------------------------------------------------


async def test_share_is_routed_normalised_and_annotated(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "10Gi", RESOURCE_CORES: "30"})
    result = await mutate_then_validate(served, obj)
    assert result["spec"]["schedulerName"] == "gpupool-scheduler"
    res = result["spec"]["containers"][0]["resources"]
    # 10Gi = 10 * 1024 MiB = 10240 MiB, written in both maps so that requests == limits still holds
    assert res["limits"][RESOURCE_MEMORY] == res["requests"][RESOURCE_MEMORY] == "10240"
    assert res["limits"][RESOURCE_CORES] == "30"
    assert result["metadata"]["annotations"] == {ANN_ISOLATION: "hook"}
    request = parse_pod(result).request
    assert request is not None and request.gpu.memory_mib == 10240 and request.gpu.milli == 300


async def test_whole_gpu_request_gets_explicit_cores(served: Served) -> None:
    result = await mutate_then_validate(served, pod({RESOURCE_GPU: "2"}))
    res = result["spec"]["containers"][0]["resources"]
    assert res["limits"][RESOURCE_CORES] == res["requests"][RESOURCE_CORES] == "100"
    request = parse_pod(result).request
    assert request is not None and request.gpu.count == 2 and request.gpu.whole


async def test_existing_annotations_are_kept_and_keys_escaped(served: Served) -> None:
    # Keys with '/' and '~' must be escaped in JSON pointers (~1 and ~0), or the patch hits the wrong key.
    annotations = {"team.example.com/owner": "vision", "odd~key/x": "1"}
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "4096"}, annotations=annotations)
    resp = await admit(served, "/mutate", review(obj))
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert {"op": "add", "path": "/metadata/annotations/gpupool.io~1isolation", "value": "hook"} in ops
    result = patched(obj, resp)
    assert result["metadata"]["annotations"] == {**annotations, ANN_ISOLATION: "hook"}
    # The memory was already in MiB, so only routing and the annotation change.
    assert [op["path"] for op in ops] == ["/spec/schedulerName", "/metadata/annotations/gpupool.io~1isolation"]


async def test_chosen_isolation_is_not_overwritten(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "50"}, annotations={ANN_ISOLATION: "mps"})
    result = await mutate_then_validate(served, obj)
    assert result["metadata"]["annotations"][ANN_ISOLATION] == "mps"


async def test_already_routed_pod_gets_no_patch(served: Served) -> None:
    obj = pod(
        {RESOURCE_GPU: "1", RESOURCE_MEMORY: "2048"},
        annotations={ANN_ISOLATION: "mps"},  # as strong as the default policy's hook, so allowed as is
        spec={"schedulerName": "gpupool-scheduler"},
    )
    resp = await admit(served, "/mutate", review(obj))
    assert resp["allowed"] and "patch" not in resp


async def test_pod_without_gpu_is_left_alone(served: Served) -> None:
    obj = pod({"cpu": "2", "memory": "1Gi"})
    for path in ("/mutate", "/validate"):
        resp = await admit(served, path, review(obj))
        assert resp == {"uid": review(obj)["request"]["uid"], "allowed": True}


async def test_init_container_memory_is_normalised(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "8Gi", RESOURCE_CORES: "20"})
    obj["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox", "resources": {}}]
    result = await mutate_then_validate(served, obj)
    assert result["spec"]["containers"][0]["resources"]["limits"][RESOURCE_MEMORY] == "8192"


async def test_memory_within_the_named_model(served: Served) -> None:
    # 70000 MiB fits an H100-80GB (81920 MiB) but not an A100-40GB (40960 MiB).
    ok = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "70000"}, annotations={"gpupool.io/gpu-model": "H100-80GB"})
    await mutate_then_validate(served, ok)
    bad = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "70000"}, annotations={"gpupool.io/gpu-model": "A100-40GB"})
    resp = await admit(served, "/mutate", review(bad))
    assert not resp["allowed"]
    assert "70000 MiB is more than any A100-40GB GPU has (largest: 40960 MiB)" in resp["status"]["message"]


# --- refused pods -----------------------------------------------------------------------------------------

BAD_CASES = [
    pytest.param(
        {RESOURCE_GPU: "1", RESOURCE_CORES: "150"},
        None,
        f"{RESOURCE_CORES}=150 must be between 1 and 100",
        id="cores-over-100",
    ),
    pytest.param(
        {RESOURCE_GPU: "1", RESOURCE_CORES: "0"}, None, f"{RESOURCE_CORES}=0 must be between 1 and 100", id="cores-zero"
    ),
    pytest.param(
        {RESOURCE_GPU: "1", RESOURCE_MEMORY: "0"}, None, f"{RESOURCE_MEMORY}=0 must be a positive", id="memory-zero"
    ),
    # 96Gi = 96 * 1024 = 98304 MiB > 81920 MiB, the largest GPU (H100-80GB) in the test cluster
    pytest.param(
        {RESOURCE_GPU: "1", RESOURCE_MEMORY: "98304"},
        None,
        "98304 MiB is more than any GPU in the cluster has (largest: 81920 MiB)",
        id="memory-too-big",
    ),
    pytest.param(
        {RESOURCE_MEMORY: "1024", RESOURCE_CORES: "10"}, None, f"need {RESOURCE_GPU}", id="share-without-count"
    ),
    pytest.param({RESOURCE_GPU: "2", RESOURCE_CORES: "50"}, None, f"with {RESOURCE_GPU}: 1", id="share-of-two"),
    pytest.param({RESOURCE_GPU: "5"}, None, "no node has that many GPUs (largest node has 4)", id="too-many-gpus"),
    pytest.param(
        {RESOURCE_GPU: "1"},
        {ANN_ISOLATION: "vfio"},
        "isolation='vfio': use one of mps, hook, mig, none",
        id="unknown-isolation",
    ),
    pytest.param({RESOURCE_GPU: "2"}, {ANN_ISOLATION: "mig"}, "a pod gets one MIG instance", id="mig-two-gpus"),
    pytest.param(
        {RESOURCE_GPU: "1"},
        {ANN_ISOLATION: "mig", "gpupool.io/mig-profile": "5g.50gb"},
        "isolation=mig: no MIG profile serves this request on the cluster's GPUs (A100-40GB: MIG profile '5g.50gb'",
        id="mig-unknown-profile",
    ),
    pytest.param(
        {RESOURCE_GPU: "1"}, {"gpupool.io/policy": "fastest"}, "policy='fastest': unknown policy", id="unknown-policy"
    ),
    pytest.param(
        {RESOURCE_GPU: "1"},
        {"gpupool.io/gpu-uuid": "GPU-x", "gpupool.io/gpu-exclude": "GPU-x"},
        "every allowed GPU is also excluded",
        id="include-all-excluded",
    ),
]


@pytest.mark.parametrize(("resources", "annotations", "expected"), BAD_CASES)
async def test_impossible_requests_are_refused_by_both_webhooks(
    served: Served, resources: dict[str, str], annotations: dict[str, str] | None, expected: str
) -> None:
    # /mutate sees the pod as written; /validate sees it after mutation (routed to our scheduler).
    obj = pod(resources, annotations=annotations)
    routed = pod(resources, annotations=annotations, spec={"schedulerName": "gpupool-scheduler"})
    for path, body in (("/mutate", obj), ("/validate", routed)):
        resp = await admit(served, path, review(body))
        assert resp["allowed"] is False, (path, resp)
        assert resp["status"]["code"] == 422
        assert expected in resp["status"]["message"], resp["status"]["message"]
        assert resp["status"]["message"].startswith("gpupool refused pod ml/train: ")
        assert "patch" not in resp


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        ("96Gi", "98304 MiB is more than any GPU in the cluster has (largest: 81920 MiB)"),
        ("12Q", "gpu-memory '12Q': not a Kubernetes quantity"),
        ("500m", "gpu-memory=0 must be a positive number of MiB"),  # 0.5 bytes, rounded down
    ],
)
async def test_memory_units_are_checked_when_mutating(served: Served, memory: str, expected: str) -> None:
    resp = await admit(served, "/mutate", review(pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: memory})))
    assert not resp["allowed"] and expected in resp["status"]["message"], resp


async def test_unnormalised_memory_is_read_by_validate_like_the_scheduler(served: Served) -> None:
    # Another mutating webhook may (re)write the unit after ours: every component reads pods with the same
    # reader (gpupool.api.pod), so 8Gi means 8192 MiB to all of them and is admitted.
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "8Gi"}, spec={"schedulerName": "gpupool-scheduler"})
    resp = await admit(served, "/validate", review(obj))
    assert resp["allowed"], resp
    request = parse_pod(obj).request
    assert request is not None and request.gpu.memory_mib == 8192


async def test_all_problems_are_listed_at_once(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "101"}, annotations={ANN_ISOLATION: "bogus"})
    resp = await admit(served, "/validate", review(obj))
    message = resp["status"]["message"]
    assert "bogus" in message and "101" in message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"schedulerName": "volcano"}, "spec.schedulerName='volcano'"),
        ({"nodeName": "node-b"}, "spec.nodeName='node-b'"),
    ],
    ids=["other-scheduler", "node-name-set"],
)
async def test_pods_that_bypass_the_scheduler_are_refused(served: Served, spec: dict[str, Any], expected: str) -> None:
    obj = pod({RESOURCE_GPU: "1"}, spec=spec)
    resp = await admit(served, "/mutate", review(obj))
    assert not resp["allowed"] and expected in resp["status"]["message"]


async def test_privileged_gpu_container_is_refused(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20"})
    obj["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    resp = await admit(served, "/mutate", review(obj))
    assert not resp["allowed"] and "privileged containers see every GPU" in resp["status"]["message"]


@pytest.mark.parametrize("path", ["/dev", "/dev/", "/dev/nvidia0", "/dev/nvidiactl"])
async def test_gpu_device_host_paths_are_refused(served: Served, path: str) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20"})
    obj["spec"]["volumes"] = [{"name": "devs", "hostPath": {"path": path}}]
    resp = await admit(served, "/mutate", review(obj))
    assert not resp["allowed"] and f"hostPath {path} exposes GPU devices" in resp["status"]["message"]
    obj["spec"]["volumes"] = [{"name": "logs", "hostPath": {"path": "/var/log/devices"}}]
    assert (await admit(served, "/mutate", review(obj)))["allowed"]


async def test_user_supplied_allocation_is_refused(served: Served) -> None:
    allocation = json.dumps({"version": 1, "node": "node-b", "gpus": []})
    obj = pod({RESOURCE_GPU: "1"}, annotations={ANN_ALLOCATION: allocation})
    for path in ("/mutate", "/validate"):
        resp = await admit(served, path, review(obj))
        assert not resp["allowed"]
        assert resp["status"]["code"] == 403
        assert f"annotation {ANN_ALLOCATION} is written by gpupool itself" in resp["status"]["message"]
    # Even on a pod that asks for no GPU: the ledger is rebuilt from these annotations.
    plain = pod({"cpu": "1"}, annotations={ANN_ALLOCATION: allocation})
    resp = await admit(served, "/validate", review(plain))
    assert not resp["allowed"] and resp["status"]["code"] == 403


async def test_only_the_scheduler_may_change_the_allocation_later(served: Served) -> None:
    old = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "100"}, spec={"schedulerName": "gpupool-scheduler"})
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"] = {ANN_ALLOCATION: '{"version": 1}'}
    by_user = await admit(served, "/validate", review(new, "UPDATE", old, user="alice"))
    assert not by_user["allowed"] and by_user["status"]["code"] == 403
    by_scheduler = await admit(served, "/validate", review(new, "UPDATE", old, user=SCHEDULER_SA))
    assert by_scheduler["allowed"]
    # A label change by a user that leaves the allocation alone is fine.
    # The node agent's mark is just as protected.
    marked = json.loads(json.dumps(new))
    marked["metadata"]["annotations"]["gpupool.io/allocated"] = "true"
    resp = await admit(served, "/validate", review(marked, "UPDATE", new, user="alice"))
    assert not resp["allowed"] and "gpupool.io/allocated" in resp["status"]["message"]
    relabelled = json.loads(json.dumps(new))
    relabelled["metadata"]["labels"] = {"team": "vision"}
    resp = await admit(served, "/validate", review(relabelled, "UPDATE", new, user="alice"))
    assert resp["allowed"]


async def test_unknown_model_is_allowed_with_a_warning(served: Served) -> None:
    # An autoscaler may add V100 nodes later, so this is not impossible, only worth telling.
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "1024"}, annotations={"gpupool.io/gpu-model": "V100"})
    resp = await admit(served, "/mutate", review(obj))
    assert resp["allowed"]
    assert any("no such GPU model in the cluster yet (known: A100-40GB, H100-80GB)" in w for w in resp["warnings"])


async def test_unknown_inventory_allows_with_a_warning(served: Served) -> None:
    served.inventory.replace([])  # e.g. the node watch has not delivered yet, or no GPU node exists
    obj = pod({RESOURCE_GPU: "1", RESOURCE_MEMORY: "500000"})
    resp = await admit(
        served, "/validate", review(obj | {"spec": obj["spec"] | {"schedulerName": "gpupool-scheduler"}})
    )
    assert resp["allowed"]
    assert any("inventory not known" in w for w in resp["warnings"])


# --- the envelope -----------------------------------------------------------------------------------------


async def test_malformed_json_is_400_and_the_server_keeps_serving(served: Served) -> None:
    r = await served.client.post(
        "/mutate",
        content=b'{"apiVersion": "admission.k8s.io/v1", "kind": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert "body is not valid JSON" in r.json()["error"]
    deep = await served.client.post("/validate", content=b"[" * 100_000)
    assert deep.status_code == 400
    resp = await admit(served, "/mutate", review(pod({RESOURCE_GPU: "1"})))
    assert resp["allowed"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([1, 2], "expected a JSON object"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}, "expected apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: missing"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}, "request.uid"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "object": "x"}},
            "request.object: expected an object",
        ),
    ],
    ids=["not-object", "wrong-version", "no-request", "bad-uid", "bad-object"],
)
async def test_malformed_review_is_400_with_reason(served: Served, body: Any, expected: str) -> None:
    r = await served.client.post("/validate", json=body)
    assert r.status_code == 400
    assert expected in r.json()["error"]


async def test_oversized_body_is_413(served: Served) -> None:
    # The test server's limit is 256 KiB; send 300 KiB, once declared and once streamed without length.
    big = review(pod({RESOURCE_GPU: "1"}, annotations={"note": "x" * 300 * 1024}))
    r = await served.client.post("/mutate", json=big)
    assert r.status_code == 413

    async def chunks() -> Any:
        payload = json.dumps(big).encode()
        for i in range(0, len(payload), 16 * 1024):
            yield payload[i : i + 16 * 1024]

    r = await served.client.post("/mutate", content=chunks())
    assert r.status_code == 413
    assert (await admit(served, "/mutate", review(pod({RESOURCE_GPU: "1"}))))["allowed"]


async def test_other_kinds_and_operations_pass(served: Served) -> None:
    body = review(pod({RESOURCE_GPU: "1", RESOURCE_CORES: "500"}), operation="DELETE")
    assert (await admit(served, "/validate", body))["allowed"]
    body = review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    body["request"]["kind"]["kind"] = "ConfigMap"
    assert (await admit(served, "/mutate", body))["allowed"]


async def test_health_readiness_and_metrics(served: Served) -> None:
    assert (await served.client.get("/healthz")).text == "ok"
    assert (await served.client.get("/readyz")).status_code == 200
    await admit(served, "/mutate", review(pod({RESOURCE_GPU: "1", RESOURCE_CORES: "300"})))
    text = (await served.client.get("/metrics")).text
    assert 'gpupool_webhook_reviews_total{outcome="denied",webhook="mutate"} 1.0' in text


# --- several containers, init containers and sidecars -----------------------------------------------------


async def test_gpu_containers_that_share_one_placement_are_admitted(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20", RESOURCE_MEMORY: "16G"})
    obj["spec"]["initContainers"] = [{"name": "log", "image": "busybox", "restartPolicy": "Always", "resources": {
        "limits": {RESOURCE_GPU: "1", RESOURCE_CORES: "10", RESOURCE_MEMORY: "1e3"}}}]
    result = await mutate_then_validate(served, obj)
    sidecar = result["spec"]["initContainers"][0]["resources"]["limits"]
    # 16G = 16e9 B = 15258.79 MiB -> 15258; 1e3 unitless = 1000 MiB (already MiB, rewritten as a plain number)
    assert result["spec"]["containers"][0]["resources"]["limits"][RESOURCE_MEMORY] == "15258"
    assert sidecar[RESOURCE_MEMORY] == "1000"
    request = parse_pod(result).request
    # the sidecar runs beside the app: 20 % + 10 % = 300 milli, 15258 + 1000 = 16258 MiB on one GPU
    assert request is not None and (request.gpu.count, request.gpu.milli, request.gpu.memory_mib) == (1, 300, 16258)


async def test_gpu_containers_that_cannot_share_a_placement_are_refused(served: Served) -> None:
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20"})
    obj["spec"]["containers"].append({"name": "whole", "image": "busybox",
                                      "resources": {"limits": {RESOURCE_GPU: "1"}}})
    resp = await admit(served, "/mutate", review(obj))
    assert not resp["allowed"] and resp["status"]["code"] == 422
    assert "(container main, container whole) mix whole GPUs and shares" in resp["status"]["message"]
