"""The scheduler's side of remote shares' moves (gpupool.api.moves; docs/remote.md, "Moving a share"): where a
share goes, and the bound on how long a move may take.

**Targets** (`MoveTargets`). `gpupool migrate` and `gpupool drain` do not count free memory themselves: they
ask the framework. A question is one cycle of the claim profile (gpupool.scheduler.framework.registry) in
the MOVE phase, for the share's claim as it is allocated (its request, its class's config, its pod), over
the candidate GPUs (GPU servers the command allows: untainted, with a `remoteServer`, not the GPU it is
served from): PreFilter, Filter, then Score picks the node as for a pending claim (the remote tiers first:
the pod's own node, its zone, any) and the policy the GPU there (gpupool.scheduler.framework.choice), so the
target is what the scheduler would choose for the equivalent claim on the same state, and never a GPU that
would go over its capacity or its pod limit. The MOVE phase differs from a claim's cycle only where a moving
share has to: its pod is bound and stays where it runs (pod_pending, remote_tiers), and it is charged to its
queue already (queue_admission). The state is a snapshot: a Ledger of its own, filled from API objects as
the scheduler's watch fills its own (nodes, pods, claims and the moves, each share counted on the GPUs
holding it), so a question never changes the scheduler's ledger. `take` counts a chosen move in the
snapshot (under `<claim UID>/planned`), so that the next question of the same drain sees it. The config is
the scheduler's defaults (the chart's defaultPolicy is the default policy; a pod's `gpupool.io/policy` is
read as for any claim).

**The bound** (`MoveDeadlines`, on the leader): every `interval_s`, the moves in the ledger that are
unfinished past their deadline (gpupool.api.moves: `Move.expired`) are cancelled (`cancel_moves`): written
`failed` with a reason starting `cancelled: `, so the agents serve the share from its source again and the
ledger stops counting it on the target, and a Warning Event `MoveCancelled` says why on the claim (and a
log line). `gpupool migrate --cancel` cancels one at once through the same `cancel_moves`.

**Making room** (`MakeRoom`, config `make_room_moves` = N, 0 (the default): off). When a pending remote claim
fits nowhere (its cycle ends UNSCHEDULABLE, not unresolvable), the claim allocator asks
gpupool.core.moves.plan_moves for the cheapest plan (by GiB moved) of at most N moves of remote shares after
which it fits: over a copy of the ledger's state where only GPUs with a GPU server are usable (the pending
share and every moved one land only on such GPUs), the remote one-GPU claims with no unfinished move the
only movable shares, each moved to another node than the one it leaves (`off_node`: one GPU server serves a
claim on one GPU). The plan's moves are written as any move (`requested`, with the default deadline), a
Normal Event `MakingRoom` on the pending pod says which; the claim is placed by a later pass, once the moved
shares have left (the ledger counts a share at its source until `moved`). One plan at a time: while a move
the scheduler started is unfinished no other is planned, and a claim gets at most MAX_PLANS plans. The
leader's background defragmenter (gpupool.scheduler.defrag) moves the same shares on the same `server_state`
ahead of need.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.api.dra import REMOTE_ISOLATION, ClaimAsk, ClaimError, ClaimShares, claim_shares
from gpupool.api.logsafe import shown
from gpupool.api.moves import DEFAULT_DEADLINE_S, MOVES_CONFIGMAP, GpuRef, Move, MoveError, new_move, read_moves
from gpupool.api.times import format_time
from gpupool.cluster.port import CONFIGMAPS, ApiError, ClusterPort, Conflict, Obj
from gpupool.core.model import MILLI_PER_GPU, PodRequest
from gpupool.core.moves import MovePlan, plan_moves
from gpupool.core.state import BoolArray, ClusterState
from gpupool.scheduler.beat import Beat
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.choice import gpus_on
from gpupool.scheduler.framework.cycle import ClaimInCycle, CycleState, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.registry import CLAIM_PROFILE, build_plugins
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.pending import PendingPods
from gpupool.scheduler.pods import PodCache
from gpupool.scheduler.workload import ObservedWorkload

log = logging.getLogger(__name__)

MAX_PLANS = 3  # plans made for one pending claim (a room taken meanwhile by another claim is planned again)
PLANNED = "/planned"  # the snapshot key of a share counted on its chosen target (MoveTargets.take)
WRITE_TRIES = 10  # conflicting writers (agents, an admin) are outrun this many times, then the next check tries
CHECK_S = 10.0  # how often the leader looks for moves past their deadline


class NotAShare(ValueError):
    """The claim is not a one-GPU remote share (the message says why)."""


@dataclass(frozen=True, slots=True)
class MovingShare:
    """A remote share that would move: its claim (allocated), the pod using it (None: none known), and the GPU
    it is served from now."""

    claim: Obj
    pod: Obj | None
    served: GpuRef

    @property
    def uid(self) -> str:
        return str((self.claim.get("metadata") or {}).get("uid", ""))

    @property
    def label(self) -> str:
        meta = self.claim.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _one_share(claim: Mapping[str, Any]) -> ClaimShares:
    try:
        shares = claim_shares(claim)
    except ClaimError as e:
        raise NotAShare(str(e)) from None
    if shares.isolation != REMOTE_ISOLATION or len(shares.devices) != 1:
        raise NotAShare(f"claim {shares.label} is not a one-GPU share of isolation {REMOTE_ISOLATION}")
    return shares


def move_ask(claim: Mapping[str, Any]) -> tuple[ClaimAsk, tuple[Obj, ...]]:
    """What the allocated remote claim asks, as the claim allocator read it before placing it (its request,
    class, memory and cores, as its allocation consumed them), and its class's config (copied into the
    allocation). Raises NotAShare."""
    shares = _one_share(claim)
    (d,) = shares.devices
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    spec: Mapping[str, Any] = next((r for r in requests if r.get("name") == d.request), {})
    device_class = str((spec.get("exactly") or spec).get("deviceClassName", ""))
    configs = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("config") or []
    mine = tuple(dict(c) for c in configs if c.get("source", "FromClass") == "FromClass"
                 and d.request in (c.get("requests") or [d.request]))
    cores = 100 if d.cores is None else d.cores
    return ClaimAsk(d.request, device_class, 1, d.memory_mib, cores), mine


class MoveTargets:
    """The framework's answers about where remote shares would move, on a state of its own (see the module
    doc). One per command run."""

    def __init__(self, handle: Handle, framework: Framework) -> None:
        self.h = handle
        self.fw = framework
        self._last: tuple[str, CycleState, GpuRef] | None = None  # the last choice: claim UID, its cycle, the GPU

    @classmethod
    def of_objects(cls, cluster: ClusterPort, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                   claims: Iterable[Mapping[str, Any]], moves: Mapping[str, Move],
                   config: SchedulerConfig | None = None, clock: Callable[[], float] = time.time) -> MoveTargets:
        """A snapshot of the API objects, counted as the scheduler's watch counts them."""
        config = config or SchedulerConfig(leader_elect=False)
        ledger = Ledger()
        ledger.replace_nodes(nodes)
        ledger.replace_moves(moves)  # before the claims: each is counted where it is held at once
        ledger.replace_pods(pods)
        ledger.replace_claims(claims)
        handle = Handle(cluster, config, ledger, PodCache(cluster, lookup_timeout_s=config.pod_lookup_timeout_s),
                        BusyNodes(config.lock_timeout_s), PendingPods(clock, max_entries=config.max_pending_pods,
                                                                      ttl_s=config.pending_ttl_s),
                        ObservedWorkload(), SchedulerMetrics(), clock)
        return cls(handle, Framework(handle, build_plugins(handle, CLAIM_PROFILE)))

    @property
    def ledger(self) -> Ledger:
        return self.h.ledger

    def _cycle(self, share: MovingShare, gpus: Mapping[str, frozenset[int]], agents: Iterable[str]) -> CycleState:
        ask, config = move_ask(share.claim)
        meta = share.claim.get("metadata") or {}
        pod = share.pod or {"metadata": {"name": str(meta.get("name", "")), "namespace": str(meta.get("namespace", "")),
                                         "uid": share.uid}, "spec": {}, "status": {}}
        cycle = self.fw.cycle(dict(pod), Phase.MOVE)
        cycle.claim = ClaimInCycle(share.uid + PLANNED, share.label, ask, REMOTE_ISOLATION, config, gpus,
                                   frozenset(agents))
        return cycle

    def choose(self, share: MovingShare, candidates: Mapping[str, Iterable[int]],
               agents: Iterable[str] = ()) -> GpuRef | str:
        """The GPU among `candidates` (node -> GPU indices) the framework chooses for the share (the GPU it is
        served from is never one), or why none fits, in the framework's words. `agents`: the nodes whose
        agent runs (where the pod may run, when its node is not known)."""
        gpus = {n: frozenset(i for i in idx if GpuRef(n, i) != share.served) for n, idx in candidates.items()}
        gpus = {n: idx for n, idx in gpus.items() if idx}
        if not gpus:
            return "no other GPU server"
        try:
            cycle = self._cycle(share, gpus, agents)
        except NotAShare as e:
            return str(e)
        status = self.fw.pre_filter(cycle)
        if not status.ok:
            return status.reason
        nodes = self.fw.filter(cycle, sorted(gpus))
        if not len(nodes):
            why = {**nodes.unresolvable, **nodes.failed}
            return "; ".join(f"{self._room(cycle, n, gpus[n])}{why[n]}" for n in sorted(gpus) if n in why) \
                or "no node fits"
        _, _, node = self.fw.select(cycle, nodes)
        allocation = gpus_on(self.ledger.state, self.h.context(), cycle, node)
        if allocation is None or len(allocation.grants) != 1:
            return f"{node}: no GPU of it takes the share"
        ref = GpuRef(node, allocation.grants[0].index)
        self._last = (share.uid, cycle, ref)
        return ref

    def _room(self, cycle: CycleState, node: str, gpus: frozenset[int]) -> str:
        """For a node asked about one GPU: what that GPU has free and what the share needs there, in words
        (the framework's reason follows)."""
        state, request = self.ledger.state, cycle.request
        i = state.index.get(node)
        if len(gpus) != 1 or i is None or request is None:
            return f"{node}: "
        (j,) = gpus
        if not 0 <= j < len(state.nodes[i].gpus):
            return f"{node}: "
        g = request.gpu
        need = int(state.gpu_mem_total[i, j]) if g.whole else g.memory_on(int(state.gpu_mem_total[i, j]))
        return (f"{GpuRef(node, j)} has {int(state.gpu_milli_free[i, j]) / 10:g} % compute and "
                f"{int(state.gpu_mem_free[i, j])} MiB free, the share needs {min(g.milli, MILLI_PER_GPU) / 10:g} % and "
                f"{need} MiB: ")

    def take(self, share: MovingShare, target: GpuRef) -> str | None:
        """Count the share on `target` in the snapshot too (after `choose` answered `target` for it), so that
        later questions see it there; None, or why the ledger refused."""
        last = self._last
        if last is None or last[0] != share.uid or last[2] != target:
            return f"{target} was not the last choice for claim {share.label}"
        status = self.fw.reserve(last[1], target.node)
        return None if status.ok else status.reason


# --- cancelling moves -----------------------------------------------------------------------------------------


async def read_moves_object(cluster: ClusterPort, namespace: str) -> Obj | None:
    """The moves ConfigMap, listed by name (the scheduler may list and watch that one object)."""
    objs, _ = await cluster.list_objects(CONFIGMAPS, namespace=namespace, fields={"metadata.name": MOVES_CONFIGMAP})
    return objs[0] if objs else None


async def cancel_moves(cluster: ClusterPort, namespace: str,
                       pick: Callable[[Mapping[str, Move]], Mapping[str, str]]) -> dict[str, Move]:
    """Cancel the moves `pick` chooses among the current entries (claim UID -> why); each write is a merge
    patch at the resourceVersion read, so an agent's step in between is read again, and `pick` asked again.
    Returns the entries written (claim UID -> the cancelled move)."""
    for _ in range(WRITE_TRIES):
        cm = await read_moves_object(cluster, namespace)
        if cm is None:
            return {}
        current = read_moves(cm)
        chosen = pick(current)
        written: dict[str, Move] = {}
        for uid, why in chosen.items():
            move = current.get(uid)
            if move is not None and not move.finished:
                written[uid] = move.cancel(why)
        if not written:
            return {}
        try:
            await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP,
                                       {"data": {uid: m.to_json() for uid, m in written.items()}},
                                       namespace=namespace, resource_version=str(cm["metadata"]["resourceVersion"]))
        except Conflict:
            continue
        return written
    raise Conflict(f"{MOVES_CONFIGMAP} kept changing under {WRITE_TRIES} writes")


def past_deadline(moves: Mapping[str, Move], now: float, default_s: float = DEFAULT_DEADLINE_S) -> dict[str, str]:
    """The unfinished moves past their deadline, with why (for `cancel_moves`)."""
    out = {}
    for uid, move in moves.items():
        if move.expired(now, default_s):
            at = move.deadline_at(default_s)
            assert at is not None
            out[uid] = (f"still {move.state} at its deadline {format_time(at)} "
                        f"({waits_for(move)}); the share is served from {move.source} again")
    return out


def waits_for(move: Move) -> str:
    """What an unfinished move waits for, in words."""
    if move.state == "requested":
        return f"the agent of {shown(move.target.node)} to prepare the share on {shown(str(move.target))}"
    return f"the agent of {shown(move.source.node)} to move the share's clients to {shown(str(move.target))}"


async def record_cancelled(handle: Handle, uid: str, move: Move, claims: Mapping[str, Mapping[str, Any]]) -> None:
    """A log line and a Warning Event `MoveCancelled` on the claim (best effort)."""
    reason = move.reason
    log.warning("move of claim %s from %s to %s %s", shown(move.claim), move.source, move.target, shown(reason, 1000))
    claim = claims.get(uid)
    namespace, _, name = move.claim.partition("/")
    api_version = str((claim or {}).get("apiVersion", "resource.k8s.io/v1"))
    await handle.record_event(namespace, name, uid, "MoveCancelled",
                              f"gpupool: move {move.source} -> {move.target} {shown(reason, 900)}", "Warning",
                              kind="ResourceClaim", api_version=api_version)


class MoveDeadlines:
    """On the leader: moves past their deadline are cancelled every `interval_s` (see the module doc)."""

    def __init__(self, handle: Handle, ready: Callable[[], bool], interval_s: float = CHECK_S,
                 default_s: float = DEFAULT_DEADLINE_S) -> None:
        self.h = handle
        self.ready = ready
        self.interval_s = interval_s
        self.default_s = default_s
        self.cancelled = 0  # moves cancelled (tests, metrics)
        self._beat = Beat("move-deadlines", interval_s, ready, self.check_once, (ApiError, MoveError),
                          "moves past their deadline not cancelled")

    async def check_once(self) -> dict[str, Move]:
        """Cancel what is past its deadline now; the moves cancelled."""
        now = self.h.clock()
        if not past_deadline(self.h.ledger.moves, now, self.default_s):  # the watch's copy: no read when idle
            return {}
        done = await cancel_moves(self.h.cluster, self.h.config.own_namespace(),
                                  lambda current: past_deadline(current, now, self.default_s))
        self.cancelled += len(done)
        for uid, move in sorted(done.items()):
            await record_cancelled(self.h, uid, move, self.h.ledger.claim_objs)
        return done

    def start(self) -> None:
        self._beat.start()

    async def stop(self) -> None:
        await self._beat.stop()




# --- making room ----------------------------------------------------------------------------------------------


def movable_shares(ledger: Ledger) -> dict[str, PodRequest]:
    """The remote one-GPU claims the ledger holds with no unfinished move: claim UID -> its request."""
    out = {}
    for uid, claim in ledger.claim_objs.items():
        move = ledger.moves.get(uid)
        entry = ledger.entries.get(uid)
        if (move is not None and not move.finished) or entry is None or len(entry.allocation.grants) != 1:
            continue
        try:
            _one_share(claim)
        except NotAShare:
            continue
        out[uid] = entry.request
    return out


def server_state(state: ClusterState, servers: Mapping[str, Iterable[int]]) -> tuple[ClusterState, BoolArray]:
    """A copy of `state` where only the GPUs of `servers` (node -> GPU indices with a GPU server) are healthy,
    and that mask (MakeRoom's plans and the defragmenter's rounds are made on it)."""
    work = state.copy()
    usable = np.zeros_like(work.gpu_healthy)
    for name, gpus in servers.items():
        i = work.index.get(name)
        if i is not None:
            for j in gpus:
                if 0 <= j < work.width:
                    usable[i, j] = True
    work.gpu_healthy &= usable
    return work, usable


def plan_room(ledger: Ledger, request: PodRequest, servers: Mapping[str, Iterable[int]], max_moves: int,
              policy: str = "") -> MovePlan | None:
    """The cheapest plan of at most `max_moves` moves of remote shares after which `request` (a remote share's,
    as its cycle read it) fits a GPU of `servers` (node -> GPUs with a GPU server); None when there is none."""
    state, _ = server_state(ledger.state, servers)  # only GPUs with a server take the pending share or a moved one
    nodes = np.array(sorted(state.index[n] for n in servers if n in state.index), dtype=np.int64)
    if not len(nodes):
        return None
    return plan_moves(state, request, movable_shares(ledger), max_moves, cost_per_gib=1.0, rank=ledger.rank,
                      nodes=nodes, policy=policy, off_node=True)


async def start_moves(cluster: ClusterPort, namespace: str, entries: Mapping[str, Move]) -> bool:
    """Write new moves (claim UID -> its `requested` move) into the moves ConfigMap, at the resourceVersion
    listed; False when it does not exist (the scheduler may not create it) or a claim's move is unfinished."""
    for _ in range(WRITE_TRIES):
        cm = await read_moves_object(cluster, namespace)
        if cm is None:
            log.warning("no %s in %s: the scheduler cannot start moves", MOVES_CONFIGMAP, namespace)
            return False
        current = read_moves(cm)
        if any(uid in current and not current[uid].finished for uid in entries):
            return False
        try:
            await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP,
                                       {"data": {uid: m.to_json() for uid, m in entries.items()}},
                                       namespace=namespace, resource_version=str(cm["metadata"]["resourceVersion"]))
        except Conflict:
            continue
        return True
    return False


class MakeRoom:
    """Moves remote shares to make room for a pending remote claim that fits nowhere (see the module doc)."""

    def __init__(self, handle: Handle, max_moves: int, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.h = handle
        self.max_moves = max_moves
        self.deadline_s = deadline_s
        self.plans: dict[str, int] = {}  # pending claim UID -> plans made for it
        self.in_flight: dict[str, str] = {}  # claim UID moved -> the pending claim it makes room for
        self.started = 0  # moves started (tests, metrics)

    async def make_room(self, cycle: CycleState) -> str | None:
        """After the claim's cycle found no node: start the moves of a plan, or say that moves started
        earlier are still under way; None when there is nothing to do (off, not a remote claim, no plan)."""
        claim, request = cycle.claim, cycle.request
        if self.max_moves <= 0 or claim is None or request is None or claim.isolation != REMOTE_ISOLATION:
            return None
        moves = self.h.ledger.moves
        busy = [u for u in self.in_flight if u in moves and not moves[u].finished]
        if busy:
            for_this = sum(self.in_flight[u] == claim.uid for u in busy)
            return (f"{len(busy)} move(s) the scheduler started to make room are under way"
                    f"{f', {for_this} of them for this claim' if for_this else ''}")
        self.in_flight.clear()
        if self.plans.get(claim.uid, 0) >= MAX_PLANS:
            return None
        plan = plan_room(self.h.ledger, request, claim.gpus, self.max_moves,
                         cycle.policy.name if cycle.policy is not None else "")
        if plan is None:
            return None
        now = self.h.clock()
        entries = {m.key: new_move(self.h.ledger.entries[m.key].key, GpuRef(*m.source), GpuRef(*m.target), now,
                                   self.deadline_s) for m in plan.moves}
        if not await start_moves(self.h.cluster, self.h.config.own_namespace(), entries):
            return None
        if len(self.plans) >= 10_000:  # bounded: a forgotten count only allows one more plan
            self.plans.clear()
        self.plans[claim.uid] = self.plans.get(claim.uid, 0) + 1
        self.in_flight = dict.fromkeys(entries, claim.uid)
        self.started += len(entries)
        what = ", ".join(f"claim {shown(m.claim)} {m.source} -> {m.target}" for m in entries.values())
        said = (f"moving {len(entries)} remote share(s) ({plan.gib:.2f} GiB) to make room for claim "
                f"{shown(claim.key)}: {what}")
        log.info("%s", said)
        meta = cycle.pod.get("metadata") or {}
        await self.h.record_event(str(meta.get("namespace", "")), str(meta.get("name", "")), cycle.uid, "MakingRoom",
                                  f"gpupool: {said}"[:1024], "Normal")
        return said
