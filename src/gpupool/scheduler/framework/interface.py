"""Extension points (plugin protocols) and the handle through which plugins reach the scheduler's state.

A plugin is a class with a `name`, built by its module's factory from a `Handle` and typed arguments
(gpupool.scheduler.framework.registry). It takes part in every extension point whose method it defines:

  PreFilter  pre_filter(cycle) -> Status            checks on the pod alone; may derive cycle data
  Filter     filter(cycle, nodes) -> None           rejects nodes of `nodes` with a reason (in bulk)
  PostFilter post_filter(cycle, nodes) -> Status    when no node fits (pending note, queue reclaim)
  Score      score(cycle, nodes) -> NodeScores      scores (higher is better) and nodes to avoid
  Reserve    reserved(cycle, node) -> bool          the pod already holds a reservation there
             reserve(cycle, node) -> Status         take capacity on the chosen node
  Unreserve  async unreserve(cycle, node)           undo, after any later failure (reverse order)
  Permit     async permit(cycle, node) -> Status    may answer WAIT (gpupool.scheduler.framework.status)
  Bind       async bind(cycle, node) -> Status      the first one not answering SKIP binds

Filter and Score work on arrays of ledger node indices (thousands of nodes per request), not one node at
a time. Plugins marked `gpu_only` are skipped for pods that ask for no gpupool resource.

What plugins share they reach through the `Handle`: the caches, the preemption evaluator
(gpupool.scheduler.framework.preemption), `record_event`, and the views of the ledger they attach
(gpupool.scheduler.ledger.LedgerView). A plugin module never imports another plugin module, nor a module of
the service around the framework (tests/scheduler/test_plugin_rules.py holds it to that).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from gpupool.api.times import format_time
from gpupool.cluster.port import ClusterPort, Obj
from gpupool.core.model import PodRequest
from gpupool.core.policies import get_policy
from gpupool.core.policy import FloatArray, Policy, PolicyContext
from gpupool.core.state import BoolArray, IntArray
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.preemption import Evaluator
from gpupool.scheduler.framework.status import Status
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.pending import PendingPods
from gpupool.scheduler.pods import PodCache
from gpupool.scheduler.workload import ObservedWorkload

if TYPE_CHECKING:
    from gpupool.scheduler.queues import QueueCache

log = logging.getLogger(__name__)

# Called after each bind step: "assumed", "locked", "bound" (fault injection in tests; may be a coroutine
# function).
StepHook = Callable[[str], Any]


@dataclass(slots=True)
class NodeScores:
    """A Score plugin's answer for `nodes`: scores (None: it does not score) and nodes the winner should
    avoid while another fits (None: none)."""

    values: FloatArray | None = None
    avoid: BoolArray | None = None


@dataclass(slots=True)
class Handle:
    """The scheduler's state as plugins see it. One per service; everything runs on one event loop."""

    cluster: ClusterPort
    config: SchedulerConfig
    ledger: Ledger
    pods: PodCache
    busy: BusyNodes
    pending: PendingPods
    workload: ObservedWorkload
    metrics: SchedulerMetrics
    clock: Callable[[], float]
    step_hook: StepHook | None = None
    queues: QueueCache | None = None  # team queues (gpupool.scheduler.queues); None: no queue plugin acts
    binding: dict[str, int] = field(default_factory=dict)  # pod UID -> binds of it in progress
    _ctx: PolicyContext = field(default_factory=PolicyContext)
    _ctx_generation: int = -1
    _policies: dict[str, Policy] = field(default_factory=dict)
    _node_waiters: dict[str, asyncio.Event] = field(default_factory=dict)
    preemption: Evaluator = field(init=False)  # the framework's, shared by every plugin and verb

    def __post_init__(self) -> None:
        self.preemption = Evaluator(self)

    def policy(self, request: PodRequest) -> Policy:
        """The pod's policy (`gpupool.io/policy`, else the default); raises UnknownPolicy."""
        name = request.policy or self.config.default_policy
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = get_policy(name)
        return policy

    def context(self) -> PolicyContext:
        """The policies' context; rebuilt when the node set or the observed workload changed (per-node caches
        and the tie-break rank would be stale)."""
        ledger = self.ledger
        if self._ctx_generation != ledger.generation or self._ctx.workload is not self.workload.current:
            self._ctx = PolicyContext(rng=np.random.default_rng(0), rank=ledger.rank, workload=self.workload.current)
            self._ctx_generation = ledger.generation
        return self._ctx

    def waiter(self, node: str) -> asyncio.Event:
        """An event set when the watch shows a pod on `node` changed."""
        return self._node_waiters.setdefault(node, asyncio.Event())

    def wake(self, node: str) -> None:
        waiter = self._node_waiters.pop(node, None)
        if waiter is not None:
            waiter.set()

    async def record_event(self, namespace: str, name: str, uid: str, reason: str, message: str,
                           type_: str, kind: str = "Pod", api_version: str = "v1") -> None:
        """Record `reason: message` on the pod (or another object: `kind`, `api_version`) as an Event
        (FailedBinding, Preempted, Preempting, MoveCancelled on a claim, ...): best effort, never failing the
        decision it describes. The caller bounds and escapes the message."""
        now = format_time(self.clock())
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name,
                               "uid": uid},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.config.scheduler_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.cluster.create_event(event)
        except Exception as e:  # events are best effort
            log.debug("event %s for %s/%s not written: %s", reason, namespace, name, e)

    async def step(self, name: str) -> None:
        if self.step_hook is not None:
            result = self.step_hook(name)
            if inspect.isawaitable(result):
                await result


class Plugin(Protocol):
    name: ClassVar[str]
    gpu_only: ClassVar[bool]


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, cycle: CycleState) -> Status: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, cycle: CycleState, nodes: NodeSet) -> None: ...


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(self, cycle: CycleState, nodes: NodeSet) -> Status: ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores: ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserved(self, cycle: CycleState, node: str) -> bool: ...

    def reserve(self, cycle: CycleState, node: str) -> Status: ...


@runtime_checkable
class UnreservePlugin(Plugin, Protocol):
    async def unreserve(self, cycle: CycleState, node: str) -> None: ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    max_wait_s: float

    async def permit(self, cycle: CycleState, node: str) -> Status: ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    async def bind(self, cycle: CycleState, node: str) -> Status: ...
