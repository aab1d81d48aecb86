"""The observed workload: the typical tasks the scheduler's fragmentation-aware policies plan for."""

from __future__ import annotations

from gpupool.api.extender import ExtenderArgs
from gpupool.core.model import GPURequest, PodRequest
from gpupool.scheduler.service import ExtenderService
from gpupool.scheduler.workload import ObservedWorkload
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, started_service


def _request(milli: int, count: int = 1) -> PodRequest:
    return PodRequest(key="k", cpu_milli=1000, memory_mib=0, gpu=GPURequest(count=count, milli=milli))


def test_nothing_is_assumed_before_enough_pods_were_seen():
    w = ObservedWorkload(refresh_every=4, min_pods=3)
    w.observe("a", _request(500))
    w.observe("b", _request(500))
    assert w.current == ()  # the policies use their default workload
    w.observe("b", _request(500))  # the same pod again (a new scheduling cycle) counts once
    assert w.current == ()
    w.observe("c", _request(1000))
    # 3 pods: two halves and one whole GPU -> weights 2/3 and 1/3, most popular first.
    assert [(t.gpu_milli, round(t.weight, 3)) for t in w.current] == [(500, 0.667), (1000, 0.333)]


def test_the_mix_is_recomputed_every_refresh_every_new_pods():
    w = ObservedWorkload(refresh_every=4, min_pods=1)
    w.observe("a", _request(250))
    assert [t.gpu_milli for t in w.current] == [250]
    for uid in ("b", "c", "d"):
        w.observe(uid, _request(1000))
    assert [t.gpu_milli for t in w.current] == [250]  # 3 new pods: not yet
    w.observe("e", _request(1000))
    # 5 pods: four whole GPUs (0.8), one quarter (0.2).
    assert [(t.gpu_milli, t.weight) for t in w.current] == [(1000, 0.8), (250, 0.2)]


def test_only_the_window_counts():
    w = ObservedWorkload(window=2, refresh_every=1, min_pods=1)
    for uid, milli in (("a", 100), ("b", 200), ("c", 300)):
        w.observe(uid, _request(milli))
    assert sorted(t.gpu_milli for t in w.current) == [200, 300]


def test_seed_from_placed_pods_only_when_nothing_was_observed():
    w = ObservedWorkload(min_pods=2)
    w.seed([_request(500), _request(500)])
    assert [(t.gpu_milli, t.weight) for t in w.current] == [(500, 1.0)]
    w.seed([_request(1000)] * 5)  # a re-list after a leadership change: what was observed stays
    assert [t.gpu_milli for t in w.current] == [500]


async def test_the_scheduler_learns_from_bound_pods_only():
    """Filters teach nothing (anyone may send one); a pod counts once the API shows it bound."""
    svc = await started_service(nodes=2)
    svc.workload.min_pods = 8
    cluster = svc.cluster
    assert (await svc.debug_ledger())["workload"] == []  # nothing seen: the policies' default
    names = ["gpu-0000", "gpu-0001"]
    pods = [await cluster.create_pod(gpu_pod(f"p{i}", cores=30 if i % 4 else None)) for i in range(8)]
    for pod in pods:
        await svc.filter(ExtenderArgs(Pod=pod, NodeNames=names))
    assert svc.workload.current == ()
    for i, pod in enumerate(pods):
        assert (await svc.bind(bind_args(pod, names[i % 2]))).Error == ""
        await cluster.patch_pod_status("default", f"p{i}", {"phase": "Running"})  # allocated: lock free
    await eventually(lambda: svc.workload.current != ())
    shapes = {(s["gpu_milli"], s["weight"]) for s in (await svc.debug_ledger())["workload"]}
    # 8 pods: every 4th asks for a whole GPU (2), the others 30 % (6).
    assert shapes == {(300, 0.75), (1000, 0.25)}
    await svc.stop()


async def _winner(svc: ExtenderService, name: str, cores: int) -> str:
    """The node prioritize picks for a new pod; its cycle then ends without a bind (nothing reserved)."""
    pod = await svc.cluster.create_pod(gpu_pod(name, cores=cores))
    scores = dict(await svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000", "gpu-0001"])))
    svc.ledger.forget(pod["metadata"]["uid"])
    svc.busy.forget_nomination(pod["metadata"]["uid"])
    return max(scores, key=lambda n: scores[n])


async def test_what_was_observed_changes_where_a_share_goes():
    """Two 1-GPU nodes; gpu-0000 holds 40 %, gpu-0001 is empty; a 30 % pod arrives.
    Default workload (whole, half, quarter GPUs, 1/3 each), fragmentation change in GPUs:
      on gpu-0000: 0.6 free -> 0.3 free: whole: 0.6 -> 0.3 (-0.3), half: 0 -> 0.3 (+0.3), quarter: 0 -> 0
                   => 0, the best;
      on gpu-0001: 1.0 free -> 0.7 free: whole: 0 -> 0.7 (+0.7), half and quarter: 0 => +0.233.
    Observed workload of (almost only) 60 % pods: on gpu-0000 the 0.3 left is a fragment (+0.3); on gpu-0001
    the 0.7 left still takes a 60 % pod (0) => gpu-0001. The 60 % pods are learned by binding them (to
    gpu-0001) and deleting them again, so the capacity is as before."""
    svc = await started_service(nodes=2, gpus=1)
    svc.workload.min_pods = svc.workload.refresh_every = 20
    cluster = svc.cluster
    held = await cluster.create_pod(gpu_pod("held", cores=40))
    assert (await svc.bind(bind_args(held))).Error == ""
    await cluster.patch_pod_status("default", "held", {"phase": "Running"})  # allocated: the node is not busy
    await eventually(lambda: not svc.busy.names(svc.clock()))
    assert await _winner(svc, "before", cores=30) == "gpu-0000"
    for i in range(19):  # with "held": 20 bound pods, 19 of them 60 %
        pod = await cluster.create_pod(gpu_pod(f"w{i}", cores=60))
        assert (await svc.bind(bind_args(pod, "gpu-0001"))).Error == ""
        await eventually(lambda p=pod: p["metadata"]["uid"] in svc.ledger.confirmed())
        await cluster.delete_pod("default", f"w{i}")
        await eventually(lambda p=pod: p["metadata"]["uid"] not in svc.ledger.entries)
    await eventually(lambda: svc.workload.current != ())
    assert [t.gpu_milli for t in svc.workload.current][0] == 600
    await eventually(lambda: not svc.busy.names(svc.clock()))
    assert await _winner(svc, "after", cores=30) == "gpu-0001"
    await svc.stop()
