"""The ValidatingAdmissionPolicies that confine each node agent to its own node and its pods (one per
resource), evaluated with cel-python on sample requests; the API server type-checks them when the chart is
installed (tests/e2e/test_e2e_chart.py)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from tests.deploy.conftest import NAMESPACE, Render

AGENT = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {}}, "spec": {}}


def pod_on(node_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}, "spec": spec}


@pytest.fixture(scope="module")
def policy(render: Render) -> dict[str, dict[str, Any]]:
    """Each policy's spec by the one resource it matches."""
    objs = render(None)
    vaps = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = {o["spec"]["policyName"]: o["spec"] for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert {v["metadata"]["name"]: bindings.get(v["metadata"]["name"]) for v in vaps} == {
        v["metadata"]["name"]: {"policyName": v["metadata"]["name"], "validationActions": ["Deny"]} for v in vaps}
    by_resource = {}
    for vap in vaps:
        assert vap["spec"]["failurePolicy"] == "Fail"
        (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
        resource, *subresources = rule["resources"]
        # the node policy also holds the agent's condition writes (nodes/status) to its own node
        assert subresources == (["nodes/status"] if resource == "nodes" else []), rule
        by_resource[resource] = vap["spec"]
    assert set(by_resource) == {"nodes", "pods"}
    return by_resource


def decide(policies: dict[str, dict[str, Any]], resource: str, new: Any, old: Any, user: str,
           node_claim: str | None) -> str:
    """'skip' when no policy applies, 'allow', or the first failing validation's message."""
    if resource not in policies:
        return "skip"
    spec = policies[resource]
    env = celpy.Environment()
    extra = {NODE_CLAIM: [node_claim]} if node_claim else {}
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {
                "operation": "UPDATE",
                "resource": {"group": "", "version": "v1", "resource": resource},
                "userInfo": {"username": user, "extra": extra},
            }
        ),
    }
    for condition in spec["matchConditions"]:
        if not bool(env.program(env.compile(condition["expression"])).evaluate(activation)):
            return "skip"
    for validation in spec["validations"]:
        try:
            ok = bool(env.program(env.compile(validation["expression"])).evaluate(activation))
        except celpy.CELEvalError:
            ok = False  # an evaluation error counts as a failure (failurePolicy: Fail)
        if not ok:
            return validation["message"]
    return "allow"


def annotated(obj: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    new["metadata"].setdefault("annotations", {})["gpupool.io/inventory"] = "{}"
    return new


def test_agent_may_annotate_its_own_node_and_pods(policy: dict[str, dict[str, Any]]) -> None:
    assert decide(policy, "nodes", annotated(node("gpu-1")), node("gpu-1"), AGENT, "gpu-1") == "allow"
    assert decide(policy, "pods", annotated(pod_on("gpu-1")), pod_on("gpu-1"), AGENT, "gpu-1") == "allow"


def test_agent_may_not_touch_other_nodes_or_their_pods(policy: dict[str, dict[str, Any]]) -> None:
    message = "the gpupool agent may change only its own node and the pods bound to it"
    assert decide(policy, "nodes", annotated(node("gpu-2")), node("gpu-2"), AGENT, "gpu-1") == message
    assert decide(policy, "pods", annotated(pod_on("gpu-2")), pod_on("gpu-2"), AGENT, "gpu-1") == message
    assert decide(policy, "pods", annotated(pod_on(None)), pod_on(None), AGENT, "gpu-1") == message


def test_agent_may_not_change_spec(policy: dict[str, dict[str, Any]]) -> None:
    cordoned = node("gpu-1")
    cordoned["spec"]["unschedulable"] = True
    assert "not spec" in decide(policy, "nodes", cordoned, node("gpu-1"), AGENT, "gpu-1")


def test_token_without_node_claim_is_refused(policy: dict[str, dict[str, Any]]) -> None:
    assert "names no node" in decide(policy, "nodes", annotated(node("gpu-1")), node("gpu-1"), AGENT, None)


def test_other_users_are_not_affected(policy: dict[str, dict[str, Any]]) -> None:
    scheduler = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-scheduler"
    assert decide(policy, "nodes", annotated(node("gpu-2")), node("gpu-2"), scheduler, None) == "skip"


def test_policy_can_be_turned_off(render: Render) -> None:
    kinds = {o["kind"] for o in render({"agent": {"restrictToOwnNode": False}})}
    assert "ValidatingAdmissionPolicy" not in kinds and "ValidatingAdmissionPolicyBinding" not in kinds
