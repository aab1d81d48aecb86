"""What-if on a tiny trace: one node with 2 A100-40GB GPUs (capacity 2000 milli-GPU)."""

from __future__ import annotations

import pytest

from gpupool.core.mig_whatif import what_if
from gpupool.core.model import GPURequest, PodRequest


def pods(milli: int, n: int) -> list[PodRequest]:
    return [PodRequest(key=f"p{i}", gpu=GPURequest(count=1, milli=milli)) for i in range(n)]


def test_quarter_gpu_pods() -> None:
    # 4 pods of 250 milli; arrivals cycle them until 2000 arrived: 8 pods.
    # whole: one pod per GPU -> 2 placed, 500 of 2000 asked -> 75 % unallocated; 4 pods need 4 GPUs.
    # mig: 25 % needs 2 compute slices (2/7 = 28.6 %) -> 2g.10gb, three per GPU (starts 0, 2, 4):
    #      6 placed, 1500 asked -> 25 %; 4 pods need 2 GPUs (3 + 1).
    # hook: 4 per GPU -> all 8 placed -> 0 %; 4 pods need 1 GPU.
    rows = {r.isolation: r for r in what_if([2], pods(250, 4), "A100-40GB")}
    assert (rows["whole"].unallocated_pct, rows["whole"].gpus_needed, rows["whole"].placed) == (75.0, 4, 2)
    assert (rows["mig"].unallocated_pct, rows["mig"].gpus_needed, rows["mig"].placed) == (25.0, 2, 6)
    assert (rows["hook"].unallocated_pct, rows["hook"].gpus_needed, rows["hook"].dropped) == (0.0, 1, 0)


def test_half_gpu_pods_need_a_4g_on_mig() -> None:
    # 50 % > 3/7 = 42.9 %, so each pod needs 4g.20gb, of which a GPU holds one: MIG is no better than whole
    rows = {r.isolation: r for r in what_if([2], pods(500, 2), "A100-40GB", ("mig", "hook"))}
    assert (rows["mig"].unallocated_pct, rows["mig"].gpus_needed) == (50.0, 2)
    assert (rows["hook"].unallocated_pct, rows["hook"].gpus_needed) == (0.0, 1)


def test_multi_gpu_pods_need_empty_gpus_on_one_node() -> None:
    two = [PodRequest(key="big", gpu=GPURequest(count=2, milli=1000))]
    # two nodes of one GPU each: a 2-GPU pod fits on neither, so nothing is placed
    rows = what_if([1, 1], two, "H100-80GB", ("mig",))
    assert (rows[0].placed, rows[0].unallocated_pct, rows[0].gpus_needed) == (0, 100.0, 2)


def test_churn_reports_a_steady_state_figure() -> None:
    rows = what_if([2], pods(250, 4), "A100-40GB", ("mig",), churn=20)
    # every departure frees a 2g and the next 250-milli pod takes it again: stays at 25 %
    assert rows[0].churn_unallocated_pct == pytest.approx(25.0)


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown GPU model"):
        what_if([2], pods(250, 1), "T4")
    with pytest.raises(ValueError, match="unknown isolation"):
        what_if([2], pods(250, 1), "A100-40GB", ("mps",))
    with pytest.raises(ValueError, match="no GPUs"):
        what_if([], pods(250, 1), "A100-40GB")
