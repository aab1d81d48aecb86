"""Reading a pod's gpupool request: resources, annotations, and every error named."""

from typing import Any

import pytest

from gpupool.api.pod import parse_pod, wants_gpu


def pod(limits: dict[str, str], annotations: dict[str, str] | None = None, requests: dict[str, str] | None = None,
        extra_containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": limits, "requests": requests or {}}}
    return {
        "metadata": {"name": "p", "namespace": "team", "annotations": annotations or {}},
        "spec": {"containers": [container, *(extra_containers or [])]},
    }


def test_share_with_cores_memory_and_annotations() -> None:
    parsed = parse_pod(pod(
        {"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30", "gpupool.io/gpu-memory": "4096"},
        {"gpupool.io/gpu-model": "A100, H100", "gpupool.io/gpu-exclude": "GPU-1", "gpupool.io/policy": "fgd",
         "gpupool.io/isolation": "mps"},
        {"cpu": "500m", "memory": "2Gi"},
    ))
    assert parsed.errors == []
    r = parsed.request
    assert r is not None and r.key == "team/p" and r.cpu_milli == 500 and r.memory_mib == 2048
    assert (r.gpu.count, r.gpu.milli, r.gpu.memory_mib) == (1, 300, 4096)  # 30 % = 300 milli-GPU
    assert r.gpu.models == frozenset({"A100", "H100"}) and r.gpu.exclude_uuids == frozenset({"GPU-1"})
    assert r.policy == "fgd" and parsed.isolation == "mps" and parsed.container == "main"


def test_whole_gpus_and_memory_only_shares() -> None:
    whole = parse_pod(pod({"gpupool.io/gpu": "2"})).request
    assert whole is not None and whole.gpu.count == 2 and whole.gpu.whole
    mem_only = parse_pod(pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "8192"})).request
    # memory without cores: no fixed compute slice (1 milli), the memory is the hard part of the share
    assert mem_only is not None and mem_only.gpu.milli == 1 and mem_only.gpu.memory_mib == 8192


@pytest.mark.parametrize(
    ("limits", "annotations", "fragment"),
    [
        ({"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "150"}, {}, "gpu-cores=150 must be between 1 and 100"),
        ({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "-5"}, {}, "gpu-memory '-5': must not be negative"),
        ({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "500m"}, {}, "gpu-memory=0 must be a positive number"),
        ({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "12Q"}, {}, "gpu-memory '12Q': not a Kubernetes quantity"),
        ({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "1.5"}, {}, "a number of MiB must be whole"),
        ({"gpupool.io/gpu": "1.5"}, {}, "gpupool.io/gpu '1.5': must be a whole number"),
        ({"gpupool.io/gpu-cores": "30"}, {}, "need gpupool.io/gpu"),
        ({"gpupool.io/gpu": "0"}, {}, "must be at least 1"),
        ({"gpupool.io/gpu": "two"}, {}, "container main: gpupool.io/gpu 'two': not a Kubernetes quantity"),
        ({"gpupool.io/gpu": "2", "gpupool.io/gpu-cores": "50"}, {}, "can only be asked for with gpupool.io/gpu: 1"),
        ({"gpupool.io/gpu": "1"}, {"gpupool.io/isolation": "magic"}, "use one of mps, hook, mig, none"),
    ],
)
def test_bad_requests_are_named(limits: dict[str, str], annotations: dict[str, str], fragment: str) -> None:
    parsed = parse_pod(pod(limits, annotations))
    assert parsed.request is None
    assert any(fragment in e for e in parsed.errors), parsed.errors


def test_cpu_errors_are_named() -> None:
    bad_cpu = parse_pod(pod({"gpupool.io/gpu": "1"}, requests={"cpu": "lots"}))
    assert bad_cpu.request is None and "container main: cpu 'lots'" in bad_cpu.errors[0]


def test_pods_without_gpupool_resources() -> None:
    plain = pod({"cpu": "1"})
    assert not wants_gpu(plain)
    parsed = parse_pod(plain)
    assert parsed.request is not None and parsed.request.gpu.count == 0
