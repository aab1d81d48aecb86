"""The webhook's DRA gate: new pods with ResourceClaims get gpupool's scheduling gate (so gpupool places
their claims) when the configuration says so; nothing else is gated."""

from __future__ import annotations

from typing import Any

import jsonpatch

from gpupool.api.dra import SCHEDULING_GATE
from gpupool.webhook.admission import Settings, mutate
from gpupool.webhook.config import WebhookConfig

ON = Settings(dra_placement=True)


def claim_pod(gates: list[dict[str, str]] | None = None, gpu: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {"claims": [{"name": "gpu"}]}
    if gpu:
        resources["limits"] = {"gpupool.io/gpu": "1"}
    spec: dict[str, Any] = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
                            "containers": [{"name": "main", "image": "busybox", "resources": resources}]}
    if gates is not None:
        spec["schedulingGates"] = gates
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def applied(pod: dict[str, Any], settings: Settings) -> dict[str, Any]:
    decision = mutate(pod, settings, None)
    assert decision.allowed, decision.message
    return dict(jsonpatch.apply_patch(pod, decision.patch)) if decision.patch else pod


def test_a_pod_with_claims_gets_the_gate_beside_its_own() -> None:
    assert applied(claim_pod(), ON)["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    own = [{"name": "example.com/wait"}]
    assert applied(claim_pod(own), ON)["spec"]["schedulingGates"] == [*own, {"name": SCHEDULING_GATE}]


def test_nothing_is_gated_when_off_or_without_claims_or_already_gated() -> None:
    assert "schedulingGates" not in applied(claim_pod(), Settings())["spec"]
    plain = claim_pod()
    del plain["spec"]["resourceClaims"]
    assert "schedulingGates" not in applied(plain, ON)["spec"]
    assert mutate(claim_pod([{"name": SCHEDULING_GATE}]), ON, None).patch == []


def test_device_plugin_pods_are_placed_by_the_extender_not_gated() -> None:
    assert "schedulingGates" not in applied(claim_pod(gpu=True), ON)["spec"]


def test_the_setting_reaches_the_admission_settings() -> None:
    assert WebhookConfig(dra_placement=True).settings().dra_placement is True
    assert WebhookConfig().settings().dra_placement is False
