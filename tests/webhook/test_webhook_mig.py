"""Admission of pods with isolation `mig`, decided against the GPU models the cluster's inventories show
(check_create on its own: a pure function of the pod, the settings and the inventory summary).

Geometry used below (gpupool.core.mig): A100-40GB profiles 1g.5gb 4864 MiB ... 7g.40gb 40192 MiB;
H100-80GB 1g.10gb 9984 MiB ... 7g.80gb; T4 and L4 have no MIG."""

from __future__ import annotations

from typing import Any

from gpupool.api.names import ANN_ISOLATION, ANN_MIG_PROFILE, ANN_MODEL, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.webhook.admission import Decision, Settings, check_create
from gpupool.webhook.inventory import Limits
from tests.webhook.helpers import pod

SETTINGS = Settings()
ROUTED = {"schedulerName": "gpupool-scheduler"}
A100_AND_T4 = Limits(40960, {"A100-40GB": 40960, "T4": 15360}, 4)
T4_ONLY = Limits(15360, {"T4": 15360}, 4)


def decide(resources: dict[str, str], limits: Limits | None = A100_AND_T4) -> Decision:
    obj: dict[str, Any] = pod(resources, annotations={ANN_ISOLATION: "mig"}, spec=ROUTED)
    return check_create(obj, SETTINGS, limits, "alice")


def refused(decision: Decision) -> str:
    assert not decision.allowed and decision.code == 422, decision
    return decision.message


def test_requests_a_profile_of_a_model_in_the_cluster_holds_are_admitted() -> None:
    # 10000 MiB: A100-40GB's 1g.10gb and 2g.10gb have 9850 MiB, 3g.20gb (19968) holds it
    assert decide({RESOURCE_GPU: "1", RESOURCE_MEMORY: "10000"}).allowed
    assert decide({RESOURCE_GPU: "1", RESOURCE_CORES: "100"}).allowed  # the whole GPU: 7g.40gb
    assert check_create(pod({RESOURCE_GPU: "1"}, annotations={ANN_ISOLATION: "mig", ANN_MIG_PROFILE: "3g.20gb"},
                            spec=ROUTED), SETTINGS, A100_AND_T4, "alice").allowed


def test_no_mig_capable_model_in_the_cluster() -> None:
    message = refused(decide({RESOURCE_GPU: "1", RESOURCE_CORES: "30"}, T4_ONLY))
    assert "isolation=mig: no GPU model in the cluster supports MIG (the cluster has T4; MIG-capable: " in message
    # the pod's own model choice counts: T4 only, though the cluster has A100s
    obj = pod({RESOURCE_GPU: "1"}, annotations={ANN_ISOLATION: "mig", ANN_MODEL: "T4"},
              spec=ROUTED)
    assert "no GPU model among T4 in the cluster supports MIG" in refused(check_create(obj, SETTINGS, A100_AND_T4, ""))


def test_request_larger_than_the_largest_profile() -> None:
    # 40192 MiB is the A100-40GB's largest profile (7g.40gb); 40500 fits the card (40960) but no instance
    message = refused(decide({RESOURCE_GPU: "1", RESOURCE_MEMORY: "40500"}))
    assert ("no MIG profile serves this request on the cluster's GPUs (A100-40GB: no MIG profile of A100-40GB "
            "holds 40500 MiB") in message


def test_named_profile_must_exist_and_hold_the_share() -> None:
    obj = pod({RESOURCE_GPU: "1"}, annotations={ANN_ISOLATION: "mig", ANN_MIG_PROFILE: "3g.40gb"},
              spec=ROUTED)
    assert "MIG profile '3g.40gb' does not exist on A100-40GB" in refused(check_create(obj, SETTINGS, A100_AND_T4, ""))
    obj = pod({RESOURCE_GPU: "1", RESOURCE_CORES: "50"},
              annotations={ANN_ISOLATION: "mig", ANN_MIG_PROFILE: "3g.20gb"}, spec=ROUTED)
    assert "gives 42.9 % of the compute, less than the 50 % asked for" in refused(
        check_create(obj, SETTINGS, A100_AND_T4, ""))


def test_one_instance_per_pod_and_unknown_inventory() -> None:
    assert "a pod gets one MIG instance" in refused(decide({RESOURCE_GPU: "2"}))
    # no inventory seen yet: admitted with the usual warning (the scheduler checks again per GPU)
    unknown = decide({RESOURCE_GPU: "1", RESOURCE_CORES: "30"}, None)
    assert unknown.allowed and unknown.warnings
