"""`gpupool migrate POD --to NODE[/GPU]`: move a pod's remote share (docs/remote.md, "Live migration") to
another GPU server without restarting the pod; `gpupool migrate --cancel POD_OR_CLAIM`: cancel such a move.

The command writes the move (gpupool.api.moves: a `requested` entry in gpupool's ConfigMap, with its
deadline: --deadline) and, with --wait, follows it while the agents carry it out: the target node's agent
prepares the share (`ready`), the source node's agent moves the clients over (`moved`) or gives up
(`failed`, with the reason). Still unfinished at its deadline, the scheduler's leader cancels it.

The target is the scheduler's choice, not this command's: with no GPU named, the GPU of NODE the
scheduler's framework chooses for the share's claim, and with one named, that GPU if the framework would
place the share there (gpupool.scheduler.moves.MoveTargets, on a snapshot of the API objects counted as the
scheduler's ledger counts them). `gpupool drain` asks the same (`choose_target`).

Exit status: 0 moved (or requested, with --wait 0; or cancelled); 1 the move failed, timed out, or the share
fits nowhere asked; 2 a usage error (no such pod, no remote share, a move of it still unfinished, a target
that is not a GPU server; for --cancel, no such pod or claim, or no unfinished move of it). Every name shown
comes from the cluster, some from tenants: it goes through `shown` (control characters escaped).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from gpupool.api.counted import TERMINAL_PHASES
from gpupool.api.dra import REMOTE_ISOLATION, ClaimError, claim_shares
from gpupool.api.logsafe import shown
from gpupool.api.moves import (
    DEFAULT_DEADLINE_S,
    MAX_MOVES,
    MOVES_CONFIGMAP,
    GpuRef,
    Move,
    MoveError,
    new_move,
    read_moves,
    served_from,
)
from gpupool.api.times import format_time
from gpupool.cluster.port import (
    CONFIGMAPS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    AlreadyExists,
    ApiError,
    ClusterPort,
    Conflict,
    NotFound,
    Obj,
)
from gpupool.scheduler.claims import usable_devices
from gpupool.scheduler.moves import MoveTargets, MovingShare, cancel_moves, waits_for

DEFAULT_NAMESPACE = "gpupool-system"  # the chart's documented install namespace
DEFAULT_WAIT_S = 120.0
POLL_S = 1.0  # how often a waiting command reads the entry again
WRITE_TRIES = 10  # conflicting writers (agents, another admin) are outrun this many times, then it gives up

Sleep = Callable[[float], Awaitable[None]]
Echo = Callable[[str], None]


class Refused(Exception):
    """What the command cannot do, with its exit status (2: usage, 1: the cluster says no)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message, self.code = message, code


# --- what the cluster shows, read once ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Share:
    """A remote claim's one-GPU share and where it is."""

    claim: Obj
    uid: str
    label: str  # namespace/name
    placed: GpuRef  # where its allocation put it
    move: Move | None  # its entry, if any

    @property
    def served(self) -> GpuRef:
        return served_from(self.move, self.placed)

    @property
    def unfinished(self) -> bool:
        return self.move is not None and not self.move.finished


@dataclass(slots=True)
class Pool:
    """The pool as the API objects show it, moves included, and the scheduler's framework over a snapshot of
    it (gpupool.scheduler.moves.MoveTargets): the one place a target is chosen."""

    targets: MoveTargets
    servers: dict[str, set[int]]  # node -> its untainted GPUs that a GPU server serves remote shares of
    agents: set[str]  # nodes whose agent publishes a pool (where a remote share's pod may run)
    cordoned: set[str]
    moves: dict[str, Move]
    claims: list[Obj]
    pods: list[Obj] = field(default_factory=list)

    def share_of(self, claim: Mapping[str, Any]) -> Share | None:
        """The claim as a one-GPU remote share, None when it is not one."""
        try:
            shares = claim_shares(claim)
        except ClaimError:
            return None
        if shares.isolation != REMOTE_ISOLATION or len(shares.devices) != 1:
            return None
        d = shares.devices[0]
        return Share(dict(claim), shares.uid, shares.label, GpuRef(d.pool, d.index), self.moves.get(shares.uid))

    def shares(self) -> list[Share]:
        return [s for c in self.claims if (s := self.share_of(c)) is not None]

    def known(self, node: str) -> bool:
        """Whether gpupool counts the node's GPUs (a GPU node with an inventory)."""
        return node in self.targets.ledger.state.index

    def pod_of(self, share: Share) -> Obj | None:
        """The running pod that uses the share's claim (None: none)."""
        namespace, _, name = share.label.partition("/")
        for pod in self.pods:
            meta = pod.get("metadata") or {}
            if meta.get("namespace") == namespace and name in pod_claim_names(pod) \
                    and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                return pod
        return None

    def moving(self, share: Share, pod: Obj | None = None) -> MovingShare:
        return MovingShare(share.claim, pod if pod is not None else self.pod_of(share), share.served)


async def read_pool(cluster: ClusterPort, namespace: str) -> Pool:
    """Nodes, pods, claims, slices and the moves ConfigMap; the scheduler's framework over them."""
    nodes, _ = await cluster.list_nodes()
    pods, _ = await cluster.list_pods()
    claims, _ = await cluster.list_objects(RESOURCE_CLAIMS)
    slices, _ = await cluster.list_objects(RESOURCE_SLICES)
    moves = read_moves(await read_moves_configmap(cluster, namespace))
    usable = usable_devices(slices)
    cordoned = {str(n["metadata"]["name"]) for n in nodes if (n.get("spec") or {}).get("unschedulable")}
    targets = MoveTargets.of_objects(cluster, nodes, pods, claims, moves)
    return Pool(targets, usable.remote, usable.drivers, cordoned, moves, claims, pods)


async def read_moves_configmap(cluster: ClusterPort, namespace: str) -> Obj | None:
    try:
        return await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace)
    except NotFound:
        return None


# --- the target: the scheduler's choice ---------------------------------------------------------------------


def choose_target(pool: Pool, share: Share, nodes: Iterable[str], avoid: Iterable[str] = (),
                  pod: Obj | None = None) -> GpuRef | str:
    """The GPU the scheduler's framework chooses for the share among the GPU servers of `nodes` (less the
    nodes in `avoid`, cordoned ones and the GPU it is served from); or why there is none, in its words."""
    skip = {*avoid, *pool.cordoned}
    candidates = {n: sorted(pool.servers.get(n, ())) for n in nodes if n not in skip}
    return pool.targets.choose(pool.moving(share, pod), candidates, pool.agents)


def resolve_target(pool: Pool, share: Share, to: str, pod: Obj | None = None) -> GpuRef:
    """--to NODE or NODE/GPU as a GPU: the scheduler's choice on NODE, or the GPU named if the scheduler would
    place the share there."""
    node, sep, _ = to.partition("/")
    if sep:
        try:
            target = GpuRef.parse(to)
        except MoveError as e:
            raise Refused(f"--to {shown(to)}: {e}") from None
        node = target.node
    if not pool.known(node):
        raise Refused(f"--to: node {shown(node)} is not a gpupool GPU node")
    if not pool.servers.get(node):
        raise Refused(f"--to: node {shown(node)} publishes no GPU with a GPU server (device attribute remoteServer)")
    if not sep:
        chosen = choose_target(pool, share, [node], pod=pod)
        if isinstance(chosen, str):
            raise Refused(f"the share of claim {shown(share.label)} fits on no GPU of {shown(node)}: {shown(chosen)}",
                          1)
        return chosen
    if target.index not in pool.servers[node]:
        raise Refused(f"--to: {shown(str(target))} is not a GPU with a GPU server (untainted, remoteServer)")
    if target == share.served:
        raise Refused(f"the share of claim {shown(share.label)} is already served from {shown(str(target))}")
    chosen = pool.targets.choose(pool.moving(share, pod), {node: [target.index]}, pool.agents)
    if isinstance(chosen, str):
        raise Refused(f"the share of claim {shown(share.label)} does not fit on {shown(str(target))}: "
                      f"{shown(chosen)}", 1)
    return chosen


# --- writing and following the entry ------------------------------------------------------------------------


def _dropped(data: Mapping[str, str], live: set[str], adding: int) -> list[str]:
    """Entries to drop so that at most MAX_MOVES remain with `adding` new ones: damaged entries, then moves of
    claims that no longer exist. An entry of a live claim is never dropped, finished or not: it says where
    the share is served from (after a second move, not even the allocation knows)."""
    excess = len(data) + adding - MAX_MOVES
    if excess <= 0:
        return []
    moves = read_moves({"data": data})
    damaged = [uid for uid in data if uid not in moves]
    gone = sorted((uid for uid in moves if uid not in live), key=lambda uid: (moves[uid].requested_at, uid))
    return (damaged + gone)[:excess]


async def write_moves(cluster: ClusterPort, namespace: str, entries: Mapping[str, Move], live: set[str]) -> None:
    """Add `entries` (claim UID -> its new move) to the ConfigMap, creating it when missing; each write names
    the resourceVersion it read (an agent may be advancing another entry), and a conflict reads again.
    Refused when a claim's earlier move is still unfinished or the ConfigMap is full of live claims' moves."""
    for _ in range(WRITE_TRIES):
        cm = await read_moves_configmap(cluster, namespace)
        data = dict((cm or {}).get("data") or {})
        current = read_moves({"data": data})
        for uid, move in entries.items():
            if uid in current and not current[uid].finished:
                raise Refused(f"claim {shown(move.claim)}: a move of its share is still {current[uid].state} "
                              f"({shown(str(current[uid].source))} -> {shown(str(current[uid].target))})")
        adding = sum(uid not in data for uid in entries)
        drop = _dropped({k: v for k, v in data.items() if k not in entries}, live, adding)
        if len(data) + adding - len(drop) > MAX_MOVES:
            raise Refused(f"{MOVES_CONFIGMAP} holds {MAX_MOVES} moves of claims that still exist; it cannot take "
                          "more", 1)
        written = {uid: m.to_json() for uid, m in entries.items()}
        try:
            if cm is None:
                await cluster.create_object(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                    "name": MOVES_CONFIGMAP, "namespace": namespace,
                    "labels": {"app.kubernetes.io/managed-by": "gpupool"}}, "data": written})
            else:
                patch: dict[str, str | None] = {**dict.fromkeys(drop), **written}
                await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": patch}, namespace=namespace,
                                           resource_version=str(cm["metadata"]["resourceVersion"]))
            return
        except (Conflict, AlreadyExists):
            continue
    raise Refused(f"{MOVES_CONFIGMAP} kept changing under {WRITE_TRIES} writes; try again", 1)


async def follow(cluster: ClusterPort, namespace: str, uids: Mapping[str, str], wait_s: float, echo: Echo,
                 sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic) -> dict[str, Move | None]:
    """Read the entries of `uids` (claim UID -> label) until each is finished or `wait_s` passes, printing
    each state change; returns the last entry seen of each (None: it is gone)."""
    deadline = clock() + wait_s
    seen: dict[str, Move | None] = {}
    shown_state: dict[str, str] = {}
    while True:
        moves = read_moves(await read_moves_configmap(cluster, namespace))
        for uid, label in uids.items():
            move = seen[uid] = moves.get(uid)
            state = "gone" if move is None else move.state
            if shown_state.get(uid) != state:
                shown_state[uid] = state
                reason = f": {shown(move.reason, 1000)}" if move is not None and move.reason else ""
                echo(f"claim {shown(label)}: {state}{reason}")
        if all(m is None or m.finished for m in seen.values()) or clock() >= deadline:
            return seen
        await sleep(min(POLL_S, max(0.0, deadline - clock())))


def outcome(label: str, move: Move | None, wait_s: float) -> str | None:
    """None when the move is done, else what is left, in words."""
    if move is None:
        return f"claim {shown(label)}: its move entry is gone (the ConfigMap was edited)"
    if move.state == "moved":
        return None
    if move.state == "failed":
        return f"claim {shown(label)}: the move failed: {shown(move.reason or 'no reason given', 1000)}"
    at = move.deadline_at()
    until = "" if at is None else f" until its deadline {format_time(at)} (then it is cancelled)"
    return (f"claim {shown(label)}: still {move.state} after {wait_s:g} s; the entry stays{until}, waiting for "
            f"{waits_for(move)}")


# --- the pod's share ------------------------------------------------------------------------------------------


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the claims a pod uses (its own, and those made from its templates)."""
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or made.get(ref.get("name"))
        if name:
            out.append(str(name))
    return out


def pod_share(pool: Pool, pod: Mapping[str, Any]) -> Share:
    meta = pod.get("metadata") or {}
    label = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        raise Refused(f"pod {shown(label)} has finished")
    names = set(pod_claim_names(pod))
    if not names:
        raise Refused(f"pod {shown(label)} uses no ResourceClaim")
    mine = [c for c in pool.claims if (c.get("metadata") or {}).get("namespace") == meta.get("namespace")
            and (c.get("metadata") or {}).get("name") in names]
    shares = [s for c in mine if (s := pool.share_of(c)) is not None]
    if not shares:
        raise Refused(f"pod {shown(label)}: none of its claims is allocated a remote share (a DeviceClass of "
                      "isolation remote, one GPU)")
    if len(shares) > 1:
        raise Refused(f"pod {shown(label)} has {len(shares)} remote shares "
                      f"({', '.join(shown(s.label) for s in shares)}); gpupool migrate moves a pod's one share")
    share = shares[0]
    if not pool.known(share.placed.node):
        raise Refused(f"claim {shown(share.label)}: its GPU node {shown(share.placed.node)} is not a gpupool node")
    if share.unfinished:
        assert share.move is not None
        raise Refused(f"claim {shown(share.label)}: a move of its share is still {share.move.state} "
                      f"({shown(str(share.move.source))} -> {shown(str(share.move.target))}): {waits_for(share.move)} "
                      "(gpupool migrate --cancel cancels it)")
    return share


async def migrate_pod(cluster: ClusterPort, namespace: str, pod_name: str, to: str, gpupool_namespace: str,
                      wait_s: float, echo: Echo, sleep: Sleep = asyncio.sleep,
                      clock: Callable[[], float] = time.monotonic, deadline_s: float = DEFAULT_DEADLINE_S,
                      wall: Callable[[], float] = time.time) -> int:
    """The command's work; returns the exit status (raises Refused for what it refuses). `clock` times the
    wait, `wall` (seconds since the epoch) stamps the move and its deadline."""
    try:
        pod = await cluster.get_pod(namespace, pod_name)
    except NotFound:
        raise Refused(f"pod {shown(namespace)}/{shown(pod_name)} not found") from None
    pool = await read_pool(cluster, gpupool_namespace)
    share = pod_share(pool, pod)
    target = resolve_target(pool, share, to, pod)
    move = new_move(share.label, share.served, target, wall(), deadline_s)
    await write_moves(cluster, gpupool_namespace, {share.uid: move}, live_claims(pool))
    echo(f"claim {shown(share.label)}: move requested, {shown(str(move.source))} -> {shown(str(move.target))}")
    if wait_s <= 0:
        return 0
    last = (await follow(cluster, gpupool_namespace, {share.uid: share.label}, wait_s, echo, sleep, clock))[share.uid]
    left = outcome(share.label, last, wait_s)
    if left is None:
        echo(f"claim {shown(share.label)}: served from {shown(str(target))}")
        return 0
    echo(left)
    return 1


async def cancel_move(cluster: ClusterPort, namespace: str, name: str, gpupool_namespace: str, echo: Echo) -> int:
    """`--cancel NAME`: the unfinished move of pod NAME's remote share (or of claim NAME's, when no pod has the
    name) cancelled, its share served from its source again. Refused (2) when there is no such pod or claim,
    or no unfinished move of it."""
    label = f"{shown(namespace)}/{shown(name)}"
    moves = read_moves(await read_moves_configmap(cluster, gpupool_namespace))
    claims, _ = await cluster.list_objects(RESOURCE_CLAIMS, namespace=namespace)
    by_name = {str((c.get("metadata") or {}).get("name", "")): c for c in claims}
    try:
        pod = await cluster.get_pod(namespace, name)
    except NotFound:
        pod = None
    if pod is not None:
        mine = [by_name[n] for n in pod_claim_names(pod) if n in by_name]
        what = f"pod {label}"
    elif name in by_name:
        mine, what = [by_name[name]], f"claim {label}"
    else:
        raise Refused(f"no pod or claim {label}: nothing to cancel")
    uids = {str((c.get("metadata") or {}).get("uid", "")): f"{namespace}/{(c.get('metadata') or {}).get('name', '')}"
            for c in mine}
    unfinished = {u: moves[u] for u in uids if u in moves and not moves[u].finished}
    if not unfinished:
        done = [f"{shown(uids[u])} is {moves[u].state}" for u in uids if u in moves]
        raise Refused(f"{what}: no unfinished move to cancel" + (f" (the move of claim {', '.join(done)})"
                                                                  if done else ""))
    why = "by gpupool migrate --cancel"
    cancelled = await cancel_moves(cluster, gpupool_namespace, lambda current: {
        u: why for u in unfinished if u in current and not current[u].finished})
    for uid in sorted(unfinished):
        move = cancelled.get(uid)
        if move is None:
            raise Refused(f"claim {shown(uids[uid])}: its move finished before it could be cancelled; see "
                          f"{MOVES_CONFIGMAP}", 1)
        echo(f"claim {shown(uids[uid])}: move {shown(str(move.source))} -> {shown(str(move.target))} cancelled; "
             f"served from {shown(str(move.source))}")
    return 0


def live_claims(pool: Pool) -> set[str]:
    return {str((c.get("metadata") or {}).get("uid", "")) for c in pool.claims}


# --- the command ----------------------------------------------------------------------------------------------


async def with_cluster(kubeconfig: str | None, context: str | None,
                       work: Callable[[ClusterPort], Awaitable[int]]) -> int:
    """Run `work` against the cluster of `kubeconfig`; what the API or the network refuses is one line (exit
    1), never a traceback."""
    from gpupool.cluster.kube import KubeCluster
    from gpupool.commands.doctor import _kubeconfig

    path = _kubeconfig(kubeconfig)
    try:
        cluster = KubeCluster.from_config(path, context)
    except Exception as e:  # lightkube's ConfigError and whatever a malformed file raises
        where = path or "the in-cluster service account"
        raise Refused(f"cannot use {shown(where)}{f' (context {shown(context)})' if context else ''}: {e}") from None
    try:
        return await work(cluster)
    except Refused:
        raise
    except ApiError as e:
        raise Refused(f"the API server refused: {shown(e.message, 1000)}", 1) from None
    except Exception as e:  # transport errors (refused, TLS, DNS, timeouts) as the HTTP client raises them
        raise Refused(f"cannot talk to the API server: {shown(str(e) or type(e).__name__, 1000)}", 1) from None
    finally:
        await cluster.close()


def run_command(name: str, work: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """Run the command's work; a refusal is one line on stderr and its exit status."""
    try:
        code = asyncio.run(work())
    except Refused as e:
        click.echo(f"gpupool {name}: {e.message}", err=True)
        raise SystemExit(e.code) from None
    raise SystemExit(code)


@click.command("migrate")
@click.argument("pod", required=False)
@click.option("--to", "to", metavar="NODE[/GPU]",
              help="The GPU server to move the share to: a node (the GPU of it the scheduler chooses) or one of "
                   "its GPUs (gpu-<i> or <i>).")
@click.option("--cancel", "cancel", metavar="POD_OR_CLAIM",
              help="Cancel the unfinished move of this pod's remote share (or of this claim's): it is served from "
                   "its source again.")
@click.option("--namespace", "-n", default="default", show_default=True, help="The pod's (or claim's) namespace.")
@click.option("--gpupool-namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="The namespace gpupool is installed in (its moves ConfigMap).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=DEFAULT_WAIT_S, show_default=True,
              help="Seconds to follow the move (0: request it and return).")
@click.option("--deadline", "deadline_s", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_DEADLINE_S,
              show_default=True, help="Seconds the move may take; still unfinished then, the scheduler cancels it.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig file [$KUBECONFIG, ~/.kube/config, or the in-cluster service account].")
@click.option("--context", default=None, help="Kubeconfig context [the current one].")
def migrate(pod: str | None, to: str | None, cancel: str | None, namespace: str, gpupool_namespace: str,
            wait_s: float, deadline_s: float, kubeconfig: str | None, context: str | None) -> None:
    """Move POD's remote GPU share to another GPU server while it runs (POD --to NODE[/GPU]), or cancel a move
    (--cancel POD_OR_CLAIM). Exit 0 moved (or cancelled), 1 failed, timed out or no room, 2 usage errors."""
    if cancel is not None:
        if pod is not None or to is not None:
            raise click.UsageError("--cancel takes the pod or claim itself: give no POD and no --to with it")
        if not cancel or "/" in cancel:
            raise click.BadParameter(f"{shown(cancel)!r}: give the pod's or claim's name and its namespace with -n",
                                     param_hint="--cancel")
        name = cancel

        async def undo(cluster: ClusterPort) -> int:
            return await cancel_move(cluster, namespace, name, gpupool_namespace, click.echo)

        run_command("migrate", lambda: with_cluster(kubeconfig, context, undo))
        return
    if pod is None:
        raise click.UsageError("Missing argument 'POD' (or --cancel POD_OR_CLAIM).")
    if to is None:
        raise click.UsageError("Missing option '--to'.")
    if not to or to.startswith("/") or to.endswith("/"):
        raise click.BadParameter(f"{shown(to)!r} is not NODE or NODE/GPU", param_hint="--to")
    if "/" in pod:
        raise click.BadParameter(f"{shown(pod)!r}: give the pod's name and its namespace with -n", param_hint="POD")
    target, pod_name = to, pod

    async def work(cluster: ClusterPort) -> int:
        return await migrate_pod(cluster, namespace, pod_name, target, gpupool_namespace, wait_s, click.echo,
                                 deadline_s=deadline_s)

    run_command("migrate", lambda: with_cluster(kubeconfig, context, work))
