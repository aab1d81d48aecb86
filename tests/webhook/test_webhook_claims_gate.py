"""The webhook's DRA gate: new pods with ResourceClaims get gpupool's scheduling gate (so gpupool places
their claims) when the configuration says so; nothing else is gated."""

from __future__ import annotations

from typing import Any

import jsonpatch

from gpupool.api.dra import SCHEDULING_GATE, template_for
from gpupool.webhook.admission import Settings, mutate
from gpupool.webhook.config import WebhookConfig
from gpupool.webhook.policy import make_policy

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


# --- device-plugin manifests served through claims (a namespace policy with `dra`) ---------------------------

DRA_NS = Settings(policies={"dra": make_policy("dra", dra=True)})


def gpu_pod(limits: dict[str, str], containers: int = 1) -> dict[str, Any]:
    main = {"name": "main", "image": "cuda", "resources": {"limits": {"cpu": "1", **limits}}}
    extra = [{"name": f"side{i}", "image": "cuda", "resources": {"limits": dict(limits)}} for i in range(1, containers)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"containers": [main, *extra]}}


def translated(pod: dict[str, Any]) -> dict[str, Any]:
    decision = mutate(pod, DRA_NS, None, policy=DRA_NS.policy("dra"))
    assert decision.allowed, decision.message
    return dict(jsonpatch.apply_patch(pod, decision.patch))


def test_a_share_pod_becomes_a_claim_from_the_template_of_its_share() -> None:
    out = translated(gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "8Gi", "gpupool.io/gpu-cores": "30"}))
    spec = out["spec"]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "gpupool"}]}
    assert spec["resourceClaims"] == [{"name": "gpupool", "resourceClaimTemplateName": "gpupool-hook-1x8192mi-30c"}]
    assert spec["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    # the template that name stands for asks for the same share in gpupool's hook class
    template = template_for("gpupool-hook-1x8192mi-30c", "team-a")
    assert template is not None
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request == {"deviceClassName": "gpu.gpupool.io", "count": 1,
                       "capacity": {"requests": {"memory": "8192Mi", "cores": "30"}}}


def test_whole_gpus_and_memory_only_shares_get_their_own_templates() -> None:
    whole = translated(gpu_pod({"gpupool.io/gpu": "2"}))
    assert whole["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpupool-hook-2xwhole-100c"
    memory_only = translated(gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "4096"}))
    assert memory_only["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpupool-hook-1x4096mi-0c"


def test_what_a_claim_cannot_carry_is_refused_with_the_reason() -> None:
    decision = mutate(gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "50"}, containers=2), DRA_NS, None,
                      policy=DRA_NS.policy("dra"))
    assert not decision.allowed and decision.code == 422
    assert "one GPU container per pod" in decision.message
    pinned = gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "50"})
    pinned["metadata"]["annotations"] = {"gpupool.io/gpu-model": "H100"}
    decision = mutate(pinned, DRA_NS, None, policy=DRA_NS.policy("dra"))
    assert not decision.allowed and "gpupool.io/gpu-model" in decision.message


def test_other_namespaces_keep_the_device_plugin() -> None:
    pod = gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "50"})
    decision = mutate(pod, DRA_NS, None)
    out = dict(jsonpatch.apply_patch(pod, decision.patch))
    assert "resourceClaims" not in out["spec"] and out["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"]


def test_template_names_that_are_not_a_possible_share_stand_for_nothing() -> None:
    for name in ("gpupool-hook-1x8192mi-101c", "gpupool-none-1x8192mi-30c", "gpupool-mig-1xwhole-100c",
                 "gpupool-hook-0xwhole-100c", "my-template"):
        assert template_for(name, "ns") is None, name


def test_a_pod_with_claims_and_a_gpupool_annotation_is_gated_too() -> None:
    pod = claim_pod()
    pod["metadata"]["annotations"] = {"gpupool.io/policy": "gpupool"}  # sent to the GPU pods' entry
    assert applied(pod, ON)["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]


def test_the_validating_webhook_admits_what_the_translation_made() -> None:
    """The API server sends the translated pod to the validating entry next: it must pass there."""
    from gpupool.webhook.admission import check_create

    out = translated(gpu_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "8Gi", "gpupool.io/gpu-cores": "30"}))
    decision = check_create(out, DRA_NS, None, "someone", DRA_NS.policy("dra"))
    assert decision.allowed, decision.message
