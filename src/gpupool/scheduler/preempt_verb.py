"""The extender's preempt verb: kube-scheduler's own preemption (DefaultPreemption) proposes, per node, the
lower-priority pods it would evict; it does not know GPU shares, so it may propose victims whose going frees
no GPU the pod can use, or more victims than the share needs. gpupool answers, per node, the victims that
actually make room for the pod's GPU share (kube-scheduler replaces its candidates with the answer):

- nodes where even all proposed victims leave no room for the share are dropped;
- proposed pods that hold GPUs on the node are given back when the share fits without them (the most costly
  to evict first: highest priority, then longest running);
- with team queues, a pod of another queue is never taken unless gpupool.core.preemption allows it (its queue
  borrowing, the preemptor within its own guarantee): no preemption lets one queue borrow from another's
  guarantee;
- pods without GPUs stay as proposed (kube-scheduler needed them for CPU or memory);
- nodes where kube-scheduler counts PodDisruptionBudget violations are dropped: kube-scheduler deletes its
  victims directly, so a budget would not be honoured (gpupool's own reclaim evicts through the Eviction API);
- while gpupool's own reclaim is evicting victims for the pod, no node is offered, so the pod never costs two
  sets of victims.

The pod is read from the scheduler's cache by the reference the body gives; the rest of the body is only a
list of UIDs, each checked against the ledger's allocations on that node.
"""

from __future__ import annotations

from gpupool.api.extender import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims
from gpupool.core.model import GPURequest
from gpupool.core.preemption import Preemptor, in_quota, victim_reason
from gpupool.core.queues import charge_of_request
from gpupool.scheduler.framework.cycle import Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.plugins.queue_reclaim import QueueReclaim, candidate, priority_of
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.pods import PodRef, PodRefused
from gpupool.scheduler.queues import namespace_of
from gpupool.scheduler.what_if import fits_without


async def preempt(handle: Handle, framework: Framework, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
    try:
        pod = await handle.pods.resolve(PodRef.of(args.Pod))
    except PodRefused:
        return ExtenderPreemptionResult()  # not a pod of ours: no node is a candidate
    cycle = framework.cycle(pod, Phase.FILTER)
    if not framework.pre_filter(cycle).ok:
        return ExtenderPreemptionResult()
    candidates = {n: v for n, v in args.candidates().items() if v.NumPDBViolations == 0}
    reclaim = next((p for p in framework.plugins if isinstance(p, QueueReclaim)), None)
    if reclaim is not None and reclaim.waiting_for(cycle.uid):
        return ExtenderPreemptionResult()
    request = cycle.request
    if request is None or request.gpu.count == 0:
        return ExtenderPreemptionResult(NodeNameToMetaVictims=candidates)  # no GPU share: nothing to judge
    ledger, queues = handle.ledger, handle.queues
    out: dict[str, MetaVictims] = {}
    for node, victims in candidates.items():
        uids = [m.UID for m in victims.Pods]
        on_node = {u for u in uids if u in ledger.entries and ledger.entries[u].allocation.node == node}
        if queues is not None and queues.enabled:
            on_node = _allowed(handle, cycle.uid, cycle.key, priority_of(pod), request.gpu, on_node)
        if not fits_without(ledger, request, node, on_node):
            continue
        keep = set(on_node)
        for uid in sorted(on_node, key=lambda u: (-priority_of(handle.pods.get(u)), u)):
            if fits_without(ledger, request, node, keep - {uid}):
                keep.discard(uid)
        chosen = [u for u in uids if u in keep or u not in ledger.entries]
        if chosen:
            out[node] = MetaVictims(Pods=[MetaPod(UID=u) for u in chosen], NumPDBViolations=victims.NumPDBViolations)
    return ExtenderPreemptionResult(NodeNameToMetaVictims=out)


def _allowed(handle: Handle, uid: str, key: str, priority: int, gpu: GPURequest, proposed: set[str]) -> set[str]:
    """The proposed GPU holders gpupool's queue rules let this pod take."""
    cache = handle.queues
    assert cache is not None
    tree, memory = cache.queues.tree, cache.gpu_memory()
    usage = cache.usage(without=uid)
    queue = cache.queue_of(namespace_of(key))
    preemptor = Preemptor(uid, queue, priority, charge_of_request(gpu, cache.largest_gpu_mib()))
    reclaims = in_quota(tree, usage, preemptor)
    allowed: set[str] = set()
    for victim_uid in sorted(proposed):
        running = candidate(cache, handle.ledger.entries[victim_uid], handle.pods.get(victim_uid), memory)
        if victim_reason(tree, usage, preemptor, running, reclaims) is not None:
            allowed.add(victim_uid)
            usage[running.queue] = usage[running.queue] - running.charge
    return allowed
