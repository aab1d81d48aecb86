"""The runtime a pod needs: the annotation gpupool.io/runtime, and what a pod that says nothing gets (api.pod
RUNTIME_DOC)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ANN_RUNTIME
from gpupool.api.pod import parse_pod, pod_runtime

GPU = {"gpupool.io/gpu": "1"}


def pod(limits: dict[str, str], annotations: dict[str, str] | None = None,
        init_limits: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "warm", "resources": {"limits": init_limits}}]
    return {"metadata": {"name": "p", "namespace": "team", "annotations": annotations or {}}, "spec": spec}


def runtime_of(p: dict[str, Any]) -> str | None:
    parsed = parse_pod(p)
    assert parsed.errors == [] and parsed.request is not None
    return parsed.request.gpu.runtime


@pytest.mark.parametrize("said", ["cuda", "rocm", "cann", "any", " ROCm "])
def test_the_annotation_is_the_runtime(said: str) -> None:
    assert runtime_of(pod(GPU, {ANN_RUNTIME: said})) == said.strip().lower()


def test_the_annotation_wins_over_what_resources_and_models_imply() -> None:
    assert runtime_of(pod({**GPU, "nvidia.com/gpu": "1"}, {ANN_RUNTIME: "any"})) == "any"
    assert runtime_of(pod(GPU, {ANN_RUNTIME: "rocm", "gpupool.io/gpu-model": "A100-80GB"})) == "rocm"


def test_an_unknown_runtime_is_an_error_that_names_the_annotation() -> None:
    parsed = parse_pod(pod(GPU, {ANN_RUNTIME: "dtk"}))
    assert parsed.request is None
    assert parsed.errors == ["annotation gpupool.io/runtime='dtk': use one of cuda, rocm, cann, any"]


def test_nothing_said_and_nothing_implied_is_any_card() -> None:
    assert runtime_of(pod(GPU)) is None
    assert runtime_of(pod(GPU, {ANN_RUNTIME: "  "})) is None  # blank = not said


@pytest.mark.parametrize(("resource", "runtime"), [
    ("nvidia.com/gpu", "cuda"), ("amd.com/gpu", "rocm"), ("huawei.com/Ascend910", "cann"),
    ("huawei.com/Ascend310P", "cann"),
])
def test_a_vendor_resource_implies_its_runtime(resource: str, runtime: str) -> None:
    assert runtime_of(pod({**GPU, resource: "1"})) == runtime
    # In an init container too: the pod's image set needs the vendor's runtime all the same.
    assert runtime_of(pod(GPU, init_limits={resource: "1"})) == runtime


def test_resources_of_two_vendors_imply_nothing() -> None:
    assert runtime_of(pod({**GPU, "nvidia.com/gpu": "1", "amd.com/gpu": "1"})) is None


@pytest.mark.parametrize(("models", "runtime"), [
    ("A100-80GB", "cuda"), ("A100-80GB, H100-80GB", "cuda"), ("MI300X,MI325X", "rocm"), ("Ascend910B", "cann"),
    ("A100-80GB,MI300X", None),  # two vendors: the pod may use either, by its models
    ("A100-80GB,G2", None),  # a model gpupool has no catalogue row for: no guess
])
def test_models_of_one_known_vendor_imply_its_runtime(models: str, runtime: str | None) -> None:
    assert runtime_of(pod(GPU, {"gpupool.io/gpu-model": models})) == runtime


def test_a_vendor_resource_wins_over_models() -> None:
    assert runtime_of(pod({**GPU, "amd.com/gpu": "1"}, {"gpupool.io/gpu-model": "A100-80GB"})) == "rocm"


def test_pod_runtime_collects_the_error_without_raising() -> None:
    errors: list[str] = []
    assert pod_runtime(pod(GPU, {ANN_RUNTIME: "opencl"}), errors) is None
    assert len(errors) == 1 and "gpupool.io/runtime='opencl'" in errors[0]


def test_a_pod_without_gpupool_resources_keeps_its_runtime_for_its_claims() -> None:
    parsed = parse_pod({"metadata": {"name": "c", "annotations": {ANN_RUNTIME: "rocm"}},
                        "spec": {"containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]}})
    assert parsed.request is not None and parsed.request.gpu.count == 0 and parsed.request.gpu.runtime == "rocm"
