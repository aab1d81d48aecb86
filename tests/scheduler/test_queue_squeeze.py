"""Time-sharing instead of eviction in the live scheduler: a queue reclaiming its guarantee first squeezes
the compute of borrowed `hook` shares (their allocation rewritten, `gpupool.io/squeezed` set), evicts only
when no squeeze can make room, and the squeeze is lifted once the owner no longer needs the compute.
One node with one 16 GiB GPU; queues team-a and team-b each guaranteed 50 % of its compute."""

from __future__ import annotations

from gpupool.api.allocation import decode_allocation
from gpupool.api.extender import ExtenderArgs
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.api.recompute import recompute
from gpupool.api.squeeze import ANN_ROOM_MADE, ANN_SQUEEZE, ANN_SQUEEZED
from gpupool.scheduler.service import ExtenderService
from gpupool.scheduler.squeeze import lift_squeezes
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, queue_service, reclaim

HALF = {"guaranteed": {"gpuCores": 50}}


async def with_queues() -> ExtenderService:
    return await queue_service({"team-a": HALF, "team-b": HALF}, gpus=1)


async def run(svc: ExtenderService, name: str, namespace: str, cores: int, memory: int,
              annotations: dict | None = None, started: bool = True) -> dict:
    pod = await svc.cluster.create_pod(gpu_pod(name, cores=cores, memory=memory, namespace=namespace,
                                               annotations=annotations))
    await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
    assert (await svc.bind(bind_args(pod))).Error == ""
    await svc.cluster.patch_pod_status(namespace, name, {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
    if started:  # the agent served its Allocate: its cap is in the container, the squeeze can act on it
        await svc.cluster.patch_pod_annotations(namespace, name, {ANN_ALLOCATED: "2026-01-01T00:00:00Z"})
    uid = pod["metadata"]["uid"]
    await eventually(lambda: uid in svc.ledger.entries and not svc.ledger.entries[uid].assumed
                     and (not started or ANN_ALLOCATED in svc.pods.get(uid)["metadata"]["annotations"]))  # type: ignore[index]
    return pod


async def pending(svc: ExtenderService, name: str, namespace: str, cores: int, memory: int) -> dict:
    pod = await svc.cluster.create_pod(gpu_pod(name, cores=cores, memory=memory, namespace=namespace))
    await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
    return pod



def held_cores(svc: ExtenderService, pod: dict) -> list[int]:
    return [g.milli // 10 for g in svc.ledger.entries[pod["metadata"]["uid"]].allocation.grants]


def events(svc: ExtenderService, namespace: str, name: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in svc.cluster.events  # type: ignore[attr-defined]
            if e["involvedObject"]["namespace"] == namespace and e["involvedObject"]["name"] == name]


async def test_reclaim_squeezes_a_borrowed_share_instead_of_evicting_it_and_lifts_it_later() -> None:
    svc = await with_queues()
    # team-a borrows: 80 % of the GPU (guaranteed 50). team-b asks 30 % (its guarantee covers it); the GPU has
    # 20 % compute free, and memory enough (2 + 2 of 16 GiB).
    borrower = await run(svc, "a1", "team-a", cores=80, memory=2048)
    owner = await pending(svc, "b1", "team-b", cores=30, memory=2048)
    answer = await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))
    assert answer.NodeNames == []
    # Squeezed from 80 to 70 % (1000 - 700 = 300 milli free for b1), not evicted: no eviction plan at all.
    [plan] = reclaim(svc).squeezes
    assert [(s.pod.key, s.milli) for s in plan.squeezes] == [("team-a/a1", 700)] and reclaim(svc).plans == []
    await eventually(lambda: held_cores(svc, borrower) == [70])
    await eventually(lambda: ANN_SQUEEZED in (svc.pods.get(borrower["metadata"]["uid"]) or {}).get(
        "metadata", {}).get("annotations", {}))
    stored = svc.pods.get(borrower["metadata"]["uid"])
    assert stored is not None
    assert [g.cores for g in decode_allocation(stored["metadata"]["annotations"][ANN_ALLOCATION]).gpus] == [70.0]
    await eventually(lambda: any(r == "Squeezed" for r, _ in events(svc, "team-a", "a1")))
    [(_, message)] = [e for e in events(svc, "team-a", "a1") if e[0] == "Squeezed"]
    assert message.startswith("compute squeezed from 80 % to 70 % per GPU for queue team-b")
    # The owner is marked (an update makes kube-scheduler retry it now), then fits and binds beside a1.
    await eventually(lambda: ANN_ROOM_MADE in (svc.pods.get(owner["metadata"]["uid"]) or {}).get(
        "metadata", {}).get("annotations", {}))
    note = svc.pods.get(owner["metadata"]["uid"])["metadata"]["annotations"][ANN_ROOM_MADE]  # type: ignore[index]
    assert note.endswith(" #1: squeezed team-a/a1")  # numbered: two notes in one second still differ
    assert (await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))).NodeNames == ["gpu-0000"]
    assert (await svc.bind(bind_args(owner))).Error == ""
    await eventually(lambda: owner["metadata"]["uid"] in svc.ledger.confirmed())
    # The API's view agrees with the ledger's: a squeezed grant below the spec is not reported as forged.
    nodes, _ = await svc.cluster.list_nodes()
    pods, _ = await svc.cluster.list_pods()
    assert svc.ledger.diff(recompute(nodes, pods)) == {"missing": [], "extra": [], "different": [],
                                                        "overcommitted": []}
    now = svc.handle.clock()
    # While the owner holds its 30 %, a1 cannot get its 80 % back (70 + 30 = 100): nothing is lifted.
    assert await lift_squeezes(svc.cluster, svc.queues, {}, now + 3600) == []
    await svc.cluster.delete_pod("team-b", "b1")
    await eventually(lambda: owner["metadata"]["uid"] not in svc.ledger.entries)
    # Gone: 80 % fits again and team-a may borrow while no other queue waits, but not before the hold.
    assert await lift_squeezes(svc.cluster, svc.queues, {}, now, hold_s=30) == []
    assert await lift_squeezes(svc.cluster, svc.queues, {"team-b/b2": ("waiting", now)}, now + 60) == []
    assert await lift_squeezes(svc.cluster, svc.queues, {}, now + 60) == ["team-a/a1"]
    assert held_cores(svc, borrower) == [80]
    await eventually(lambda: ANN_SQUEEZED not in (svc.pods.get(borrower["metadata"]["uid"]) or {}).get(
        "metadata", {}).get("annotations", {}))
    await svc.stop()


async def test_eviction_stays_the_fallback_when_a_squeeze_cannot_make_room() -> None:
    svc = await with_queues()
    # a1 holds 12 of the 16 GiB: b1's 8 GiB do not fit whatever a1's compute, so a1 is evicted.
    await run(svc, "a1", "team-a", cores=80, memory=12288)
    owner = await pending(svc, "b1", "team-b", cores=30, memory=8192)
    await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))
    assert reclaim(svc).squeezes == []
    [plan] = reclaim(svc).plans
    assert [v.pod.key for v in plan.victims] == ["team-a/a1"]
    await svc.stop()


async def test_a_pod_that_opted_out_is_evicted_not_squeezed() -> None:
    svc = await with_queues()
    await run(svc, "a1", "team-a", cores=80, memory=2048, annotations={ANN_SQUEEZE: "false"})
    owner = await pending(svc, "b1", "team-b", cores=30, memory=2048)
    await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))
    assert reclaim(svc).squeezes == [] and [v.pod.key for v in reclaim(svc).plans[0].victims] == ["team-a/a1"]
    await svc.stop()


async def test_a_pod_not_yet_started_is_evicted_not_squeezed() -> None:
    # Its container would be given the squeezed cap at Allocate and keep it after the lift.
    svc = await with_queues()
    await run(svc, "a1", "team-a", cores=80, memory=2048, started=False)
    owner = await pending(svc, "b1", "team-b", cores=30, memory=2048)
    await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))
    assert reclaim(svc).squeezes == [] and [v.pod.key for v in reclaim(svc).plans[0].victims] == ["team-a/a1"]
    await svc.stop()
