"""The `mig_placement` Filter/Score placing AMD partitions and Ascend vNPUs (issue 40): cards in partition mode
are reported like MIG GPUs, and the plugin plans them with their vendor's geometry (gpupool.core.partitions)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from gpupool.api.pod import ParsedPod
from gpupool.core.mig_placement import MigGPU, MigInstance
from gpupool.core.model import GPU, GPURequest, MigSlot, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.scheduler.framework.cycle import CycleState, NodeSet, Phase
from gpupool.scheduler.framework.plugins.mig import Args, MigPlacement, mig_allocation
from gpupool.scheduler.mig_layouts import MigLayouts, MigState

MI300X_MIB = 196_592


def plugin(layouts: MigLayouts, nodes: list[Node]) -> tuple[MigPlacement, ClusterState]:
    state = ClusterState(nodes)
    mig_gpu = np.array([[g.uuid in layouts.nodes.get(n.name, {}) for g in n.gpus] for n in nodes], dtype=bool)
    mig = MigState()
    mig.layouts, mig.gpu, mig.node = layouts, mig_gpu, np.asarray(mig_gpu.any(axis=1), dtype=bool)
    handle: Any = SimpleNamespace(ledger=SimpleNamespace(state=state))
    return MigPlacement(handle, Args(), mig), state


def cycle(request: GPURequest, profile: str | None = None) -> CycleState:
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1",
                        "annotations": {"gpupool.io/mig-profile": profile} if profile else {}}}
    req = PodRequest(key="default/p", gpu=request)
    return CycleState(pod=pod, phase=Phase.FILTER, uid="u1", key="default/p", now=0.0,
                      parsed=ParsedPod(req, "mig"), request=req)


def amd_nodes() -> tuple[MigPlacement, ClusterState, list[str]]:
    """n0: QPX/NPS1 with XCCs 0-1 in use; n1: CPX/NPS4 with XCC 0 in use and XCC 1 idle; n2: an idle card."""
    nodes = [Node(f"n{i}", 64000, 262144, (GPU(f"A-{i}", 0, "MI300X", MI300X_MIB),)) for i in range(3)]
    layouts = MigLayouts()
    layouts.set_node("n0", {"A-0": MigGPU("MI300X", (MigInstance("QPX/NPS1", 0, True),
                                                      MigInstance("QPX/NPS1", 2, False)))})
    layouts.set_node("n1", {"A-1": MigGPU("MI300X", (MigInstance("CPX/NPS4", 0, True),
                                                      MigInstance("CPX/NPS4", 1, False)))})
    layouts.set_node("n2", {"A-2": MigGPU("MI300X")})
    p, state = plugin(layouts, nodes)
    return p, state, ["n0", "n1", "n2"]


def test_a_cpx_claim_lands_on_a_card_in_cpx_or_an_idle_one_never_beside_another_mode_in_use() -> None:
    p, state, names = amd_nodes()
    c = cycle(GPURequest(count=1, milli=1000), profile="CPX/NPS4")
    nodes = NodeSet(names, state.index)
    p.filter(c, nodes)
    assert nodes.alive_names() == ["n1", "n2"]
    assert nodes.failed == {"n0": "no card has an idle CPX/NPS4 partition or room for a new one"}
    chosen = c.data["mig_placement"]
    assert (chosen[1].choice.option.start, chosen[1].choice.option.reuse) == (1, True)  # the idle one is taken
    assert (chosen[2].choice.option.start, chosen[2].choice.option.reuse) == (0, False)
    allocation = mig_allocation(c, 1, "n1")
    assert allocation is not None
    (grant,) = allocation.grants
    # 38 of 304 CUs: 125 milli; 196,592 MiB // 8 = 24,574 MiB
    assert (grant.uuid, grant.milli, grant.memory_mib, grant.mig) == ("A-1", 125, 24_574, MigSlot("CPX/NPS4", 1))


def test_the_card_already_cut_wins_where_cutting_an_idle_one_spoils_the_whole_card_demand() -> None:
    p, state, names = amd_nodes()
    p.layouts.asked.update({"SPX/NPS1": 3})  # what pods hold: whole-card partitions
    c = cycle(GPURequest(count=1, milli=1000), profile="CPX/NPS4")
    nodes = NodeSet(names, state.index)
    p.filter(c, nodes)
    scores = p.score(c, nodes.nodes()).values
    assert scores is not None
    # n1 (index 1): 7 idle XCCs no SPX can use before, 6 after -> -1; n2 (index 2): 0 before, 7 after -> +7
    assert [c.data["mig_placement"][i].choice.fragment_delta for i in (1, 2)] == [-1.0, 7.0]
    assert nodes.alive_names() == ["n1", "n2"] and scores[0] > scores[1]


def test_an_unnamed_request_gets_the_smallest_partition_that_holds_it_and_ascend_templates_place() -> None:
    nodes = [Node("a", 64000, 262144, (GPU("H-0", 0, "Ascend910B", 65_536),))]
    layouts = MigLayouts()
    layouts.set_node("a", {"H-0": MigGPU("Ascend910B", (MigInstance("vir16", 0, True),))})
    p, state = plugin(layouts, nodes)
    c = cycle(GPURequest(count=1, milli=200, memory_mib=8000))  # 20 % and 8,000 MiB: vir08 (26.7 %, 17,476 MiB)
    nodes_set = NodeSet(["a"], state.index)
    p.filter(c, nodes_set)
    option = c.data["mig_placement"][0].choice.option
    assert (option.profile, option.start, option.reuse) == ("vir08", 1, False)
    big = cycle(GPURequest(count=1, milli=1000), profile="vir16")  # 16 of 30 AI Cores held: no second vir16
    p.filter(big, nodes_set := NodeSet(["a"], state.index))
    assert nodes_set.failed == {"a": "no card has an idle vir16 partition or room for a new one"}
    wrong = cycle(GPURequest(count=1, milli=1000), profile="CPX/NPS4")
    p.filter(wrong, nodes_set := NodeSet(["a"], state.index))
    assert "partition profile 'CPX/NPS4' does not exist on Ascend910B" in nodes_set.failed["a"]
