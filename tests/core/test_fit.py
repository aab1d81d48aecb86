import numpy as np

from gpupool.core.fit import NO_CPU, NO_GPU_COUNT, NO_GPU_LARGE_ENOUGH, NO_GPU_SHARE, NO_MODEL, OK, check
from gpupool.core.model import Allocation, GPUGrant, GPURequest, PodRequest
from gpupool.core.state import ClusterState

from .helpers import node, set_free, share, whole


def test_share_fits_only_gpus_with_enough_compute() -> None:
    state = ClusterState([node("a", gpus=3)])
    set_free(state, "a", [1000, 400, 250])
    fit = check(state, share("p", 300))
    assert fit.code.tolist() == [OK]
    assert fit.gpu_fit[0].tolist() == [True, True, False]  # 250 < 300


def test_whole_gpus_need_fully_free_cards() -> None:
    state = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    set_free(state, "a", [1000, 999])
    fit = check(state, whole("p", 2))
    assert fit.code.tolist() == [NO_GPU_SHARE, OK]
    assert "needs 2 x a whole free GPU; 1 available" in fit.reason(0, whole("p", 2))


def test_cpu_memory_model_and_count_reasons() -> None:
    state = ClusterState([node("a", gpus=1, cpu=500), node("b", gpus=1, model="T4"), node("c", gpus=1)])
    pod = share("p", 100, cpu=1000, models=frozenset({"A100"}))
    fit = check(state, pod)
    assert fit.code.tolist() == [NO_CPU, NO_MODEL, OK]
    assert check(state, whole("q", 2, cpu=0)).code.tolist() == [NO_GPU_COUNT] * 3


def test_memory_dimension_is_checked_per_gpu() -> None:
    """A share larger than every GPU of a node says so (waiting will not help); one that would fit an
    empty GPU of the node, but finds none with that much free, is a plain shortage."""
    state = ClusterState([node("a", gpus=1, gpu_mem=16_000), node("b", gpus=2, gpu_mem=40_960)])
    big = PodRequest("p", 0, 0, GPURequest(1, 100, memory_mib=20_000))
    fit = check(state, big)
    assert fit.code.tolist() == [NO_GPU_LARGE_ENOUGH, OK]
    assert fit.reason(0, big) == "needs 1 x a GPU with 20000 MiB; no GPU of this node is that large"
    held = PodRequest("q", 0, 0, GPURequest(2, 100, memory_mib=30_000))
    grants = (GPUGrant("b-g0", 0, 100, 30_000), GPUGrant("b-g1", 1, 100, 30_000))
    assert state.allocate(held, Allocation("q", "b", grants)) is None
    assert check(state, big).code.tolist() == [NO_GPU_LARGE_ENOUGH, NO_GPU_SHARE]


def test_include_and_exclude_uuids() -> None:
    state = ClusterState([node("a", gpus=2)])
    only_second = PodRequest("p", 0, 0, GPURequest(1, 100, include_uuids=frozenset({"a-g1"})))
    assert check(state, only_second).gpu_fit[0].tolist() == [False, True]
    not_first = PodRequest("p", 0, 0, GPURequest(1, 100, exclude_uuids=frozenset({"a-g0"})))
    assert check(state, not_first).gpu_fit[0].tolist() == [False, True]


def test_impossible_request_rejected_everywhere_with_reason() -> None:
    state = ClusterState([node("a"), node("b")])
    pod = PodRequest("p", 0, -5, GPURequest(1, 1500))
    fit = check(state, pod)
    assert np.all(fit.code != OK)
    text = fit.reason(0, pod)
    assert "150 percent is outside 0-100 percent" in text and "negative" in text
