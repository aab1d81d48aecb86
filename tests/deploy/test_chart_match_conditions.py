"""The webhooks' matchConditions (CEL), evaluated with cel-python on sample requests.

They decide which pods depend on the webhook at all: pods that ask for nothing from gpupool, and
gpupool's own writes of allocation records, must never be sent (so they never fail when it is down).
cel-python implements the CEL language, not Kubernetes' typed object model, so this checks the logic
of the expressions; the API server additionally type-checks them at install time.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from gpupool.api.names import ANN_ALLOCATION, ANN_ISOLATION, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from tests.deploy.conftest import NAMESPACE, Render

SCHEDULER = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-scheduler"
AGENT = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-agent"


def pod(
    limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None, init: bool = False
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits is not None:
        c["resources"] = {"limits": limits, "requests": limits}
    spec: dict[str, Any] = {"containers": [{"name": "sidecar", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [c]
    else:
        spec["containers"].append(c)
    meta: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def matches(
    conditions: list[dict[str, str]], obj: Any, old: Any = None, operation: str = "CREATE", user: str = "alice"
) -> bool:
    """All conditions true = the request is sent to the webhook (the API server ANDs them)."""
    env = celpy.Environment()
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": user}}),
    }
    results = [env.program(env.compile(c["expression"])).evaluate(activation) for c in conditions]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results), results  # an error would fail the pod
    return all(bool(r) for r in results)


@pytest.fixture(scope="module")
def conditions(render: Render) -> dict[str, list[dict[str, str]]]:
    objs = render(None)
    return {
        o["kind"]: o["webhooks"][0]["matchConditions"]
        for o in objs
        if o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    }


CREATE_CASES = [
    pytest.param(pod({RESOURCE_GPU: "1"}), True, id="gpu-count"),
    pytest.param(pod({RESOURCE_MEMORY: "1024"}), True, id="share-without-count"),
    pytest.param(pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20"}, init=True), True, id="init-container"),
    pytest.param(pod(annotations={ANN_ISOLATION: "mps"}), True, id="gpupool-annotation-only"),
    pytest.param(pod(annotations={ANN_ALLOCATION: "{}"}), True, id="forged-allocation"),
    pytest.param(pod({"cpu": "1", "nvidia.com/gpu": "1"}), False, id="other-resources"),
    pytest.param(pod(), False, id="no-resources"),
    pytest.param(pod(annotations={"example.com/gpupool.io": "x"}), False, id="unrelated-annotation"),
]


@pytest.mark.parametrize(("obj", "expected"), CREATE_CASES)
def test_only_gpupool_pods_are_sent_on_create(conditions: dict[str, Any], obj: dict[str, Any], expected: bool) -> None:
    assert matches(conditions["MutatingWebhookConfiguration"], obj) is expected
    assert matches(conditions["ValidatingWebhookConfiguration"], obj) is expected


def test_updates_are_sent_only_when_gpupool_records_change(conditions: dict[str, Any]) -> None:
    validating = conditions["ValidatingWebhookConfiguration"]
    old = pod({RESOURCE_GPU: "1"}, annotations={})
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert matches(validating, relabelled, old, "UPDATE") is False
    forged = copy.deepcopy(old)
    forged["metadata"]["annotations"][ANN_ALLOCATION] = '{"version": 1}'
    assert matches(validating, forged, old, "UPDATE") is True
    marked = copy.deepcopy(old)
    marked["metadata"]["annotations"]["gpupool.io/allocated"] = "true"
    assert matches(validating, marked, old, "UPDATE") is True
    # Removing the record is a change too; a pod without any annotations on either side is not.
    assert matches(validating, old, forged, "UPDATE") is True
    bare = pod({RESOURCE_GPU: "1"})
    assert matches(validating, bare, bare, "UPDATE") is False


@pytest.mark.parametrize("user", [SCHEDULER, AGENT])
def test_gpupool_components_never_wait_on_the_webhook(conditions: dict[str, Any], user: str) -> None:
    old = pod({RESOURCE_GPU: "1"}, annotations={})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][ANN_ALLOCATION] = '{"version": 1}'
    assert matches(conditions["ValidatingWebhookConfiguration"], new, old, "UPDATE", user=user) is False
    # ...but an impostor in another namespace with the same account name is still checked.
    impostor = user.replace(NAMESPACE, "ml")
    assert matches(conditions["ValidatingWebhookConfiguration"], new, old, "UPDATE", user=impostor) is True
