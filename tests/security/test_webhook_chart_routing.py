"""The chart routes every pod a tenant could use against the pool to the webhook, under its namespace's
policy: GPU pods to entries that fail closed, every other pod to one that fails open, kubectl debug and
isolation changes included. CEL is evaluated with cel-python; label selectors as the API server does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupool.api.names import ANN_ISOLATION, RESOURCE_GPU
from gpupool.webhook.config import ConfigError, load_config
from tests.deploy.conftest import NAMESPACE, Render, helm, render  # noqa: F401 (fixtures)


def pod(limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits is not None:
        c["resources"] = {"limits": limits, "requests": limits}
    meta: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "sidecar", "image": "busybox"}, c]}}


POLICIES = {
    "secure": {"defaultIsolation": "mps", "allowedIsolation": ["mps"], "weakerIsolation": "raise", "strict": True},
    "node-infra": {"allowHostAccess": True},
}
LABEL = "gpupool.io/admission-policy"


def hooks(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        h["name"]: h
        for o in objs
        if o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for h in o["webhooks"]
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A namespaceSelector's matchExpressions (In / NotIn: NotIn also matches a missing label)."""
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value is not None and value in e["values"]:
            return False
    return True


def sent_to(entries: dict[str, dict[str, Any]], obj: dict[str, Any], labels: dict[str, str], operation: str = "CREATE",
            old: Any = None, sub_resource: str = "") -> set[str]:
    """Names of the entries the API server calls for this request."""
    out = set()
    resource = "pods" + (f"/{sub_resource}" if sub_resource else "")
    for name, h in entries.items():
        if not any(operation in r["operations"] and resource in r["resources"] for r in h["rules"]):
            continue
        if not selects(h["namespaceSelector"], labels):
            continue
        request = {"operation": operation, "userInfo": {"username": "alice"}}
        if sub_resource:
            request["subResource"] = sub_resource
        if _matches(h["matchConditions"], obj, old, request):
            out.add(name)
    return out


def _matches(conditions: list[dict[str, str]], obj: Any, old: Any, request: dict[str, Any]) -> bool:
    import celpy
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(old), "request": json_to_cel(request)}
    results = [env.program(env.compile(c["expression"])).evaluate(activation) for c in conditions]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


def ns(name: str, policy: str | None = None) -> dict[str, str]:
    labels = {"kubernetes.io/metadata.name": name}
    if policy is not None:
        labels[LABEL] = policy
    return labels


@pytest.fixture(scope="module")
def default_entries(render: Render) -> dict[str, dict[str, Any]]:  # noqa: F811
    return hooks(render(None))


@pytest.fixture(scope="module")
def policy_entries(render: Render) -> dict[str, dict[str, Any]]:  # noqa: F811
    return hooks(render({"webhook": {"admission": {"policies": POLICIES}}}))


def test_every_entry_fails_closed_by_default(default_entries: dict[str, dict[str, Any]], render: Render) -> None:  # noqa: F811
    # (issue 26: the entry for non-GPU pods failed open: an unchecked pod could set NVIDIA_VISIBLE_DEVICES)
    assert {n: h["failurePolicy"] for n, h in default_entries.items()} == {
        "mutate.gpupool.io": "Fail", "validate.gpupool.io": "Fail", "pods.validate.gpupool.io": "Fail",
    }
    opened = hooks(render({"webhook": {"admission": {"checkAllPodsFailurePolicy": "Ignore"}}}))
    assert {n: h["failurePolicy"] for n, h in opened.items()} == {
        "mutate.gpupool.io": "Fail", "validate.gpupool.io": "Fail", "pods.validate.gpupool.io": "Ignore",
    }
    gpu, plain = pod({RESOURCE_GPU: "1"}), pod()
    assert sent_to(default_entries, gpu, ns("ml")) == {"mutate.gpupool.io", "validate.gpupool.io"}
    assert sent_to(default_entries, plain, ns("ml")) == {"pods.validate.gpupool.io"}
    assert sent_to(default_entries, plain, ns("kube-system")) == set()
    assert sent_to(default_entries, gpu, ns(NAMESPACE)) == set()  # the webhook never gates its own pods


def test_kubectl_debug_and_isolation_changes_reach_the_webhook(default_entries: dict[str, dict[str, Any]]) -> None:
    gpu, plain = pod({RESOURCE_GPU: "1"}, annotations={ANN_ISOLATION: "mps"}), pod()
    for old, entry in ((gpu, "validate.gpupool.io"), (plain, "pods.validate.gpupool.io")):
        new = copy.deepcopy(old)
        new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
        assert sent_to(default_entries, new, ns("ml"), "UPDATE", old, "ephemeralcontainers") == {entry}
    weakened = copy.deepcopy(gpu)
    weakened["metadata"]["annotations"][ANN_ISOLATION] = "none"
    assert sent_to(default_entries, weakened, ns("ml"), "UPDATE", gpu) == {"validate.gpupool.io"}
    relabelled = copy.deepcopy(gpu)
    relabelled["metadata"]["labels"] = {"a": "b"}
    assert sent_to(default_entries, relabelled, ns("ml"), "UPDATE", gpu) == set()


@pytest.mark.parametrize(
    ("labels", "prefix"),
    [(ns("ml"), ""), (ns("ml", "secure"), "secure."), (ns("ml", "node-infra"), "node-infra."),
     (ns("ml", "typo"), "")],  # an unknown policy name falls back to the default policy
)
def test_each_namespace_reaches_exactly_its_policy(
    policy_entries: dict[str, dict[str, Any]], labels: dict[str, str], prefix: str
) -> None:
    gpu, plain = pod({RESOURCE_GPU: "1"}), pod()
    assert sent_to(policy_entries, gpu, labels) == {f"{prefix}mutate.gpupool.io", f"{prefix}validate.gpupool.io"}
    assert sent_to(policy_entries, plain, labels) == {f"{prefix}pods.validate.gpupool.io"}
    path = policy_entries[f"{prefix}validate.gpupool.io"]["clientConfig"]["service"]["path"]
    assert path == "/validate" + (f"/{prefix[:-1]}" if prefix else "")


def test_chart_policies_are_the_ones_the_webhook_reads(render: Render) -> None:  # noqa: F811
    objs = render({"isolation": "mps", "webhook": {"admission": {"policies": POLICIES, "strict": True}}})
    (deploy,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-webhook")]
    env = {e["name"]: e["value"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = load_config(env=env).settings()
    default = settings.policy()
    # allowedIsolation empty: mps and every mode at least as strong (hook ranks with mps, mig above)
    assert (default.default_isolation, default.strict) == ("mps", True)
    assert default.allowed == frozenset({"mps", "hook", "mig"})
    secure = settings.policy("secure")
    assert (secure.default_isolation, secure.weaker, secure.strict) == ("mps", "raise", True)
    assert secure.allowed == frozenset({"mps"})
    # A policy without defaultIsolation takes the chart's top-level isolation.
    assert settings.policy("node-infra").allow_host_access and settings.policy("node-infra").default_isolation == "mps"
    paths = {h["clientConfig"]["service"]["path"] for h in hooks(objs).values()}
    for path in paths:
        name = path.rsplit("/", 1)[1] if path.count("/") == 2 else None
        assert settings.policy(name) is not None  # every path the chart uses names a policy the webhook has


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GPUPOOL_WEBHOOK_POLICIES": "{nope"}, "GPUPOOL_WEBHOOK_POLICIES: not JSON"),
        ({"GPUPOOL_WEBHOOK_POLICIES": '{"Bad_Name": {}}'}, "policy name 'Bad_Name'"),
        ({"GPUPOOL_WEBHOOK_POLICIES": '{"x": {"default_isolation": "mps", "allowed_isolation": ["hook"]}}'},
         "default isolation 'mps' is not among the allowed ones"),
        ({"GPUPOOL_WEBHOOK_ALLOWED_ISOLATION": "mps,turbo"}, "allowed isolation turbo unknown"),
    ],
)
def test_bad_policy_configuration_is_named(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(env=env)
