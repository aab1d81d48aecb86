"""`unallocated_pct`: the simulator's headline figure for one policy, on a hand-built workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.policies import UnknownPolicy
from gpupool.sim.replay import setup
from gpupool.sim.trace import load_nodes, load_pods
from gpupool.sim.unallocated import DEFAULT_SEEDS, unallocated_pct

# Two nodes of one GPU; two half-GPU shares and one whole-GPU pod: exactly the cluster's capacity (2,000 milli).
NODES = "sn,cpu_milli,memory_mib,gpu,model\na,16000,64000,1,T4\nb,16000,64000,1,T4\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "s1,1000,1000,1,500\ns2,1000,1000,1,500\nw,1000,1000,1,1000\n")


@pytest.fixture()
def workload(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def test_spreading_shares_strands_the_whole_gpu_pod(workload: tuple[Path, Path]) -> None:
    """By hand, for each order the protocol can submit the three pods in (arrived after the third pod is
    100 %, so the figure is what the third pod leaves; a top-up copy, if any, comes after at 125 %):

    - s, s, w under dra-default: the first share goes to either node (equal scores); the second to the other
      node, whose CPU and memory are emptier: cpu (16000-1000)*100//16000 = 93 and memory 63000*100//64000 = 98
      give LeastAllocated 95 and BalancedAllocation trunc((1 - |.0625 - .015625|/2)*100) = 97, 192 in all,
      against 87, 96 -> 91 and 95, 186 on the node that has the first share. Both GPUs are half used and the
      whole-GPU pod fits nowhere: 1,000 of 2,000 milli allocated, 50 % unallocated.
    - any other order: the whole GPU arrives while a GPU is still free and every later share has only one
      place to go: everything fits, 0 %.
    - gpupool puts the second share on the half-used GPU (FGD's fragment of a whole-GPU workload is smallest
      there), so w always finds a free GPU: 0 % in every order.
    """
    nodes_csv, pods_csv = workload
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    # Which seeds submit both shares before the whole GPU: the protocol's own seeded shuffle decides.
    stranded = [s for s in DEFAULT_SEEDS if [p.key[0] for p in setup(nodes, pods, s).submitted[:3]] == ["s", "s", "w"]]
    assert 0 < len(stranded) < len(DEFAULT_SEEDS)  # both cases occur among the seeds, or the test would say little
    dra = unallocated_pct("dra-default", str(pods_csv), nodes=nodes_csv, workers=1)
    ours = unallocated_pct("gpupool", str(pods_csv), nodes=nodes_csv, workers=1)
    assert dra == pytest.approx(50.0 * len(stranded) / len(DEFAULT_SEEDS), abs=1e-4)
    assert ours == 0.0
    assert dra > ours


def test_one_seed_is_that_seeds_replay(workload: tuple[Path, Path]) -> None:
    nodes_csv, pods_csv = workload
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    for seed in range(42, 48):
        order = [p.key[0] for p in setup(nodes, pods, seed).submitted[:3]]
        expected = 50.0 if order == ["s", "s", "w"] else 0.0
        assert unallocated_pct("dra-default", str(pods_csv), nodes=nodes_csv, seeds=[seed], workers=1) == expected


def test_bad_arguments_are_refused(workload: tuple[Path, Path]) -> None:
    nodes_csv, pods_csv = workload
    with pytest.raises(UnknownPolicy):
        unallocated_pct("kube-default", str(pods_csv), nodes=nodes_csv)
    with pytest.raises(ValueError, match="no seeds"):
        unallocated_pct("gpupool", str(pods_csv), nodes=nodes_csv, seeds=[])
