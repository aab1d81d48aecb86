"""Model-constrained trace variants: the asked share, only models that could host the pod, reproducible."""

from __future__ import annotations

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.constrain import constrain_models


def nodes() -> list[Node]:
    t4 = [Node(f"t{i}", 32_000, 128_000, tuple(GPU(f"t{i}-{j}", j, "T4", 16_384) for j in range(2))) for i in range(3)]
    g2 = [Node("g0", 96_000, 384_000, tuple(GPU(f"g0-{j}", j, "G2", 32_768) for j in range(8)))]
    return t4 + g2


def pods() -> list[PodRequest]:
    out = [PodRequest(f"s{k}", 4000, 1000, GPURequest(1, 500)) for k in range(30)]
    out += [PodRequest(f"w{k}", 8000, 1000, GPURequest(8)) for k in range(10)]  # only G2 nodes have 8 GPUs
    return out + [PodRequest(f"c{k}", 1000, 1000) for k in range(10)]  # no GPU: never constrained


def test_the_share_of_gpu_pods_named_and_only_models_that_can_host_them() -> None:
    out = constrain_models(pods(), nodes(), 0.5, seed=3)
    named = [p for p in out if p.gpu.models]
    assert len(named) == 20  # half of the 40 GPU pods
    assert all(p.gpu.models <= {"T4", "G2"} for p in named)
    assert all(p.gpu.models == {"G2"} for p in named if p.gpu.count == 8)
    assert not any(p.gpu.models for p in out if p.gpu.count == 0)
    assert [p.key for p in out] == [p.key for p in pods()]  # same pods, same order, same resources
    assert all((a.cpu_milli, a.gpu.count, a.gpu.milli) == (b.cpu_milli, b.gpu.count, b.gpu.milli)
               for a, b in zip(out, pods(), strict=True))


def test_same_seed_same_variant() -> None:
    a = constrain_models(pods(), nodes(), 0.33, seed=7)
    assert a == constrain_models(pods(), nodes(), 0.33, seed=7)
    assert a != constrain_models(pods(), nodes(), 0.33, seed=8)
