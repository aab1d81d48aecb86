"""Team queues in the scheduler: admission with a readable reason, reclaim of borrowed capacity and priority
preemption inside a queue, through the Eviction API (gpupool.scheduler.framework.plugins.queue_*)."""

from __future__ import annotations

from typing import Any

from gpupool.api.extender import ExtenderArgs
from gpupool.cluster.port import PDBS
from gpupool.scheduler.queues import GPUQUEUES
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, queue_service, reclaim, started_service


async def with_queues(queues: dict[str, dict[str, Any]]) -> ExtenderService:
    """One node with two whole GPUs; namespaces team-a and team-b join the queues of the same names."""
    return await queue_service(queues, gpus=2)


async def run(svc: ExtenderService, name: str, namespace: str, priority: int = 0, labels: dict | None = None) -> dict:
    """Create a whole-GPU pod, bind it to the node and mark it Running (its Allocate happened)."""
    spec = gpu_pod(name, cores=None, namespace=namespace)
    spec["spec"]["priority"] = priority
    spec["metadata"]["labels"] = dict(labels or {})
    pod = await svc.cluster.create_pod(spec)
    await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
    assert (await svc.bind(bind_args(pod))).Error == ""
    await svc.cluster.patch_pod_status(namespace, name, {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                                                          "conditions": [{"type": "Ready", "status": "True"}]})
    await eventually(lambda: svc.ledger.entries.get(pod["metadata"]["uid"]) is not None
                     and not svc.ledger.entries[pod["metadata"]["uid"]].assumed)
    return pod


async def pending(svc: ExtenderService, name: str, namespace: str, priority: int = 0) -> dict:
    spec = gpu_pod(name, cores=None, namespace=namespace)
    spec["spec"]["priority"] = priority
    pod = await svc.cluster.create_pod(spec)
    await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
    return pod



async def test_a_queue_at_its_maximum_is_refused_with_the_reason() -> None:
    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "1"}, "maximum": {"gpus": "1"}}})
    await run(svc, "a1", "team-a")
    extra = await pending(svc, "a2", "team-a")
    answer = await svc.filter(ExtenderArgs(Pod=extra, NodeNames=["gpu-0000"]))
    # A second whole GPU: 2 of the queue's maximum 1 (a GPU is free on the node: the queue alone refuses).
    assert answer.NodeNames == []
    assert answer.FailedAndUnresolvableNodes == {"gpu-0000": "queue team-a: 2 of 1 GPUs maximum"}
    assert "queue team-a: 2 of 1 GPUs maximum" in svc.pending["team-a/a2"][0]
    bound = await svc.bind(bind_args(extra))
    assert "queue team-a: 2 of 1 GPUs maximum" in bound.Error
    await svc.stop()


async def test_a_queue_borrows_idle_guarantee_and_gets_it_reclaimed() -> None:
    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    await run(svc, "a1", "team-a")
    await run(svc, "a2", "team-a")  # team-b's idle guarantee: 2 of 1, borrowed
    owner = await pending(svc, "b1", "team-b")
    answer = await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))
    assert answer.NodeNames == [] and "gpu-0000" in answer.FailedNodes  # the node is full, for now
    # The PostFilter evicted one of team-a's pods (both started at the same time and have the same priority:
    # either is the borrowed GPU) and recorded why on both pods.
    plan = reclaim(svc).plans[-1]
    assert len(plan.victims) == 1 and plan.victims[0].pod.queue == "team-a"
    victim = plan.victims[0].pod
    await eventually(lambda: svc.ledger.entries.get(victim.uid) is None)
    await eventually(lambda: ("Preempting", f"evicted {victim.key} on gpu-0000 (reclaim)")
                     in _sync_events(svc, "team-b", "b1"))
    [(reason, message)] = _sync_events(svc, "team-a", victim.key.split("/")[1])
    assert reason == "Preempted" and message.startswith("reclaimed for queue team-b")
    # The owner now fits and binds; team-a keeps its guarantee (one pod), and nothing more is evicted.
    assert (await svc.filter(ExtenderArgs(Pod=owner, NodeNames=["gpu-0000"]))).NodeNames == ["gpu-0000"]
    assert (await svc.bind(bind_args(owner))).Error == ""
    assert sorted(e.key for e in svc.ledger.entries.values()) == sorted(
        ["team-b/b1", *(k for k in ("team-a/a1", "team-a/a2") if k != victim.key)])
    assert len(reclaim(svc).plans) == 1
    await svc.stop()


async def test_a_pod_within_its_guarantee_is_never_taken_for_a_borrower() -> None:
    # team-b runs its guarantee (1); team-a runs 1 of its 1 and asks for more: it would borrow, so it may
    # not reclaim, and team-b's pod is within its guarantee anyway.
    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    await run(svc, "a1", "team-a")
    await run(svc, "b1", "team-b")
    extra = await pending(svc, "a2", "team-a")
    await svc.filter(ExtenderArgs(Pod=extra, NodeNames=["gpu-0000"]))
    assert reclaim(svc).plans == []
    assert len(svc.ledger.entries) == 2
    await svc.stop()


async def test_priority_preemption_inside_a_queue_and_a_budget_moves_it_to_another_victim() -> None:
    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "2"}}})
    low = await run(svc, "low", "team-a", priority=1, labels={"app": "guarded"})
    lower = await run(svc, "lower", "team-a", priority=2)
    # A budget protects `low` (priority 1, the first choice): no disruption allowed now.
    await svc.cluster.create_object(PDBS, {"metadata": {"name": "guard", "namespace": "team-a"},
                                           "spec": {"selector": {"matchLabels": {"app": "guarded"}}}})
    await svc.cluster.patch_object(PDBS, "guard", {"status": {"disruptionsAllowed": 0, "currentHealthy": 1,
                                                               "desiredHealthy": 1}},
                                   namespace="team-a", subresource="status")
    high = await pending(svc, "high", "team-a", priority=10)
    await svc.filter(ExtenderArgs(Pod=high, NodeNames=["gpu-0000"]))
    first = reclaim(svc).plans[-1]
    assert [v.pod.key for v in first.victims] == ["team-a/low"] and first.victims[0].reason == "priority"
    await eventually(lambda: any(r == "PreemptionBlocked" for r, _ in _sync_events(svc, "team-a", "low")))
    assert svc.ledger.entries.get(low["metadata"]["uid"]) is not None  # the budget kept it
    # Refused with 429, it chooses the other lower-priority pod at once (a later cycle of the pod adds nothing
    # while that eviction is under way).
    await eventually(lambda: len(reclaim(svc).plans) == 2)
    await svc.filter(ExtenderArgs(Pod=high, NodeNames=["gpu-0000"]))
    assert len(reclaim(svc).plans) == 2
    second = reclaim(svc).plans[-1]
    assert [v.pod.key for v in second.victims] == ["team-a/lower"]
    await eventually(lambda: svc.ledger.entries.get(lower["metadata"]["uid"]) is None)
    assert (await svc.bind(bind_args(high))).Error == ""
    await svc.stop()


def _sync_events(svc: ExtenderService, namespace: str, name: str) -> list[tuple[str, str]]:
    """Events the scheduler recorded about a pod (the embedded cluster keeps them in a list)."""
    events = svc.cluster.events  # type: ignore[attr-defined]
    return [(e["reason"], e["message"]) for e in events
            if e["involvedObject"]["namespace"] == namespace and e["involvedObject"]["name"] == name]


async def test_without_queues_nothing_changes() -> None:
    svc = await started_service(nodes=1, gpus=1)
    first = await svc.cluster.create_pod(gpu_pod("p1", cores=None))
    await eventually(lambda: svc.pods.get(first["metadata"]["uid"]) is not None)
    assert (await svc.bind(bind_args(first))).Error == ""
    second = await svc.cluster.create_pod(gpu_pod("p2", cores=None))
    await eventually(lambda: svc.pods.get(second["metadata"]["uid"]) is not None)
    answer = await svc.filter(ExtenderArgs(Pod=second, NodeNames=["gpu-0000"]))
    assert answer.NodeNames == [] and not svc.queues.enabled and reclaim(svc).plans == []
    await svc.stop()


async def test_queue_status_and_metrics_show_usage_borrowing_and_pending() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "1"}, "maximum": {"gpus": "2"}},
                             "team-b": {"guaranteed": {"gpus": "1"}}})
    await run(svc, "a1", "team-a")
    await run(svc, "a2", "team-a")
    third = await pending(svc, "a3", "team-a")  # past team-a's maximum: pending, with the reason
    await svc.filter(ExtenderArgs(Pod=third, NodeNames=["gpu-0000"]))
    assert await svc.queue_status.write_once() == 2
    status = (await svc.cluster.get_object(GPUQUEUES, "team-a"))["status"]
    # team-a: 2 GPUs used of 1 guaranteed: 1 borrowed, nothing lent.
    assert status["usage"]["gpus"] == "2" and status["borrowed"]["gpus"] == "1" and status["lent"]["gpus"] == "0"
    assert status["pendingPods"] == 1
    assert (await svc.queue_status.write_once()) == 0  # unchanged: nothing written again
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(svc.metrics.registry).decode())
               for s in f.samples if s.name.startswith("gpupool_queue_")}
    assert samples[("gpupool_queue_usage", (("queue", "team-a"), ("resource", "gpus")))] == 2.0
    assert samples[("gpupool_queue_borrowed", (("queue", "team-a"), ("resource", "gpus")))] == 1.0
    assert samples[("gpupool_queue_lent", (("queue", "team-b"), ("resource", "gpus")))] == 1.0
    assert samples[("gpupool_queue_pending_pods", (("queue", "team-a"),))] == 1.0
    assert samples[("gpupool_queue_maximum", (("queue", "team-a"), ("resource", "gpus")))] == 2.0
    # No maximum set: no maximum series (unlimited).
    assert ("gpupool_queue_maximum", (("queue", "team-b"), ("resource", "gpus"))) not in samples
    await svc.stop()


async def test_the_pool_snapshot_shows_the_queues() -> None:
    from gpupool.commands.pool_views import snapshot_of

    svc = await with_queues({"team-a": {"guaranteed": {"gpus": "1"}, "maximum": {"gpus": "2"}},
                             "team-b": {"guaranteed": {"gpus": "1"}}})
    await run(svc, "a1", "team-a")
    await run(svc, "a2", "team-a")
    snap = snapshot_of(svc)
    views = {v.name: v for v in snap.queues}
    # team-a: 2 used of 1 guaranteed (1 borrowed), maximum 2; team-b lends its idle 1; default: no guarantee.
    assert (views["team-a"].used_gpus, views["team-a"].borrowed_gpus, views["team-a"].maximum_gpus) == (2, 1, 2)
    assert (views["team-b"].lent_gpus, views["team-b"].maximum_gpus) == (1, None)
    assert set(views) == {"team-a", "team-b", "default"}
    await svc.stop()
