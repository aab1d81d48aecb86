"""Admission of pods by the runtime they need (gpupool.io/runtime): impossible combinations are refused with
one clear message each, everything else is admitted as before."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ANN_ISOLATION, ANN_MODEL, ANN_RUNTIME, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.webhook.admission import Decision, Settings, check_create
from gpupool.webhook.inventory import Limits
from tests.webhook.helpers import pod

SETTINGS = Settings()
ROUTED = {"schedulerName": "gpupool-scheduler"}
MIXED = Limits(196608, {"A100-80GB": 81920, "MI300X": 196608, "Ascend910B": 65536}, 8)
WHOLE = {RESOURCE_GPU: "1", RESOURCE_CORES: "100"}
SHARE = {RESOURCE_GPU: "1", RESOURCE_CORES: "30", RESOURCE_MEMORY: "8192"}


def decide(resources: dict[str, str], annotations: dict[str, str], settings: Settings = SETTINGS) -> Decision:
    obj: dict[str, Any] = pod(resources, annotations=annotations, spec=ROUTED)
    return check_create(obj, settings, MIXED, "alice")


def refused(decision: Decision) -> str:
    assert not decision.allowed and decision.code == 422, decision
    return decision.message


@pytest.mark.parametrize("runtime", ["cuda", "rocm", "cann", "any"])
def test_whole_cards_of_every_runtime_are_admitted(runtime: str) -> None:
    assert decide(WHOLE, {ANN_RUNTIME: runtime, ANN_ISOLATION: "hook"}).allowed


@pytest.mark.parametrize("runtime", ["cuda", "rocm", "any"])
def test_shares_under_hook_are_admitted_where_a_cap_exists(runtime: str) -> None:
    assert decide(SHARE, {ANN_RUNTIME: runtime, ANN_ISOLATION: "hook"}).allowed


def test_rocm_with_an_nvidia_resource_is_refused() -> None:
    message = refused(decide({**WHOLE, "nvidia.com/gpu": "1"}, {ANN_RUNTIME: "rocm"}))
    assert message == ("gpupool refused pod ml/train: annotation gpupool.io/runtime=rocm: the pod asks for "
                       "nvidia.com/gpu, whose cards run cuda, not rocm")


def test_cuda_with_an_ascend_resource_is_refused() -> None:
    assert "huawei.com/Ascend910, whose cards run cann, not cuda" in refused(
        decide({**WHOLE, "huawei.com/Ascend910": "1"}, {ANN_RUNTIME: "cuda"}))


def test_any_goes_with_every_vendor_resource() -> None:
    assert decide({**WHOLE, "amd.com/gpu": "1"}, {ANN_RUNTIME: "any"}).allowed


def test_rocm_with_only_nvidia_models_is_refused_with_each_models_runtime() -> None:
    message = refused(decide(WHOLE, {ANN_RUNTIME: "rocm", ANN_MODEL: "A100-80GB,H100-80GB"}))
    assert message.endswith("annotation gpupool.io/runtime=rocm: no GPU model gpupool.io/gpu-model names runs "
                            "rocm (A100-80GB runs cuda, H100-80GB runs cuda)")


def test_models_of_which_one_runs_the_runtime_are_admitted() -> None:
    assert decide(WHOLE, {ANN_RUNTIME: "rocm", ANN_MODEL: "A100-80GB,MI300X"}).allowed


def test_an_uncatalogued_model_is_left_to_placement() -> None:
    # G2 has no catalogue row: whether it runs rocm is unknown here, so the webhook does not refuse.
    assert decide(WHOLE, {ANN_RUNTIME: "rocm", ANN_MODEL: "G2"}).allowed


@pytest.mark.parametrize("runtime", ["rocm", "cann"])
def test_mps_is_refused_off_nvidia(runtime: str) -> None:
    message = refused(decide(WHOLE, {ANN_RUNTIME: runtime, ANN_ISOLATION: "mps"}))
    assert (f"annotation gpupool.io/runtime={runtime} with gpupool.io/isolation=mps: MPS is NVIDIA's and runs "
            "CUDA programs on NVIDIA cards only") in message


def test_mps_with_any_is_refused_and_says_what_to_do() -> None:
    assert "say runtime cuda for a pod that needs MPS" in refused(
        decide(SHARE, {ANN_RUNTIME: "any", ANN_ISOLATION: "mps"}))
    assert decide(SHARE, {ANN_RUNTIME: "cuda", ANN_ISOLATION: "mps"}).allowed


def test_mps_with_nothing_said_is_admitted_as_before() -> None:
    assert decide(SHARE, {ANN_ISOLATION: "mps"}).allowed


@pytest.mark.parametrize("share", [
    {RESOURCE_GPU: "1", RESOURCE_CORES: "50"},
    {RESOURCE_GPU: "1", RESOURCE_MEMORY: "16384"},
])
@pytest.mark.parametrize("isolation", ["hook", "none"])
def test_a_share_of_an_ascend_card_is_refused(share: dict[str, str], isolation: str) -> None:
    # A namespace whose policy allows isolation none, so that only the share is refused.
    allows_none = Settings(default_isolation="none")
    message = refused(decide(share, {ANN_RUNTIME: "cann", ANN_ISOLATION: isolation}, allows_none))
    assert message.endswith("annotation gpupool.io/runtime=cann with a share of a card (gpupool.io/gpu-cores/"
                            "gpupool.io/gpu-memory): Ascend cards are not shared by gpupool; ask for whole cards "
                            "or a vNPU partition")


def test_an_implied_runtime_is_named_as_implied() -> None:
    message = refused(decide({**SHARE, "huawei.com/Ascend910": "1"}, {ANN_ISOLATION: "hook"}))
    assert "runtime cann with a share of a card" in message and "annotation gpupool.io/runtime" not in message


def test_every_problem_is_in_the_one_message() -> None:
    message = refused(decide({**SHARE, "nvidia.com/gpu": "1"}, {ANN_RUNTIME: "cann", ANN_ISOLATION: "mps"}))
    assert "nvidia.com/gpu" in message and "MPS is NVIDIA's" in message and "not shared by gpupool" in message


def test_an_unknown_runtime_is_refused_by_the_reader() -> None:
    assert "annotation gpupool.io/runtime='opencl': use one of cuda, rocm, cann, any" in refused(
        decide(WHOLE, {ANN_RUNTIME: "opencl"}))


@pytest.mark.parametrize("annotations", [{ANN_RUNTIME: "any", ANN_ISOLATION: "hook"}, {ANN_ISOLATION: "hook"}, {}])
def test_an_any_or_unsaid_share_is_admitted_and_left_to_placement(annotations: dict[str, str]) -> None:
    """Such a share may run on NVIDIA or AMD cards; placement keeps it off the Ascend ones (core.fit: a share only
    on cards whose vendor holds its mode), so there is nothing to refuse here."""
    assert decide(SHARE, annotations).allowed


def test_a_cann_share_is_refused_once_whatever_its_isolation() -> None:
    for isolation in ("hook", "mps"):
        message = refused(decide(SHARE, {ANN_RUNTIME: "cann", ANN_ISOLATION: isolation}))
        assert message.count("Ascend cards are not shared by gpupool") == 1, message
