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
- a proposed pod that uses a DRA claim frees the claim's share only when every pod using the claim is
  proposed too (the evaluator's victim rule); one that holds a share on the node its going does not free is
  given back like an unneeded victim;
- pods without GPUs stay as proposed (kube-scheduler needed them for CPU or memory);
- nodes where kube-scheduler counts PodDisruptionBudget violations are dropped: kube-scheduler deletes its
  victims directly, so a budget would not be honoured (gpupool's own reclaim evicts through the Eviction API);
- while gpupool's own reclaim is evicting victims for the pod, no node is offered, so the pod never costs two
  sets of victims.

The pod is read from the scheduler's cache by the reference the body gives; the rest of the body is only a
list of UIDs, each checked against the ledger's allocations on that node. The judging is the framework's
preemption evaluator's (gpupool.scheduler.framework.preemption.Evaluator.trim), on a snapshot of the ledger.
"""

from __future__ import annotations

from gpupool.api.extender import ExtenderPreemptionArgs, ExtenderPreemptionResult
from gpupool.scheduler.framework.cycle import Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.pods import PodRef, PodRefused


async def preempt(handle: Handle, framework: Framework, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
    try:
        pod = await handle.pods.resolve(PodRef.of(args.Pod))
    except PodRefused:
        return ExtenderPreemptionResult()  # not a pod of ours: no node is a candidate
    cycle = framework.cycle(pod, Phase.FILTER)
    if not framework.pre_filter(cycle).ok:
        return ExtenderPreemptionResult()
    return ExtenderPreemptionResult(NodeNameToMetaVictims=handle.preemption.trim(cycle, args.candidates()))
