"""Filter `mps_ready`: an isolation-mps pod that shares GPUs goes only to GPUs whose MPS daemon is up in
the node's inventory (the agent refuses it elsewhere); the reason shows in the filter answer and the pending
message. Driven through the extender service's verbs over an in-memory cluster."""

from __future__ import annotations

import asyncio
import json

from gpupool.api.extender import ExtenderArgs
from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.core.model import GPU
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, gpu_pod

MPS = {"gpupool.io/isolation": "mps"}
# Per node, the MPS state of its two GPUs ("" = the agent runs no daemon).
STATES = {"both-up": ("up", "up"), "one-down": ("up", "down"), "none": ("", ""), "down": ("", "down")}


def inventory(node: str, states: tuple[str, str]) -> str:
    gpus = [GPU(uuid=f"GPU-{node}-{i}", index=i, model="A100-80GB", memory_mib=81920) for i in range(2)]
    return encode_inventory(node, gpus, 10, extra={i: {"mps": s} for i, s in enumerate(states) if s})


async def service() -> ExtenderService:
    cluster = MemoryCluster()
    for name, states in STATES.items():
        await cluster.create_node({
            "metadata": {"name": name, "annotations": {ANN_INVENTORY: inventory(name, states)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}},
        })
    # Filter's answer lists every node that may take the pod (not only the pick) for these tests to read.
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, decide_in_filter=False))
    await svc.start()
    return svc


async def test_mps_shares_go_only_to_gpus_with_a_daemon_up_and_say_why() -> None:
    svc = await service()
    try:
        one = await svc.cluster.create_pod(gpu_pod("one", cores=25, annotations=MPS))
        answer = await svc.filter(ExtenderArgs(Pod=one, NodeNames=["both-up", "one-down", "none"]))
        assert sorted(answer.NodeNames or []) == ["both-up", "one-down"]
        answer = await svc.filter(ExtenderArgs(Pod=one, NodeNames=["none"]))  # reasons come when none is left
        assert answer.FailedNodes == {"none": "isolation mps needs 1 GPU(s) with a running MPS daemon, 0 fit "
                                               "(GPU 0, 1: no MPS daemon (the node's agent runs none))"}
        # on one-down only GPU 0 is offered: the bind's allocation takes it
        assert (await svc.bind(bind_args(one, "one-down"))).Error == ""
        granted = json.loads((await svc.cluster.get_pod("default", "one"))["metadata"]["annotations"][ANN_ALLOCATION])
        assert [g["uuid"] for g in granted["gpus"]] == ["GPU-one-down-0"]

        # (a share is always one GPU: the pod reader refuses shares of several)
        two = await svc.cluster.create_pod(gpu_pod("two", cores=25, annotations=MPS))
        answer = await svc.filter(ExtenderArgs(Pod=two, NodeNames=["down", "none"]))
        assert answer.NodeNames == []
        assert answer.FailedNodes == {
            "down": "isolation mps needs 1 GPU(s) with a running MPS daemon, 0 fit "
                    "(GPU 0: no MPS daemon (the node's agent runs none); GPU 1: MPS daemon down)",
            "none": "isolation mps needs 1 GPU(s) with a running MPS daemon, 0 fit "
                    "(GPU 0, 1: no MPS daemon (the node's agent runs none))",
        }
        assert svc.pending["default/two"][0].startswith("fits no node, e.g. isolation mps needs 1 GPU(s)")
        # the binding cycle runs the same filters
        assert "GPU 1: MPS daemon down" in (await svc.bind(bind_args(two, "down"))).Error
    finally:
        await svc.stop()


async def test_whole_gpus_and_other_isolations_need_no_daemon() -> None:
    svc = await service()
    try:
        whole = await svc.cluster.create_pod(gpu_pod("whole", cores=None, annotations=MPS))
        assert (await svc.filter(ExtenderArgs(Pod=whole, NodeNames=["none"]))).NodeNames == ["none"]
        hook = await svc.cluster.create_pod(gpu_pod("hook", cores=25))
        assert (await svc.filter(ExtenderArgs(Pod=hook, NodeNames=["none"]))).NodeNames == ["none"]
    finally:
        await svc.stop()


async def test_a_daemon_coming_up_is_seen_at_the_next_filter() -> None:
    svc = await service()
    try:
        pod = await svc.cluster.create_pod(gpu_pod("p", cores=25, annotations=MPS))
        assert (await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["none"]))).NodeNames == []
        # the agent there now runs daemons (setting mps_daemons) and republished its inventory
        await svc.cluster.patch_node_annotations("none", {ANN_INVENTORY: inventory("none", ("down", "up"))})
        for _ in range(200):  # the watch delivers the node change
            answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["none"]))
            if answer.NodeNames:
                break
            await asyncio.sleep(0.01)
        assert answer.NodeNames == ["none"]
    finally:
        await svc.stop()
