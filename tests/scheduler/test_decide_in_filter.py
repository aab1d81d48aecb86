"""/filter decides a GPU pod's node when the pod states no soft scheduling preference: the answer is the
policy's pick alone, reserved for the pod as prioritize would, so kube-scheduler scores nothing and skips
/prioritize. Pods with soft preferences, and a config with `decide_in_filter` off, get every feasible node.
The pick passes over nodes with a PreferNoSchedule taint the pod does not tolerate while another fits."""

from __future__ import annotations

import pytest

from gpupool.api.extender import ExtenderArgs
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import NODES
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, small_scenario

NAMES = ["gpu-0000", "gpu-0001"]
SOFT_TAINT = {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}


async def _service(decide: bool = True, taint_second: bool = False) -> ExtenderService:
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=2)):
        if taint_second and obj["metadata"]["name"] == NAMES[1]:
            obj = {**obj, "spec": {**obj.get("spec", {}), "taints": [SOFT_TAINT]}}
        await cluster.create_node(obj)
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, decide_in_filter=decide))
    await svc.start()
    return svc


async def _share_running_on_second(svc: ExtenderService) -> None:
    """A share running on gpu-0001 (served, so the node is not busy): packing policies now prefer it for
    the next share, where the first offered node would be gpu-0000."""
    first = await svc.cluster.create_pod(gpu_pod("first", cores=50))
    await eventually(lambda: svc.pods.get(first["metadata"]["uid"]) is not None)
    assert (await svc.bind(bind_args(first, NAMES[1]))).Error == ""
    await svc.cluster.patch_pod_status("default", "first", {"phase": "Running"})
    await eventually(lambda: not svc.busy.names(svc.clock()))


async def _filter(svc: ExtenderService, pod: dict) -> list[str]:
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert answer.Error == ""
    return list(answer.NodeNames or [])


async def test_filter_answers_the_policys_pick_reserved_for_the_pod():
    svc = await _service()
    try:
        await _share_running_on_second(svc)
        pod = await svc.cluster.create_pod(gpu_pod("next", cores=25))
        assert await _filter(svc, pod) == [NAMES[1]]  # packed beside the running share, not the first node
        entry = svc.ledger.entries[pod["metadata"]["uid"]]
        assert entry.assumed and entry.allocation.node == NAMES[1]
        # The pick is prioritize's winner: asked again with every node, the same node scores 10.
        scores = dict(await svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=NAMES)))
        assert scores[NAMES[1]] == 10
        assert (await svc.bind(bind_args(pod, NAMES[1]))).Error == ""
    finally:
        await svc.stop()


SOFT = {
    "nodeAffinity": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}},
    "podAntiAffinity": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                          "labelSelector": {"matchLabels": {"app": "x"}}}}]}}},
    "topologySpread": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"app": "x"}}}]},
}


@pytest.mark.parametrize("soft", list(SOFT))
async def test_a_pod_with_soft_preferences_gets_every_feasible_node(soft):
    svc = await _service()
    try:
        pod = gpu_pod("soft", cores=25)
        pod["spec"].update(SOFT[soft])
        pod = await svc.cluster.create_pod(pod)
        assert await _filter(svc, pod) == NAMES  # kube-scheduler weighs its preference in prioritize
        assert pod["metadata"]["uid"] not in svc.ledger.entries  # nothing reserved before prioritize
    finally:
        await svc.stop()


async def test_with_decide_in_filter_off_filter_lists_every_feasible_node():
    svc = await _service(decide=False)
    try:
        pod = await svc.cluster.create_pod(gpu_pod("p", cores=25))
        assert await _filter(svc, pod) == NAMES
    finally:
        await svc.stop()


@pytest.mark.parametrize("tolerates", [False, True])
async def test_the_pick_avoids_a_prefer_no_schedule_taint_the_pod_does_not_tolerate(tolerates):
    svc = await _service(taint_second=True)
    try:
        await _share_running_on_second(svc)
        pod = gpu_pod("next", cores=25)
        if tolerates:
            pod["spec"]["tolerations"] = [{"key": "maintenance", "operator": "Exists"}]
        pod = await svc.cluster.create_pod(pod)
        # The packing choice is gpu-0001, which is tainted.
        assert await _filter(svc, pod) == [NAMES[1] if tolerates else NAMES[0]]
    finally:
        await svc.stop()


async def test_a_taint_added_or_removed_later_is_followed_from_the_node_watch():
    svc = await _service()
    try:
        await _share_running_on_second(svc)
        await svc.cluster.patch_object(NODES, NAMES[1], {"spec": {"taints": [SOFT_TAINT]}})
        await eventually(lambda: NAMES[1] in svc.ledger.soft_taints)
        pod = await svc.cluster.create_pod(gpu_pod("next", cores=25))
        assert await _filter(svc, pod) == [NAMES[0]]
        await svc.cluster.delete_pod("default", "next")  # its nomination would steer the next pod off gpu-0000
        await svc.cluster.patch_object(NODES, NAMES[1], {"spec": {"taints": None}})
        await eventually(lambda: not svc.ledger.soft_taints and not svc.busy.names(svc.clock()))
        again = await svc.cluster.create_pod(gpu_pod("again", cores=25))
        assert await _filter(svc, again) == [NAMES[1]]
    finally:
        await svc.stop()


async def test_a_tainted_node_still_takes_the_pod_when_it_is_the_only_one_that_fits():
    svc = await _service(taint_second=True)
    try:
        whole = await svc.cluster.create_pod(gpu_pod("whole", cores=None, gpus=8))  # gpu-0000 full
        await eventually(lambda: svc.pods.get(whole["metadata"]["uid"]) is not None)
        assert (await svc.bind(bind_args(whole, NAMES[0]))).Error == ""
        pod = await svc.cluster.create_pod(gpu_pod("next", cores=25))
        assert await _filter(svc, pod) == [NAMES[1]]
    finally:
        await svc.stop()


async def test_when_no_node_fits_a_deciding_filter_still_says_why():
    svc = await _service()
    try:
        share = await svc.cluster.create_pod(gpu_pod("share", cores=10))
        await eventually(lambda: svc.pods.get(share["metadata"]["uid"]) is not None)
        assert (await svc.bind(bind_args(share, NAMES[1]))).Error == ""
        big = await svc.cluster.create_pod(gpu_pod("big", cores=None, gpus=8))  # 8 whole GPUs: gpu-0000 only
        await eventually(lambda: svc.pods.get(big["metadata"]["uid"]) is not None)
        assert await _filter(svc, big) == [NAMES[0]]
        assert (await svc.bind(bind_args(big, NAMES[0]))).Error == ""
        again = await svc.cluster.create_pod(gpu_pod("again", cores=None, gpus=8))
        answer = await svc.filter(ExtenderArgs(Pod=again, NodeNames=NAMES))
        assert answer.NodeNames == [] and answer.FailedNodes == {
            NAMES[0]: "needs 8 x a whole free GPU; 0 available",
            NAMES[1]: "needs 8 x a whole free GPU; 7 available",
        }
    finally:
        await svc.stop()
