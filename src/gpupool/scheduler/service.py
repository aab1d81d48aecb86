"""The extender's decisions: filter, prioritize and bind, over the ledger, plus the watch loops that keep
the ledger in step with the API server.

Filter and prioritize are synchronous and read only the ledger (no API calls), so they stay in the low
milliseconds. Bind re-validates against the ledger and then writes, in this order:
  assume (ledger) -> node bind lock -> Binding carrying the pod annotation gpupool.io/allocation.
The lock write carries the node's resourceVersion (a 409 means re-read the node and decide again); a 409
on the Binding means the pod was bound meanwhile, which succeeds only if it was this very decision.
A replayed bind for the same pod UID and node finds the pod bound with its allocation and succeeds without
writing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from gpupool.api.allocation import encode_allocation
from gpupool.api.extender import (
    MAX_EXTENDER_PRIORITY,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    NodeList,
)
from gpupool.api.lock import ANN_BIND_LOCK, BindLock, LockError, decode_lock, encode_lock, format_time
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.pod import ParsedPod, parse_pod, pod_key, wants_gpu
from gpupool.cluster.port import ApiError, ClusterPort, Conflict, Gone, NotFound, Obj, WatchEvent
from gpupool.core.fit import check
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.placement import Placement, Scored, best, place, score_nodes
from gpupool.core.policies import UnknownPolicy, get_policy
from gpupool.core.policy import Policy, PolicyContext
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.ledger import Ledger, counted_allocation, grants_signature, recompute
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.workload import ObservedWorkload

log = logging.getLogger(__name__)

# Called after each bind step: "assumed", "locked", "bound" (fault injection in tests; may be
# a coroutine function).
StepHook = Callable[[str], Any]


OFFERED_MAX = 1024  # pod objects kept from scheduling cycles for their bind


class BindFailed(Exception):
    """A bind that cannot go ahead; the message is returned to kube-scheduler."""


class ExtenderService:
    def __init__(
        self,
        cluster: ClusterPort,
        config: SchedulerConfig,
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        step_hook: StepHook | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.metrics = metrics or SchedulerMetrics()
        self.clock = clock
        self.step_hook = step_hook
        self.ledger = Ledger()
        self.busy = BusyNodes()
        self.workload = ObservedWorkload()
        self.synced = False
        self.leading = not config.leader_elect
        self._ctx = PolicyContext()
        self._ctx_generation = -1
        self._policies: dict[str, Policy] = {}
        self._node_mutex: dict[str, asyncio.Lock] = {}
        self._node_waiters: dict[str, asyncio.Event] = {}  # binds waiting for a node's lock to change
        self._binding: dict[str, int] = {}  # pod UID -> binds of it in progress
        # The pod objects of the latest scheduling cycles (kube-scheduler sends them whole): bind uses
        # them instead of reading the pod again. Bounded: cycles whose bind never comes fall out.
        self._offered: OrderedDict[str, Obj] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        # GPU pods that fit nowhere at their last filter: key -> (why, first seen); for the pool views.
        self.pending: dict[str, tuple[str, float]] = {}
        self.metrics.track_ledger(
            lambda: len(self.ledger.assumed()),
            lambda: len(self.ledger.confirmed()),
            lambda: self.ledger.state.total_gpus,
        )
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)

    # --- lifecycle ------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.synced and self.leading

    async def start(self) -> None:
        """List nodes and pods into the ledger, then follow their watch streams."""
        self._stopping = False
        nodes, node_rv = await self.cluster.list_nodes()
        pods, pod_rv = await self.cluster.list_pods()
        self.ledger.replace_nodes(nodes)
        self.ledger.replace_pods(pods)
        self.workload.seed(e.request for e in self.ledger.entries.values())
        self.synced = True
        log.info("ledger synced: %d gpupool nodes, %d GPUs, %d allocations",
                 len(self.ledger.state), self.ledger.state.total_gpus, len(self.ledger.entries))
        self._tasks = [
            asyncio.create_task(self._reflect("node", node_rv)),
            asyncio.create_task(self._reflect("pod", pod_rv)),
            asyncio.create_task(self._expire_loop()),
        ]

    async def stop(self) -> None:
        self._stopping = True
        self.synced = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []

    async def resync(self) -> None:
        """Start over from a fresh list (a new leadership term must not trust an old cache)."""
        await self.stop()
        await self.start()

    async def _reflect(self, kind: str, resource_version: str) -> None:
        watch: Callable[[str], AsyncIterator[WatchEvent]]
        lister: Callable[[], Awaitable[tuple[list[Obj], str]]]
        apply: Callable[[str, Mapping[str, Any]], object]
        replace: Callable[[list[Obj]], None]
        if kind == "node":
            watch, lister = self.cluster.watch_nodes, self.cluster.list_nodes
            apply, replace = self.ledger.apply_node, self.ledger.replace_nodes
        else:
            watch, lister = self.cluster.watch_pods, self.cluster.list_pods
            apply, replace = self.ledger.apply_pod, self.ledger.replace_pods
        rv = resource_version
        backoff = 0.1
        while not self._stopping:
            try:
                async for event in watch(rv):
                    apply(event.type, event.object)
                    if kind == "pod":
                        self._pod_event(event)
                    else:
                        self.busy.on_node(event.object)
                        self._wake(str(event.object["metadata"]["name"]))
                    rv = str(event.object["metadata"]["resourceVersion"])
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s watch expired; listing again", kind)
                objs, rv = await lister()
                replace(objs)
            except Exception as e:  # keep following: a broken watch must not stop the service
                log.warning("%s watch failed (%s); retrying in %.1fs", kind, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _pod_event(self, event: WatchEvent) -> None:
        node = (event.object.get("spec") or {}).get("nodeName")
        if event.type == "DELETED" or node:
            self.pending.pop(pod_key(event.object), None)
        self.busy.on_pod(event.type, event.object)
        if event.type == "DELETED":  # a bind for it must see it gone (or re-created), not the old copy
            self._offered.pop(str(event.object["metadata"].get("uid")), None)
        if node:
            # A pod on this node changed: if it was the lock holder and now runs, a waiting bind may go.
            self._wake(str(node))

    def _wake(self, node: str) -> None:
        """Wake the binds waiting for this node's lock (they re-read the node and the holder)."""
        waiter = self._node_waiters.pop(node, None)
        if waiter is not None:
            waiter.set()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.expire_interval_s)
            forgotten = self.ledger.expire(self.clock())
            if forgotten:
                self.metrics.forgotten.inc(len(forgotten))

    # --- helpers --------------------------------------------------------------------------------------

    def _context(self) -> PolicyContext:
        if self._ctx_generation != self.ledger.generation or self._ctx.workload is not self.workload.current:
            # Node set or observed workload changed: per-node policy caches and the tie-break rank are stale.
            self._ctx = PolicyContext(rng=np.random.default_rng(0), rank=self.ledger.rank,
                                      workload=self.workload.current)
            self._ctx_generation = self.ledger.generation
        return self._ctx

    def _policy(self, request: PodRequest) -> Policy:
        name = request.policy or self.config.default_policy
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = get_policy(name)
        return policy

    def _parse(self, pod: Mapping[str, Any]) -> tuple[ParsedPod, str | None]:
        """The parsed pod and, if it cannot be placed anywhere, why."""
        parsed = parse_pod(pod)
        if parsed.errors or parsed.request is None:
            return parsed, "invalid request: " + "; ".join(parsed.errors)
        problems = parsed.request.problems()
        if problems:
            return parsed, "invalid request: " + "; ".join(problems)
        try:
            self._policy(parsed.request)
        except UnknownPolicy as e:
            return parsed, f"invalid request: {e}"
        return parsed, None

    def _known(self, names: list[str]) -> tuple[list[int], list[str], dict[str, str]]:
        """Indices of gpupool nodes among `names` (with their names), and reasons for the others."""
        index = self.ledger.state.index
        try:
            return list(map(index.__getitem__, names)), names, {}  # the common case, at C speed
        except KeyError:
            found = [index.get(n, -1) for n in names]
        idx: list[int] = []
        known: list[str] = []
        unknown: dict[str, str] = {}
        for name, i in zip(names, found, strict=True):
            if i < 0:
                err = self.ledger.node_errors.get(name)
                unknown[name] = err or "node has no gpupool inventory (no gpupool agent on it)"
            else:
                idx.append(i)
                known.append(name)
        return idx, known, unknown

    # --- filter ---------------------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        names = args.node_names()
        if not wants_gpu(args.Pod):
            return self._filter_result(args, names, {}, {})
        if not self.ready:
            empty: list[str] | None = [] if args.Nodes is None else None
            return ExtenderFilterResult(NodeNames=empty, Error="gpupool scheduler not ready")
        parsed, invalid = self._parse(args.Pod)
        if invalid is not None or parsed.request is None:
            return self._filter_result(args, [], {}, {n: invalid or "invalid request" for n in names})
        self._new_cycle(args.Pod)
        idx, known, unresolvable = self._known(names)
        request = parsed.request
        self.workload.observe(str((args.Pod.get("metadata") or {}).get("uid", pod_key(args.Pod))), request)
        fit = check(self.ledger.state, request, np.asarray(idx, dtype=np.int64))
        ok = fit.code == 0
        if int(ok.sum()) == 1:
            # kube-scheduler skips prioritize when one node is left: reserve it here instead.
            self._nominate(args.Pod, request, int(fit.nodes[int(np.flatnonzero(ok)[0])]))
        if ok.any():
            self.pending.pop(pod_key(args.Pod), None)
        else:
            self._note_pending(args.Pod, fit.reason(0, request) if len(fit.nodes) else "no gpupool node offered")
        if ok.all():
            return self._filter_result(args, known, {}, unresolvable)
        # Reasons depend only on (code, number of fitting GPUs): write each distinct one once.
        bad = np.flatnonzero(~ok)
        keys = fit.code[bad] * 1024 + fit.gpu_fit[bad].sum(axis=1)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        texts = [fit.reason(int(bad[f]), request) for f in first]
        feasible = [known[k] for k in np.flatnonzero(ok).tolist()]
        failed = dict(zip([known[k] for k in bad.tolist()], [texts[j] for j in inverse.tolist()], strict=True))
        return self._filter_result(args, feasible, failed, unresolvable)

    def _note_pending(self, pod: Mapping[str, Any], example: str) -> None:
        """Remember why a GPU pod fits nowhere (one node's reason as the example) and since when."""
        key = pod_key(pod)
        since = self.pending.get(key, ("", self.clock()))[1]
        self.pending[key] = (f"fits no node, e.g. {example}", since)

    @staticmethod
    def _filter_result(
        args: ExtenderArgs, feasible: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> ExtenderFilterResult:
        if args.Nodes is not None and args.NodeNames is None:
            keep = set(feasible)
            items = [n for n in args.Nodes.items if (n.get("metadata") or {}).get("name") in keep]
            return ExtenderFilterResult(
                Nodes=NodeList(items=items), FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable
            )
        # Built from our own values: no need to validate thousands of names again.
        return ExtenderFilterResult.model_construct(
            Nodes=None, NodeNames=feasible, FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable, Error=""
        )

    # --- prioritize -----------------------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        """Scores 0..10: the node the policy would pick gets 10, the others the policy's score scaled to
        0..9 (so kube-scheduler, summing weighted scores, follows the policy including its tie-break).
        Nodes scoring 0 are left out of the answer: kube-scheduler adds nothing for a host the extender
        does not list, and the answer stays small on large clusters. Returns (host, score) pairs."""
        names = args.node_names()
        scores: dict[str, int] = {}
        if not wants_gpu(args.Pod) or not self.ready:
            return []
        parsed, invalid = self._parse(args.Pod)
        if invalid is not None or parsed.request is None:
            return []
        self._new_cycle(args.Pod)
        idx, _, _ = self._known(names)
        ctx = self._context()
        scored = score_nodes(
            self.ledger.state, parsed.request, self._policy(parsed.request), ctx, np.asarray(idx, dtype=np.int64)
        )
        if len(scored.feasible):
            s = scored.scores.astype(np.float64)
            lo, hi = float(s.min()), float(s.max())
            scaled = np.floor((s - lo) / (hi - lo) * (MAX_EXTENDER_PRIORITY - 1)) if hi > lo else np.zeros(len(s))
            node_names = self.ledger.state.nodes
            keep = np.flatnonzero(scaled > 0)
            scores = dict(zip([node_names[i].name for i in scored.feasible[keep].tolist()],
                              scaled[keep].astype(np.int64).tolist(), strict=True))
            winner = int(scored.feasible[best(self._without_busy(scored), ctx)])
            scores[node_names[winner].name] = MAX_EXTENDER_PRIORITY
            self._nominate(args.Pod, parsed.request, winner)
        return list(scores.items())

    def _without_busy(self, scored: Scored) -> Scored:
        """The same scores with busy nodes (gpupool.scheduler.busy) out of the running, unless all are."""
        busy = self.busy.names(self.clock()) if self.config.avoid_busy_nodes else set()
        if not busy:
            return scored
        index = self.ledger.state.index
        mask = np.isin(scored.feasible, [index[n] for n in busy if n in index])
        if mask.all():
            return scored
        return Scored(scored.fit, scored.feasible, np.where(mask, -np.inf, scored.scores))

    # --- nomination: reserving the node a scheduling cycle is about to bind -----------------------------

    def _new_cycle(self, pod: Mapping[str, Any]) -> None:
        """A filter or prioritize for a pod starts a new scheduling cycle for it: a reservation left from
        an earlier cycle (whose bind failed or never came) is void and must not count against it."""
        uid = (pod.get("metadata") or {}).get("uid")
        if uid and uid in self.ledger.entries and uid not in self._binding:
            self.ledger.forget(str(uid))
        if uid:
            self._offered[str(uid)] = dict(pod)
            self._offered.move_to_end(str(uid))
            if len(self._offered) > OFFERED_MAX:
                self._offered.popitem(last=False)

    def _nominate(self, pod: Mapping[str, Any], request: PodRequest, node: int) -> None:
        """Reserve (as an assumed entry with a short deadline) the GPUs the pod will get on the node it is
        about to be bound to, so that the filters of the pods scheduled meanwhile see them taken. kube-
        scheduler binds asynchronously; without this, every pod filtered before the previous bind landed
        would race for the same GPUs and lose at bind time. The bind takes the reservation over; if it goes
        to another node, or never comes, the reservation is dropped (deadline `nominate_timeout_s`)."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        result = place(
            self.ledger.state, request, self._policy(request), self._context(), np.asarray([node], dtype=np.int64)
        )
        if isinstance(result, Placement):
            deadline = self.clock() + self.config.nominate_timeout_s
            if self.ledger.assume(str(uid), pod_key(pod), request, result.allocation, deadline) is None:
                self.busy.nominated(str(uid), result.allocation.node, deadline)

    # --- bind -----------------------------------------------------------------------------------------

    async def _step(self, name: str) -> None:
        if self.step_hook is not None:
            result = self.step_hook(name)
            if inspect.isawaitable(result):
                await result

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        # While a bind runs (even one kube-scheduler gave up waiting for), a new cycle of the same pod
        # must not drop the reservation that bind is writing.
        self._binding[args.PodUID] = self._binding.get(args.PodUID, 0) + 1
        try:
            await self._bind(args)
        except BindFailed as e:
            self.busy.release(args.PodUID)  # its node is no longer waiting for this pod
            self.metrics.binds.labels("failed").inc()
            await self._event(args, "FailedBinding", str(e), "Warning")
            return ExtenderBindingResult(Error=str(e))
        except ApiError as e:
            self.busy.release(args.PodUID)
            self.metrics.binds.labels("error").inc()
            return ExtenderBindingResult(Error=f"API error while binding: {e}")
        finally:
            left = self._binding.pop(args.PodUID) - 1
            if left:
                self._binding[args.PodUID] = left
        self.metrics.binds.labels("bound").inc()
        return ExtenderBindingResult()

    async def _event(self, args: ExtenderBindingArgs, reason: str, message: str, type_: str) -> None:
        now = format_time(self.clock())
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{args.PodName}.", "namespace": args.PodNamespace},
            "involvedObject": {"kind": "Pod", "namespace": args.PodNamespace, "name": args.PodName, "uid": args.PodUID},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.config.scheduler_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(Exception):  # events are best effort
            await self.cluster.create_event(event)

    async def _read_pod(self, args: ExtenderBindingArgs) -> Obj:
        where = f"{args.PodNamespace}/{args.PodName}"
        try:
            pod = await self.cluster.get_pod(args.PodNamespace, args.PodName)
        except NotFound:
            raise BindFailed(f"pod {where} no longer exists") from None
        uid = pod["metadata"].get("uid")
        if uid != args.PodUID:
            raise BindFailed(f"pod {where} was re-created (UID {uid}, bind is for {args.PodUID}); not binding")
        if pod["metadata"].get("deletionTimestamp"):
            raise BindFailed(f"pod {where} is being deleted")
        return pod

    def _already_bound(self, pod: Obj, node: str) -> bool:
        """True for a replayed bind that already took effect; raises if the pod went elsewhere."""
        bound = (pod.get("spec") or {}).get("nodeName")
        if not bound:
            return False
        counted = counted_allocation(pod)
        if bound == node and (counted is not None or not wants_gpu(pod)):
            if counted is not None:
                self.ledger.apply_pod("MODIFIED", pod)
            return True
        raise BindFailed(f"pod {pod_key(pod)} is already bound to {bound}")

    async def _bind(self, args: ExtenderBindingArgs) -> None:
        if not self.ready:
            raise BindFailed("gpupool scheduler not ready (cache not synced or not the leader)")
        pod = self._offered.pop(args.PodUID, None)
        if pod is None or pod_key(pod) != f"{args.PodNamespace}/{args.PodName}":
            # A replayed bind or one for a pod this process did not filter: ask the API server. (The copy
            # kube-scheduler sent is as fresh as its informer; a pod bound meanwhile makes the Binding a 409,
            # and a deleted one a 404 or "being deleted": both end as a failed bind.)
            pod = await self._read_pod(args)
        if self._already_bound(pod, args.Node):
            return
        if not wants_gpu(pod):
            await self._create_binding(args)
            return
        mutex = self._node_mutex.setdefault(args.Node, asyncio.Lock())
        waited = mutex.locked()
        async with mutex:  # our own binds to one node go one at a time (they share its lock)
            if waited:
                # Another bind (perhaps this very one, replayed) went first: decide on a fresh read.
                pod = await self._read_pod(args)
                if self._already_bound(pod, args.Node):
                    return
            allocation = self._decide(pod, args)
            await self._step("assumed")
            try:
                await self._write(pod, args, allocation)
            except Exception:
                # (A BaseException, e.g. a simulated crash, skips this: like a killed process.)
                self.ledger.forget(args.PodUID)
                raise
            self.busy.locked(args.PodUID, args.Node, self.clock() + self.config.lock_timeout_s)

    def _decide(self, pod: Obj, args: ExtenderBindingArgs) -> Allocation:
        parsed, invalid = self._parse(pod)
        if invalid is not None or parsed.request is None:
            raise BindFailed(f"pod {pod_key(pod)}: {invalid}")
        request = parsed.request
        entry = self.ledger.entries.get(args.PodUID)
        if entry is not None and entry.allocation.node == args.Node:
            # A retried bind finds its own reservation: keep it, with a fresh deadline.
            entry.deadline = self.clock() + self.config.assume_timeout_s
            return entry.allocation
        if entry is not None:
            self.ledger.forget(args.PodUID)
        i = self.ledger.state.index.get(args.Node)
        if i is None:
            reason = self.ledger.node_errors.get(args.Node) or "node has no gpupool inventory"
            raise BindFailed(f"cannot bind {pod_key(pod)} to {args.Node}: {reason}")
        result = place(
            self.ledger.state, request, self._policy(request), self._context(), np.asarray([i], dtype=np.int64)
        )
        if not isinstance(result, Placement):
            raise BindFailed(f"pod {pod_key(pod)} no longer fits on {args.Node}: {result.summary()}")
        refused = self.ledger.assume(
            args.PodUID, pod_key(pod), request, result.allocation, self.clock() + self.config.assume_timeout_s
        )
        if refused is not None:
            raise BindFailed(f"pod {pod_key(pod)} cannot be reserved on {args.Node}: {refused}")
        return self.ledger.entries[args.PodUID].allocation

    async def _write(self, pod: Obj, args: ExtenderBindingArgs, allocation: Allocation) -> None:
        """Lock, then bind with the allocation annotation in the Binding (the API server writes both in one
        step, so no pod is ever bound without its allocation or annotated but unbound). On failure (not a
        crash) release the lock, best effort."""
        await self._acquire_lock(args)
        await self._step("locked")
        text = encode_allocation(allocation, args.PodUID, parse_pod(pod).isolation, format_time(self.clock()))
        try:
            try:
                await self._create_binding(args, {ANN_ALLOCATION: text})
            except Conflict:
                self.metrics.conflicts.labels("pod").inc()
                fresh = await self._read_pod(args)
                counted = counted_allocation(fresh)
                ok = (fresh.get("spec") or {}).get("nodeName") == args.Node and counted is not None
                if not (ok and grants_signature(counted.allocation) == grants_signature(allocation)):  # type: ignore[union-attr]
                    raise BindFailed(f"pod {pod_key(fresh)} was bound elsewhere meanwhile") from None
            await self._step("bound")
        except Exception:
            with contextlib.suppress(Exception):
                await self._release_lock(args.Node, args.PodUID)
            raise

    async def _create_binding(self, args: ExtenderBindingArgs, annotations: dict[str, str] | None = None) -> None:
        try:
            await self.cluster.create_binding(args.PodNamespace, args.PodName, args.PodUID, args.Node, annotations)
        except NotFound:
            raise BindFailed(f"pod {args.PodNamespace}/{args.PodName} no longer exists") from None

    # --- node bind lock (format and rules: gpupool.api.lock) ------------------------------------------

    async def _may_take_over(self, held: BindLock) -> bool:
        if self.clock() - held.taken_at() > self.config.lock_timeout_s or self.busy.was_served(
            held.pod_uid, self.clock()
        ):
            return True
        try:
            holder = await self.cluster.get_pod(held.namespace, held.name)
        except NotFound:
            return True
        if holder["metadata"].get("uid") != held.pod_uid or holder["metadata"].get("deletionTimestamp"):
            return True
        return (holder.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")

    async def _acquire_lock(self, args: ExtenderBindingArgs) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lock_wait_s  # a duration: monotonic, not the wall clock
        delay = 0.05
        # First the watch's copy (usually current, as binds avoid busy nodes): a decision on a stale copy ends
        # in a write with its resourceVersion, hence a 409; only "we hold it already" needs a fresh read.
        cached: Obj | None = self.ledger.node_objs.get(args.Node)
        while True:
            node = cached or await self.cluster.get_node(args.Node)
            fresh, cached = cached is None, None
            text = (node["metadata"].get("annotations") or {}).get(ANN_BIND_LOCK)
            if text:
                try:
                    held: BindLock | None = decode_lock(text)
                except LockError as e:
                    log.warning("node %s: replacing unreadable bind lock: %s", args.Node, e)
                    held = None
                if held is not None and held.pod_uid == args.PodUID:
                    if fresh:
                        return
                    continue
                if held is not None and not await self._may_take_over(held):
                    if loop.time() >= deadline:
                        raise BindFailed(
                            f"node {args.Node} is locked by pod {held.namespace}/{held.name} since {held.time} "
                            "(waiting for its device allocation); retry later"
                        )
                    # Wake up when the watch shows the node changed (or poll, should the watch lag).
                    waiter = self._node_waiters.setdefault(args.Node, asyncio.Event())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(waiter.wait(), timeout=delay)
                    delay = min(delay * 2, 0.2)
                    continue
            lock = encode_lock(args.PodUID, args.PodNamespace, args.PodName, self.clock())
            try:
                await self.cluster.patch_node_annotations(
                    args.Node, {ANN_BIND_LOCK: lock}, resource_version=node["metadata"]["resourceVersion"]
                )
                return
            except Conflict:
                self.metrics.conflicts.labels("node").inc()  # re-read and decide again

    async def _release_lock(self, node_name: str, uid: str) -> None:
        for _ in range(5):
            node = await self.cluster.get_node(node_name)
            text = (node["metadata"].get("annotations") or {}).get(ANN_BIND_LOCK)
            try:
                if not text or decode_lock(text).pod_uid != uid:
                    return
            except LockError:
                return
            try:
                await self.cluster.patch_node_annotations(
                    node_name, {ANN_BIND_LOCK: None}, resource_version=node["metadata"]["resourceVersion"]
                )
                return
            except Conflict:
                self.metrics.conflicts.labels("node").inc()

    # --- debug ----------------------------------------------------------------------------------------

    async def debug_ledger(self) -> dict[str, Any]:
        nodes, _ = await self.cluster.list_nodes()
        pods, _ = await self.cluster.list_pods()
        truth = recompute(nodes, pods)
        workload = [
            {"cpu_milli": t.cpu_milli, "gpu_milli": t.gpu_milli, "gpu_count": t.gpu_count,
             "models": sorted(t.models), "weight": round(t.weight, 4)}
            for t in self.workload.current
        ]
        return {"ready": self.ready, "ledger": self.ledger.dump(), "diff": self.ledger.diff(truth),
                "workload": workload}

