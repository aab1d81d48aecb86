"""The scheduling framework: plugins at their extension points, in profile order, and what each status code
does to the extender's answer."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel

from gpupool.api.extender import ExtenderArgs
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import (
    BindPlugin,
    FilterPlugin,
    Handle,
    PermitPlugin,
    PostFilterPlugin,
    PreFilterPlugin,
    ReservePlugin,
    ScorePlugin,
    UnreservePlugin,
)
from gpupool.scheduler.framework.registry import PROFILE, REGISTRY, build_plugins
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.framework.status import SUCCESS, Code, Status, error
from tests.scheduler.conftest import bind_args, gpu_pod, started_service

NAMES = ["gpu-0000", "gpu-0001"]


class NoArgs(BaseModel):
    pass


class OddNodesOnly:
    """A plugin a later issue might add: a Filter that rejects every other node."""

    name: ClassVar[str] = "odd_nodes_only"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: NoArgs) -> None:
        pass

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        bad = nodes.nodes() % 2 == 0
        nodes.reject(bad, ["even node"] * int(bad.sum()), Code.UNSCHEDULABLE)


class Broken:
    name: ClassVar[str] = "broken"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: NoArgs) -> None:
        pass

    def pre_filter(self, cycle: CycleState) -> Status:
        return error("the queue cache is not synced")


POINTS = {"PreFilter": PreFilterPlugin, "Filter": FilterPlugin, "PostFilter": PostFilterPlugin,
          "Score": ScorePlugin, "Reserve": ReservePlugin, "Unreserve": UnreservePlugin, "Permit": PermitPlugin,
          "Bind": BindPlugin}


async def test_the_default_plugins_take_part_where_docs_scheduler_md_says():
    svc = await started_service(nodes=1)
    plugins = {p.name: p for p in build_plugins(svc.handle)}
    expected = {
        "scheduler_name": {"PreFilter"}, "pod_pending": {"PreFilter"}, "gpu_request": {"PreFilter"},
        "node_exists": {"Filter"}, "gpu_node": {"Filter"}, "gpu_fit": {"Filter"}, "shares_per_gpu": {"Filter"},
        "pending_note": {"PostFilter"}, "policy_score": {"Score"}, "busy_nodes": {"Score"},
        "nominate": {"PreFilter", "Reserve", "Unreserve"}, "node_lock": {"Permit", "Unreserve"},
        "binding": {"Bind"},
    }
    assert set(expected) <= set(PROFILE) <= set(REGISTRY)
    for name, points in expected.items():
        assert {k for k, proto in POINTS.items() if isinstance(plugins[name], proto)} == points, name
    order = [n for n in PROFILE if n in expected]  # the order at each extension point is the profile's
    assert order.index("gpu_request") < order.index("nominate")
    assert order.index("node_exists") < order.index("gpu_node") < order.index("gpu_fit") < order.index("shares_per_gpu")
    await svc.stop()


async def test_a_new_filter_plugin_is_a_module_and_a_profile_entry():
    # Filter's answer with every feasible node (not only the pick).
    svc = await started_service(nodes=2, config=SchedulerConfig(leader_elect=False, decide_in_filter=False))
    plugins = build_plugins(svc.handle)
    gpu_fit = next(i for i, p in enumerate(plugins) if p.name == "gpu_fit")
    plugins.insert(gpu_fit + 1, OddNodesOnly(svc.handle, NoArgs()))
    svc.extender.fw = Framework(svc.handle, plugins)
    pod = await svc.cluster.create_pod(gpu_pod("p", cores=20))
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert answer.NodeNames == ["gpu-0001"]
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))  # reasons come when none is left
    assert answer.NodeNames == [] and answer.FailedNodes == {"gpu-0000": "even node"}
    # The binding cycle runs the same filters: a bind to the rejected node is refused with the reason.
    error_text = (await svc.bind(bind_args(pod, "gpu-0000"))).Error
    assert error_text == "pod default/p does not fit on gpu-0000: even node"
    assert np.all(svc.ledger.state.gpu_milli_free[0] == 1000)  # nothing was reserved there
    await svc.stop()


async def test_an_error_status_is_the_extenders_error_and_reserves_nothing():
    svc = await started_service(nodes=2)
    plugins = build_plugins(svc.handle)
    svc.extender.fw = Framework(svc.handle, [Broken(svc.handle, NoArgs()), *plugins])
    pod = await svc.cluster.create_pod(gpu_pod("p", cores=20))
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert answer.Error == "the queue cache is not synced" and answer.NodeNames == []
    assert await svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=NAMES)) == []
    assert "the queue cache is not synced" in (await svc.bind(bind_args(pod))).Error
    assert svc.ledger.entries == {} and svc.cluster.bindings == 0
    await svc.stop()


def test_success_and_skip_are_not_rejections():
    assert SUCCESS.ok and not SUCCESS.rejected
    assert Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "x").rejected
    assert Status(Code.SKIP).code == Code.SKIP and not Status(Code.SKIP).ok
