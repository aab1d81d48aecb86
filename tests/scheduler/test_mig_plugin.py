"""The `mig_placement` Filter/Score on its own: nodes with MIG GPUs (A100-40GB geometry), pods with
isolation mig."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from gpupool.api.pod import ParsedPod
from gpupool.core.mig_placement import MigGPU, MigInstance
from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.scheduler.framework.cycle import CycleState, NodeSet, Phase
from gpupool.scheduler.framework.plugins.mig import Args, MigPlacement
from gpupool.scheduler.mig_layouts import MigLayouts, MigState

NODES = [Node(f"n{i}", 64000, 262144, (GPU(f"GPU-{i}", 0, "A100-40GB", 40960),)) for i in range(3)]


def plugin(layouts: MigLayouts) -> tuple[MigPlacement, ClusterState]:
    state = ClusterState(NODES)
    mig_gpu = np.array([[g.uuid in layouts.nodes.get(n.name, {}) for g in n.gpus] for n in NODES], dtype=bool)
    mig = MigState()
    mig.layouts, mig.gpu, mig.node = layouts, mig_gpu, mig_gpu.any(axis=1)
    handle: Any = SimpleNamespace(ledger=SimpleNamespace(state=state))
    return MigPlacement(handle, Args(), mig), state


def cycle(request: GPURequest, isolation: str = "mig", profile: str | None = None) -> CycleState:
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1",
                        "annotations": {"gpupool.io/mig-profile": profile} if profile else {}}}
    req = PodRequest(key="default/p", gpu=request)
    return CycleState(pod=pod, phase=Phase.FILTER, uid="u1", key="default/p", now=0.0,
                      parsed=ParsedPod(req, isolation), request=req)


def test_filter_keeps_nodes_with_room_and_says_why_for_the_others() -> None:
    layouts = MigLayouts()
    layouts.set_node("n0", {"GPU-0": MigGPU("A100-40GB", (MigInstance("7g.40gb", 0, True),))})  # full
    layouts.set_node("n1", {"GPU-1": MigGPU("A100-40GB", (MigInstance("3g.20gb", 0, True),))})
    p, state = plugin(layouts)  # n2: no MIG GPU known
    c = cycle(GPURequest(count=1, milli=250))  # 25 % -> 2g.10gb (2/7 = 28.6 %)
    nodes = NodeSet(["n0", "n1", "n2"], state.index)
    p.filter(c, nodes)
    assert nodes.alive_names() == ["n1"]
    assert nodes.failed == {"n0": "no GPU has an idle 2g.10gb instance or free slices at an allowed start for one",
                            "n2": "no GPU in MIG mode"}
    # on n1 slots 4-7 are free; 2g can start at 4 only
    assert c.data["mig_placement"][1].choice.option.start == 4


def test_score_prefers_the_node_where_the_instance_spoils_least() -> None:
    layouts = MigLayouts()
    layouts.set_node("n0", {"GPU-0": MigGPU("A100-40GB")})  # empty: a 3g here spoils a future 7g
    layouts.set_node("n1", {"GPU-1": MigGPU("A100-40GB", (MigInstance("4g.20gb", 0, True),))})
    layouts.asked.update({"7g.40gb": 1, "3g.20gb": 1})
    p, state = plugin(layouts)
    c = cycle(GPURequest(count=1, milli=1000, memory_mib=15000), profile="3g.20gb")
    nodes = NodeSet(["n0", "n1"], state.index)
    p.filter(c, nodes)
    scores = p.score(c, nodes.nodes()).values
    assert scores is not None and scores[1] > scores[0]


def test_pods_without_mig_isolation_and_bad_profiles() -> None:
    layouts = MigLayouts()
    layouts.set_node("n0", {"GPU-0": MigGPU("A100-40GB")})
    p, state = plugin(layouts)
    c = cycle(GPURequest(count=1, milli=500), isolation="hook")
    nodes = NodeSet(["n0"], state.index)
    p.filter(c, nodes)
    assert nodes.alive_names() == ["n0"] and p.score(c, nodes.nodes()).values is None
    c = cycle(GPURequest(count=1, milli=500), profile="3g.40gb")  # an H100 profile on an A100 node
    p.filter(c, nodes)
    assert "does not exist on A100-40GB" in nodes.failed["n0"]
