"""Every case of the fragment measure (trace-evaluation.md §3.4), on one node with GPUs free
[1000, 500, 200, 0] (idle total 1700 milli) and 10 free cores."""

import numpy as np
import pytest

from gpupool.core.frag import WorkloadArrays, cluster_fragmentation, typical_workload
from gpupool.core.model import GPURequest, PodRequest
from gpupool.core.policy import TaskShape
from gpupool.core.state import ClusterState

from .helpers import node, set_free


@pytest.fixture
def state() -> ClusterState:
    s = ClusterState([node("n", gpus=4, cpu=10_000, model="A")])
    set_free(s, "n", [1000, 500, 200, 0])
    return s


def frag_for(state: ClusterState, *tasks: TaskShape) -> float:
    return float(cluster_fragmentation(state, WorkloadArrays.build(state, tasks))[0])


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (TaskShape(1000, 0, 0), 1700),  # needs no GPU: all idle GPU is fragment
        (TaskShape(1000, 300, 1, frozenset({"X"})), 1700),  # model constraint excludes the node
        (TaskShape(1000, 1000, 2), 1700),  # Q2: only one fully free GPU for a 2-GPU task
        (TaskShape(20_000, 1000, 2), 1700),  # Q1: lacks both
        (TaskShape(20_000, 300, 1), 1700),  # Q4: GPU fits, CPU does not
        (TaskShape(1000, 300, 1), 200),  # Q3: only GPUs with < 300 free count: 200 + 0
        (TaskShape(1000, 1000, 1), 700),  # Q3, whole GPU: every partly used GPU: 500 + 200
        (TaskShape(1000, 300, 1, frozenset({"A"})), 200),  # constraint that admits the node
    ],
)
def test_fragment_cases(state: ClusterState, task: TaskShape, expected: int) -> None:
    assert frag_for(state, task) == pytest.approx(expected)


def test_weighted_sum_over_tasks(state: ClusterState) -> None:
    # 0.25 * 200 + 0.75 * 700 = 575
    tasks = (TaskShape(1000, 300, 1, weight=0.25), TaskShape(1000, 1000, 1, weight=0.75))
    assert frag_for(state, *tasks) == pytest.approx(575)


def test_typical_workload_takes_shapes_ten_at_a_time_until_95_percent() -> None:
    # 12 shapes: one with 100 pods, eleven with 1 pod each (total 111). The first 10 shapes cover
    # 109/111 = 98.2 % >= 95 %, so exactly 10 are kept and renormalised over 109 pods.
    pods = [PodRequest(f"big{i}", 1000, 0, GPURequest(1, 500)) for i in range(100)]
    pods += [PodRequest(f"s{i}", 2000 + i, 0, GPURequest(1, 500)) for i in range(11)]
    shapes = typical_workload(pods)
    assert len(shapes) == 10
    assert shapes[0].cpu_milli == 1000 and shapes[0].weight == pytest.approx(100 / 109)
    assert sum(s.weight for s in shapes) == pytest.approx(1.0)
    assert np.isclose(shapes[1].weight, 1 / 109)
