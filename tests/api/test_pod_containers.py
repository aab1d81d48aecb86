"""The pod reader's container walk (gpupool.api.pod.containers), shared by the scheduler, the node agent
(which container kubelet's Allocate is for) and the webhook (which spec path a patch names)."""

from __future__ import annotations

import pytest

from gpupool.api.names import RESOURCE_CORES, RESOURCE_GPU
from gpupool.api.pod import (
    APP,
    INIT,
    SIDECAR,
    Container,
    annotation_set,
    containers,
    gpu_count,
    gpupool_resources,
    pod_annotations,
)
from gpupool.api.quantity import QuantityError


def test_containers_come_in_start_order_with_their_place_in_the_spec() -> None:
    init = {"name": "setup"}
    sidecar = {"name": "proxy", "restartPolicy": "Always"}
    app = {"name": "main"}
    pod = {"spec": {"containers": ["junk", app], "initContainers": [init, sidecar]}}
    assert containers(pod) == [
        Container("setup", INIT, "initContainers", 0, init),
        Container("proxy", SIDECAR, "initContainers", 1, sidecar),
        Container("main", APP, "containers", 1, app),  # index 1: a patch must name spec.containers[1]
    ]
    assert containers({}) == [] and containers({"spec": None}) == []


@pytest.mark.parametrize(
    ("resources", "count"),
    [
        ({}, None),
        ({"limits": {"cpu": "1"}}, None),
        ({"limits": {RESOURCE_GPU: "2"}}, 2),
        ({"requests": {RESOURCE_GPU: "1"}}, 1),  # a request alone counts
        ({"requests": {RESOURCE_GPU: "1"}, "limits": {RESOURCE_GPU: 3}}, 3),  # the limit is authoritative
        ({"limits": {RESOURCE_GPU: "1e1"}}, 10),
        ({"limits": "not an object"}, None),
    ],
)
def test_gpu_count(resources: dict[str, object], count: int | None) -> None:
    (c,) = containers({"spec": {"containers": [{"name": "c", "resources": resources}]}})
    assert gpu_count(c) == count


def test_an_unreadable_count_says_what() -> None:
    (c,) = containers({"spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE_GPU: "1.5"}}}]}})
    with pytest.raises(QuantityError, match=RESOURCE_GPU):
        gpu_count(c)


def test_only_gpupool_resources_are_read() -> None:
    body = {"resources": {"requests": {"cpu": "1", RESOURCE_CORES: "30"}, "limits": {RESOURCE_GPU: "1"}}}
    assert gpupool_resources(body) == {RESOURCE_CORES: "30", RESOURCE_GPU: "1"}


def test_annotations() -> None:
    pod = {"metadata": {"annotations": {"a": " x, ,y ,x", "blank": ""}}}
    assert pod_annotations(pod) == {"a": " x, ,y ,x", "blank": ""}
    assert pod_annotations({"metadata": None}) == {}
    assert annotation_set(pod_annotations(pod), "a") == {"x", "y"}
    assert annotation_set(pod_annotations(pod), "blank") == frozenset() == annotation_set({}, "missing")
