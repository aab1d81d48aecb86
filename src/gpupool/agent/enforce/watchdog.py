"""The watchdog: a second line outside the container, behind isolation `hook`.

The interception library enforces a container's share from inside the container, which a static binary,
direct ioctls on /dev/nvidia*, or a tampered accounting file can get around. The watchdog looks from the
host instead: every `watchdog_poll_s` (at most 1 s) it asks the driver, through the agent's discovery
backend (NVML or the fake), which host PIDs hold how much memory on each GPU and how much of its SMs each
used; maps every PID to its pod and container through /proc/<pid>/cgroup (gpupool.agent.enforce.procs); and holds
every container of a pod whose isolation strategy asks for it (`Isolation.second_line`: hook) to its grant:

- memory: when a container's processes hold more on a GPU than its grant there (plus
  `watchdog_memory_slack_mib`), its largest processes on that GPU are stopped (SIGKILL, through a pidfd
  after checking the cgroup again) until the rest fits: the next poll after the excess, so within
  `watchdog_poll_s` + the time of one poll (< 2 s). Other containers and pods are never touched. With
  `watchdog_memory_action: report`, nothing is stopped.
- compute: when a container's processes use more than its cores plus `watchdog_compute_margin` points
  for `watchdog_compute_after_s` in a row, it is reported once per episode (default), or its processes on
  that GPU are stopped (`watchdog_compute_action: kill`). Pods in `elastic` cores mode are not held to
  their cores (they may borrow idle time).

Each action is a Kubernetes Event on the pod (reason GPUMemoryOverGrant / GPUComputeOverGrant), a warning
in the log, and the counters gpupool_watchdog_kills_total{reason} / gpupool_watchdog_reports_total{reason}
on the agent's /metrics. A process inside no container of the grant's pod (another scheduler's pod, a host
process) is never judged. What it cannot catch is in docs/agent.md ("The watchdog").

The decisions are pure functions (`memory_victims`) of what one poll saw; the clock is passed to `tick`,
so tests drive it without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DiscoveryBackend, DiscoveryError
from gpupool.agent.enforce.procs import Killer, PidfdKiller, ProcRef, ProcTable, bare_container_id
from gpupool.agent.identify import gpu_containers
from gpupool.agent.isolation.base import Isolation, mode_of
from gpupool.agent.port import AgentCluster
from gpupool.agent.state.hookdir import parse_cores_mode
from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.times import format_time

log = logging.getLogger("gpupool.agent.watchdog")

MEMORY, COMPUTE = "memory", "compute"
REASONS = {MEMORY: "GPUMemoryOverGrant", COMPUTE: "GPUComputeOverGrant"}
POD_WIDE = ""  # the container key of a process whose container cannot be told (held to the pod's total)
# A killed process stays listed by the driver until its context is torn down (tens of ms to seconds): its
# memory is not counted again for this long, so one excess never costs the container a second process.
KILL_GRACE_S = 10.0
# The node's pods are read again this often, and at once (at most once a poll) when a GPU process runs in
# a pod the last list did not have: a new pod is judged from its first poll.
REFRESH_S = 10.0
# A poll waits this long at most for the pod list it asked for, then judges by the last one (the list goes
# on and is used from the next poll): a slow API server never delays acting on the pods already known.
REFRESH_WAIT_S = 0.5
_FINISHED = ("Succeeded", "Failed")
_MAX_MESSAGE = 1000  # Event messages are bounded (the API server refuses huge ones; people read them)


@dataclass(frozen=True, slots=True, order=True)
class ShareKey:
    """One container's share of one GPU (container POD_WIDE: the pod's GPU containers together)."""

    pod_uid: str
    container: str
    gpu: str


@dataclass(frozen=True, slots=True)
class Limit:
    memory_mib: float
    cores: float
    elastic: bool  # cores mode elastic: may borrow idle time, so not held to its cores


@dataclass(frozen=True, slots=True)
class Tenant:
    """A pod of this node that the watchdog holds to its grant."""

    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str]  # container ID (bare) -> container name
    gpu_containers: tuple[str, ...]
    limits: Mapping[tuple[str, str], Limit]  # (container, GPU) -> grant; POD_WIDE for the pod's total
    pod_wide: bool = False  # a pod served through DRA claims: its claims' shares hold all its processes together

    def key(self, ref: ProcRef, gpu: str) -> ShareKey:
        """Which share a process of this pod counts against: its container's when the cgroup names a
        known container, the only GPU container's when there is one, else the pod's total."""
        if self.pod_wide:
            return ShareKey(self.uid, POD_WIDE, gpu)
        name = self.containers.get(ref.container_id or "")
        if name is None:
            name = self.gpu_containers[0] if len(self.gpu_containers) == 1 else POD_WIDE
        return ShareKey(self.uid, name, gpu)

    def limit(self, key: ShareKey) -> Limit:
        # a container (or GPU) without a grant may hold nothing: the tenant's GPUs are promised to others
        return self.limits.get((key.container, key.gpu), Limit(0.0, 0.0, elastic=False))


@dataclass(frozen=True, slots=True)
class Seen:
    """One process on one GPU at one poll, as the driver and /proc report it."""

    gpu: str
    pid: int  # host PID
    ref: ProcRef | None  # its pod and container; None outside pods, or not visible under the agent's /proc
    used_mib: float
    sm_percent: float


@dataclass(frozen=True, slots=True)
class Use:
    """What one process held and used on one GPU at one poll."""

    key: ShareKey
    pid: int
    ref: ProcRef
    used_mib: float
    sm_percent: float


@dataclass(frozen=True, slots=True)
class Action:
    """What one poll did about one share: `kill` (the PIDs signalled) or `report`."""

    reason: str  # MEMORY or COMPUTE
    kind: str  # "kill" or "report"
    key: ShareKey
    used: float  # MiB (memory) or percent (compute)
    limit: float
    pids: tuple[int, ...]


@dataclass
class WatchdogStats:
    polls: int = 0
    kills: dict[str, int] = field(default_factory=lambda: {MEMORY: 0, COMPUTE: 0})  # processes stopped
    reports: dict[str, int] = field(default_factory=lambda: {MEMORY: 0, COMPUTE: 0})  # excesses only reported
    unmapped: int = 0  # GPU processes of the last poll whose /proc entry could not be read
    errors: int = 0


def pod_claims(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims (namespace/name) a pod uses: named ones, and those made from its templates."""
    ns = str((pod.get("metadata") or {}).get("namespace", ""))
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or [] if isinstance(s, Mapping)}
    names = [r.get("resourceClaimName") or made.get(r.get("name"))
             for r in (pod.get("spec") or {}).get("resourceClaims") or [] if isinstance(r, Mapping)]
    return [f"{ns}/{n}" for n in names if n]


def _claim_tenant(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Limit]]) -> Tenant | None:
    """A pod whose GPUs come from prepared claims with a second line: held, all its processes together, to
    the sum of its claims' shares on each GPU (a claim several pods share holds each of them to all of it:
    the library holds them together)."""
    limits: dict[tuple[str, str], Limit] = {}
    for label in pod_claims(pod):
        for gpu, lim in (claims.get(label) or {}).items():
            total = limits.get((POD_WIDE, gpu), Limit(0.0, 0.0, lim.elastic))
            limits[(POD_WIDE, gpu)] = Limit(total.memory_mib + lim.memory_mib, total.cores + lim.cores, lim.elastic)
    if not limits:
        return None
    meta = pod.get("metadata") or {}
    return Tenant(str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", "")), {}, (),
                  limits, pod_wide=True)


def tenants_of(pods: Iterable[Mapping[str, Any]], node: str, strategies: Mapping[str, Isolation],
               default_isolation: str, claims: Mapping[str, Mapping[str, Limit]] | None = None) -> dict[str, Tenant]:
    """The pods of `node` that are not finished, carry an allocation, and whose isolation strategy asks
    for the second line, by UID; and those whose GPUs come from prepared DRA claims with a second line
    (`claims`: namespace/name -> GPU UUID -> share). Pods being deleted are kept: their processes run until
    they stop."""
    out: dict[str, Tenant] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or (pod.get("status") or {}).get("phase") in _FINISHED:
            continue
        text = annotations.get(ANN_ALLOCATION)
        if not text:
            claim_tenant = _claim_tenant(pod, claims or {})
            if claim_tenant is not None:
                out[claim_tenant.uid] = claim_tenant
            continue
        try:
            doc = decode_allocation(text)
        except AllocationError:
            continue
        strategy = strategies.get(mode_of(doc, default_isolation))
        if strategy is None or not strategy.second_line:
            continue
        elastic = parse_cores_mode(annotations) == "elastic"
        names = tuple(c.name for c in gpu_containers(dict(pod)))
        limits: dict[tuple[str, str], Limit] = {}
        for name in names:
            for g in doc.container_gpus(name):
                limits[(name, g.uuid)] = Limit(g.memory_mib, g.cores, elastic)
                total = limits.get((POD_WIDE, g.uuid), Limit(0.0, 0.0, elastic))
                limits[(POD_WIDE, g.uuid)] = Limit(total.memory_mib + g.memory_mib, total.cores + g.cores, elastic)
        status = pod.get("status") or {}
        containers = {
            bare_container_id(str(s["containerID"])): str(s.get("name", ""))
            for kind in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
            for s in status.get(kind) or []
            if isinstance(s, Mapping) and s.get("containerID")
        }
        uid = str(meta.get("uid", ""))
        out[uid] = Tenant(uid, str(meta.get("namespace", "")), str(meta.get("name", "")), containers, names, limits)
    return out


def memory_victims(uses: Sequence[Use], limits: Mapping[ShareKey, float]) -> dict[ShareKey, list[Use]]:
    """Per share whose processes hold more than its limit (MiB, slack included): the processes to stop,
    largest first (the newest, higher PID, first among equals) until what is left fits. A share within its
    limit loses nothing, and no more processes are chosen than needed."""
    by_key: dict[ShareKey, list[Use]] = {}
    for u in uses:
        by_key.setdefault(u.key, []).append(u)
    out: dict[ShareKey, list[Use]] = {}
    for key, group in sorted(by_key.items()):
        left = sorted(group, key=lambda u: (u.used_mib, u.pid))  # the next victim is the last
        victims = []
        while left and math.fsum(u.used_mib for u in left) > limits[key]:  # fsum: no rounding drift
            victims.append(left.pop())
        if victims:
            out[key] = victims
    return out


class Watchdog:
    def __init__(
        self,
        config: AgentConfig,
        backend: DiscoveryBackend,
        cluster: AgentCluster,
        strategies: Mapping[str, Isolation],
        gpus: Callable[[], Iterable[str]],
        procs: ProcTable | None = None,
        killer: Killer | None = None,
        wall_clock: Callable[[], float] = time.time,
        claims: Callable[[], Mapping[str, Mapping[str, Limit]]] = dict,
    ) -> None:
        self.config = config
        self.claims = claims  # the prepared DRA claims held by the second line: namespace/name -> GPU -> share
        self.backend = backend
        self.cluster = cluster
        self.strategies = strategies
        self.gpus = gpus  # the node's GPU UUIDs now (the device table's)
        self.procs = procs or ProcTable(config.watchdog_proc_root)
        self.killer = killer or PidfdKiller(self.procs)
        self.wall_clock = wall_clock  # Event time stamps only; decisions use the clock passed to tick
        self.stats = WatchdogStats()
        self.tenants: dict[str, Tenant] = {}
        self._listed: set[str] = set()  # every pod UID of the last list (tenants or not)
        self._listed_at: float | None = None
        self._since_us: dict[str, int] = {}  # per GPU: the newest utilisation sample seen
        self._sm: dict[tuple[str, int], float] = {}  # (GPU, PID) -> last SM percent sampled
        self._killed: dict[int, float] = {}  # PID -> when it was signalled
        self._over_since: dict[ShareKey, float] = {}  # compute: since when the share is far above its cores
        self._acted: set[tuple[str, ShareKey]] = set()  # (reason, share) reported or stopped this episode
        self._warned_hostpid = False
        self._strangers: set[str] = set()  # pod UIDs in GPU processes' cgroups but not on the last list
        self._failing: set[str] = set()  # GPUs whose last query failed (warned once, until they answer)
        self._refreshing: asyncio.Task[None] | None = None

    # --- one poll -----------------------------------------------------------------------------------------
    async def tick(self, now: float) -> list[Action]:
        """Look once and act; returns what was done. `now` is a monotonic time in seconds."""
        self.stats.polls += 1
        seen = await asyncio.to_thread(self._observe)
        uids = {x.ref.pod_uid for x in seen if x.ref is not None}
        # a pod UID no list had: a pod newer than the list (read it now), or one the API does not show under
        # that UID (a static pod's mirror): asked once, then left to the periodic refresh
        new = uids - self._listed - self._strangers
        due = self._listed_at is None or now - self._listed_at >= REFRESH_S or bool(new)
        if due and (self._refreshing is None or self._refreshing.done()):
            self._listed_at = now  # asked now: not again before REFRESH_S unless a new pod shows
            self._refreshing = asyncio.create_task(self._refresh(uids))
        if self._refreshing is not None and not self._refreshing.done():
            await asyncio.wait({self._refreshing}, timeout=REFRESH_WAIT_S)
        uses = self._uses(seen, now)
        actions = self._memory(uses) + self._compute(uses, now)
        for action in actions:
            await self._act(action, uses, now)
        return actions

    def _observe(self) -> list[Seen]:
        """Every process on every GPU: blocking calls, run off the event loop."""
        out: list[Seen] = []
        sm: dict[tuple[str, int], float] = {}
        for gpu in self.gpus():
            try:
                processes = self.backend.processes(gpu)
                samples = self.backend.process_utilization(gpu, self._since_us.get(gpu, 0))
            except DiscoveryError as e:
                self.stats.errors += 1
                if gpu not in self._failing:
                    log.warning("watchdog: %s (warned once until it answers again)", e)
                self._failing.add(gpu)
                continue
            self._failing.discard(gpu)
            fresh: dict[int, list[float]] = {}
            for s in samples:
                fresh.setdefault(s.pid, []).append(s.sm_percent)
                self._since_us[gpu] = max(self._since_us.get(gpu, 0), s.timestamp_us)
            for p in processes:
                # no new sample of a process (the driver samples on its own period): its last one stands
                values = fresh.get(p.pid)
                sm[(gpu, p.pid)] = sum(values) / len(values) if values else self._sm.get((gpu, p.pid), 0.0)
                out.append(Seen(gpu, p.pid, self.procs.ref(p.pid), p.used_memory_mib, sm[(gpu, p.pid)]))
        self._sm = sm
        unmapped = [x.pid for x in out if x.ref is None and not self.procs.exists(x.pid)]
        self.stats.unmapped = len(unmapped)
        if out and len(unmapped) == len(out) and not self._warned_hostpid:
            self._warned_hostpid = True
            log.warning("watchdog: none of the %d GPU process(es) the driver lists is under %s: the agent does not "
                        "see the host's processes (run it with hostPID), so nothing can be held to its grant",
                        len(out), self.config.watchdog_proc_root)
        return out

    async def _refresh(self, uids: set[str]) -> None:
        """List the node's pods; `uids`: the pods of the GPU processes seen when it was asked for."""
        try:
            pods = await self.cluster.list_pods_on_node(self.config.node_name)
        except Exception as e:  # the API being away: judge by the last list until it answers
            self.stats.errors += 1
            log.warning("watchdog: cannot list the pods of node %s: %s", self.config.node_name, e)
            self._strangers = uids - self._listed
            return
        self._listed = {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
        self._strangers = uids - self._listed
        self.tenants = tenants_of(pods, self.config.node_name, self.strategies, self.config.isolation,
                                  self.claims())

    def _uses(self, seen: list[Seen], now: float) -> list[Use]:
        """The processes of tenants, each tied to the share it counts against; those stopped lately left out."""
        listed = {x.pid for x in seen}
        self._killed = {pid: t for pid, t in self._killed.items() if pid in listed and now - t < KILL_GRACE_S}
        out = []
        for x in seen:
            tenant = self.tenants.get(x.ref.pod_uid) if x.ref is not None else None
            if tenant is None or x.ref is None or x.pid in self._killed:
                continue
            out.append(Use(tenant.key(x.ref, x.gpu), x.pid, x.ref, x.used_mib, x.sm_percent))
        return out

    def _limit(self, key: ShareKey) -> Limit:
        return self.tenants[key.pod_uid].limit(key)

    def _memory(self, uses: list[Use]) -> list[Action]:
        slack = self.config.watchdog_memory_slack_mib
        keys = {u.key for u in uses}
        victims = memory_victims(uses, {k: self._limit(k).memory_mib + slack for k in keys})
        # a share back within its grant (or without processes) ends its episode: a new excess is news again
        self._acted = {(r, k) for r, k in self._acted if r != MEMORY or k in victims}
        out = []
        for key, group in victims.items():
            used = sum(u.used_mib for u in uses if u.key == key)
            limit = self._limit(key).memory_mib
            if self.config.watchdog_memory_action == "kill":
                out.append(Action(MEMORY, "kill", key, used, limit, tuple(u.pid for u in group)))
            elif (MEMORY, key) not in self._acted:
                out.append(Action(MEMORY, "report", key, used, limit, ()))
        return out

    def _compute(self, uses: list[Use], now: float) -> list[Action]:
        action = self.config.watchdog_compute_action
        if action == "off":
            return []
        sm: dict[ShareKey, float] = {}
        for u in uses:
            sm[u.key] = sm.get(u.key, 0.0) + u.sm_percent
        out = []
        for key in sorted(set(self._over_since) | set(sm)):
            limit = self._limit(key) if key.pod_uid in self.tenants else None
            far = (limit is not None and not limit.elastic and limit.cores < 100
                   and sm.get(key, 0.0) > limit.cores + self.config.watchdog_compute_margin)
            if not far:
                self._over_since.pop(key, None)
                self._acted.discard((COMPUTE, key))
                continue
            assert limit is not None
            since = self._over_since.setdefault(key, now)
            if now - since < self.config.watchdog_compute_after_s or (COMPUTE, key) in self._acted:
                continue
            pids = tuple(sorted(u.pid for u in uses if u.key == key)) if action == "kill" else ()
            out.append(Action(COMPUTE, action, key, sm[key], limit.cores, pids))
        return out

    # --- acting -------------------------------------------------------------------------------------------
    async def _act(self, action: Action, uses: list[Use], now: float) -> None:
        tenant = self.tenants[action.key.pod_uid]
        refs = {u.pid: u.ref for u in uses if u.key == action.key}
        stopped: list[int] = []
        for pid in action.pids:
            if await asyncio.to_thread(self.killer.kill, pid, refs[pid]):
                stopped.append(pid)
                self._killed[pid] = now
        if action.kind == "kill":
            self.stats.kills[action.reason] += len(stopped)
        else:
            self.stats.reports[action.reason] += 1
        if not stopped and (action.reason, action.key) in self._acted:
            return  # a process that cannot be stopped is told once per episode, not every poll
        self._acted.add((action.reason, action.key))
        message = _message(tenant, action, stopped, {u.pid: u.used_mib for u in uses},
                           self.config.watchdog_compute_after_s)
        log.warning("watchdog: %s", message)
        await self._event(tenant, REASONS[action.reason], message)

    async def _event(self, tenant: Tenant, reason: str, message: str) -> None:
        stamp = format_time(self.wall_clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{tenant.name}.", "namespace": tenant.namespace},
            "involvedObject": {"kind": "Pod", "namespace": tenant.namespace, "name": tenant.name, "uid": tenant.uid},
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "type": "Warning",
            "source": {"component": "gpupool-agent", "host": self.config.node_name},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.cluster.create_event(event)
        except Exception as e:  # an event is best effort: the action itself is done and logged
            self.stats.errors += 1
            log.info("watchdog: event %s for pod %s/%s not written: %s", reason, tenant.namespace, tenant.name, e)

    # --- the loop -----------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, clock: Callable[[], float] = time.monotonic) -> None:
        """Poll every `watchdog_poll_s` until `stop`."""
        log.info("watchdog on node %s: every %gs, memory %s, compute %s", self.config.node_name,
                 self.config.watchdog_poll_s, self.config.watchdog_memory_action, self.config.watchdog_compute_action)
        try:
            while not stop.is_set():
                try:
                    await self.tick(clock())
                except Exception:  # keep watching whatever one poll met
                    self.stats.errors += 1
                    log.exception("watchdog poll failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.config.watchdog_poll_s)
        finally:
            if self._refreshing is not None and not self._refreshing.done():
                self._refreshing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._refreshing


def _message(tenant: Tenant, action: Action, stopped: list[int], used: Mapping[int, float], after_s: float) -> str:
    who = (f"container {action.key.container} of pod {tenant.namespace}/{tenant.name}"
           if action.key.container != POD_WIDE else f"pod {tenant.namespace}/{tenant.name}")
    if action.reason == MEMORY:
        what = f"held {action.used:.0f} MiB on GPU {action.key.gpu}, above its grant of {action.limit:.0f} MiB"
    else:
        what = (f"used {action.used:.0f} % of GPU {action.key.gpu}, far above its grant of {action.limit:g} %, "
                f"for {after_s:g} s")
    if action.kind == "report":
        return f"{who} {what} (reported only: watchdog_{action.reason}_action is report)"
    if not stopped:
        return f"{who} {what}; its processes {list(action.pids)} could not be stopped (gone already?)"
    if action.reason == MEMORY:
        detail = ", ".join(f"{pid} ({used.get(pid, 0.0):.0f} MiB)" for pid in stopped)
    else:
        detail = ", ".join(str(pid) for pid in stopped)
    return f"{who} {what}: stopped process(es) {detail} (host PIDs)"


class WatchdogCollector(Collector):
    """gpupool_watchdog_* on the agent's /metrics."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def collect(self) -> Iterator[Metric]:
        stats = self.watchdog.stats
        kills = CounterMetricFamily("gpupool_watchdog_kills", "GPU processes the watchdog stopped, by reason",
                                    labels=["reason"])
        reports = CounterMetricFamily("gpupool_watchdog_reports",
                                      "Excesses over a grant the watchdog reported without stopping anything",
                                      labels=["reason"])
        for reason in (MEMORY, COMPUTE):
            kills.add_metric([reason], stats.kills[reason])
            reports.add_metric([reason], stats.reports[reason])
        yield kills
        yield reports
        yield CounterMetricFamily("gpupool_watchdog_polls", "Watchdog polls of the GPUs' processes",
                                  value=stats.polls)
        yield CounterMetricFamily("gpupool_watchdog_errors",
                                  "Watchdog polls, pod lists or events that failed", value=stats.errors)
        yield GaugeMetricFamily("gpupool_watchdog_unmapped_processes",
                                "GPU processes of the last poll not visible under the agent's /proc (hostPID?)",
                                value=stats.unmapped)
