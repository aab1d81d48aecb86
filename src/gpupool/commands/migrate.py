"""`gpupool migrate POD --to NODE[/GPU]`: move a pod's remote share (docs/remote.md, "Live migration") to
another GPU server without restarting the pod.

The command writes the move (gpupool.api.moves: a `requested` entry in gpupool's ConfigMap) and, with
--wait, follows it while the agents carry it out: the target node's agent prepares the share (`ready`), the
source node's agent moves the clients over (`moved`) or gives up (`failed`, with the reason).

With no GPU named, the target is the GPU of NODE where the share fits with the most free memory, counted as
the scheduler's ledger and `gpupool top` count it (pods, claims and moves: gpupool.api.recompute). `gpupool
drain` chooses its targets the same way (`choose_target`).

Exit status: 0 moved (or requested, with --wait 0); 1 the move failed, timed out, or the share does not fit
on the GPU named; 2 a usage error (no such pod, no remote share, a move of it still unfinished, a target
that is not a GPU server). Every name shown comes from the cluster, some from tenants: it goes through
`shown` (control characters escaped).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import click

from gpupool.api.counted import TERMINAL_PHASES
from gpupool.api.dra import REMOTE_ISOLATION, ClaimError, claim_shares, counted_claim
from gpupool.api.logsafe import shown
from gpupool.api.moves import MAX_MOVES, MOVES_CONFIGMAP, GpuRef, Move, MoveError, new_move, read_moves, served_from
from gpupool.api.recompute import Recomputed, recompute
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
    """The pool as the API objects show it, moves included (the scheduler's counting: api.recompute)."""

    counted: Recomputed
    servers: dict[str, set[int]]  # node -> its untainted GPUs that a GPU server serves remote shares of
    cordoned: set[str]
    moves: dict[str, Move]
    claims: list[Obj]
    taken: dict[GpuRef, str] = field(default_factory=dict)  # targets chosen in this run (drain), claim label

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

    def free(self, ref: GpuRef) -> tuple[int, int]:
        """(free compute in milli, free memory in MiB) of a GPU."""
        state = self.counted.state
        i = state.index[ref.node]
        return int(state.gpu_milli_free[i, ref.index]), int(state.gpu_mem_free[i, ref.index])

    def fit(self, share: Share, target: GpuRef) -> str | None:
        """None when the share fits on `target` now, else why not (what it needs, what is free). Counted as
        the ledger counts it there: the claim as it would be once moved (api.dra.counted_claim)."""
        state = self.counted.state
        i = state.index.get(target.node)
        if i is None or not 0 <= target.index < len(state.nodes[i].gpus):
            return f"{target} is not a GPU gpupool counts"
        if not state.gpu_healthy[i, target.index]:
            return f"{target} is unhealthy"
        there = Move(share.label, share.served, target, "moved")
        (counted,) = counted_claim(share.claim, state, there)
        (grant,) = counted.allocation.grants
        milli, memory = self.free(target)
        if grant.milli > milli or grant.memory_mib > memory:
            return (f"{target} has {milli / 10:g} % compute and {memory} MiB free; the share needs "
                    f"{grant.milli / 10:g} % and {grant.memory_mib} MiB")
        return None

    def reserve(self, share: Share, target: GpuRef) -> None:
        """Count the share on `target` too (a drain choosing several targets must not pick one GPU twice)."""
        there = Move(share.label, share.served, target, "moved")
        (counted,) = counted_claim(share.claim, self.counted.state, there)
        key = f"{share.uid}/planned"
        refused = self.counted.state.allocate(replace(counted.request, key=key), replace(counted.allocation, pod=key))
        assert refused is None, refused  # fit() said it fits
        self.taken[target] = share.label

    def candidates(self, node: str, avoid: Iterable[str] = ()) -> list[GpuRef]:
        skip = set(avoid)
        return [GpuRef(node, i) for i in sorted(self.servers.get(node, ())) if node not in skip]


async def read_pool(cluster: ClusterPort, namespace: str) -> Pool:
    """Nodes, pods, claims, slices and the moves ConfigMap; the counting the scheduler does of them."""
    nodes, _ = await cluster.list_nodes()
    pods, _ = await cluster.list_pods()
    claims, _ = await cluster.list_objects(RESOURCE_CLAIMS)
    slices, _ = await cluster.list_objects(RESOURCE_SLICES)
    moves = read_moves(await read_moves_configmap(cluster, namespace))
    from gpupool.scheduler.claims import usable_devices

    usable = usable_devices(slices)
    cordoned = {str(n["metadata"]["name"]) for n in nodes if (n.get("spec") or {}).get("unschedulable")}
    return Pool(recompute(nodes, pods, claims, moves), usable.remote, cordoned, moves, claims)


async def read_moves_configmap(cluster: ClusterPort, namespace: str) -> Obj | None:
    try:
        return await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace)
    except NotFound:
        return None


# --- choosing the target ------------------------------------------------------------------------------------


def choose_target(pool: Pool, share: Share, nodes: Iterable[str], avoid: Iterable[str] = ()) -> GpuRef | str:
    """The GPU among the GPU servers of `nodes` (less the nodes in `avoid`, cordoned ones and the GPU it is
    served from) where the share fits with the most free memory (then compute, then name: the same choice
    every time); or why there is none."""
    skip = {*avoid, *pool.cordoned}
    fitting: list[tuple[int, int, GpuRef]] = []
    why: list[str] = []
    for node in nodes:
        for ref in pool.candidates(node, skip):
            if ref == share.served:
                continue
            refused = pool.fit(share, ref)
            if refused is None:
                milli, memory = pool.free(ref)
                fitting.append((-memory, -milli, ref))
            else:
                why.append(refused)
    if not fitting:
        return "; ".join(why) or "no other GPU server"
    fitting.sort(key=lambda f: (f[0], f[1], f[2].node, f[2].index))
    return fitting[0][2]


def resolve_target(pool: Pool, share: Share, to: str) -> GpuRef:
    """--to NODE or NODE/GPU as a GPU: the best one of NODE, or the one named if the share fits there."""
    node, sep, _ = to.partition("/")
    if sep:
        try:
            target = GpuRef.parse(to)
        except MoveError as e:
            raise Refused(f"--to {shown(to)}: {e}") from None
        node = target.node
    if node not in pool.counted.state.index:
        raise Refused(f"--to: node {shown(node)} is not a gpupool GPU node")
    if not pool.servers.get(node):
        raise Refused(f"--to: node {shown(node)} publishes no GPU with a GPU server (device attribute remoteServer)")
    if not sep:
        chosen = choose_target(pool, share, [node])
        if isinstance(chosen, str):
            raise Refused(f"the share of claim {shown(share.label)} fits on no GPU of {shown(node)}: {chosen}", 1)
        return chosen
    if target.index not in pool.servers[node]:
        raise Refused(f"--to: {shown(str(target))} is not a GPU with a GPU server (untainted, remoteServer)")
    if target == share.served:
        raise Refused(f"the share of claim {shown(share.label)} is already served from {shown(str(target))}")
    refused = pool.fit(share, target)
    if refused is not None:
        raise Refused(f"the share of claim {shown(share.label)} does not fit: {shown(refused)}", 1)
    return target


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


def waits_for(move: Move) -> str:
    """What an unfinished move waits for, in words."""
    if move.state == "requested":
        return f"the agent of {shown(move.target.node)} to prepare the share on {shown(str(move.target))}"
    return f"the agent of {shown(move.source.node)} to move the share's clients to {shown(str(move.target))}"


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
    return (f"claim {shown(label)}: still {move.state} after {wait_s:g} s; the entry stays, waiting for "
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
    if share.placed.node not in pool.counted.state.index:
        raise Refused(f"claim {shown(share.label)}: its GPU node {shown(share.placed.node)} is not a gpupool node")
    if share.unfinished:
        assert share.move is not None
        raise Refused(f"claim {shown(share.label)}: a move of its share is still {share.move.state} "
                      f"({shown(str(share.move.source))} -> {shown(str(share.move.target))}): {waits_for(share.move)}")
    return share


async def migrate_pod(cluster: ClusterPort, namespace: str, pod_name: str, to: str, gpupool_namespace: str,
                      wait_s: float, echo: Echo, sleep: Sleep = asyncio.sleep,
                      clock: Callable[[], float] = time.monotonic) -> int:
    """The command's work; returns the exit status (raises Refused for what it refuses)."""
    try:
        pod = await cluster.get_pod(namespace, pod_name)
    except NotFound:
        raise Refused(f"pod {shown(namespace)}/{shown(pod_name)} not found") from None
    pool = await read_pool(cluster, gpupool_namespace)
    share = pod_share(pool, pod)
    target = resolve_target(pool, share, to)
    move = new_move(share.label, share.served, target, format_time(time.time()))
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
@click.argument("pod")
@click.option("--to", "to", required=True, metavar="NODE[/GPU]",
              help="The GPU server to move the share to: a node (its GPU with the most free memory that fits) or "
                   "one of its GPUs (gpu-<i> or <i>).")
@click.option("--namespace", "-n", default="default", show_default=True, help="The pod's namespace.")
@click.option("--gpupool-namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="The namespace gpupool is installed in (its moves ConfigMap).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=DEFAULT_WAIT_S, show_default=True,
              help="Seconds to follow the move (0: request it and return).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig file [$KUBECONFIG, ~/.kube/config, or the in-cluster service account].")
@click.option("--context", default=None, help="Kubeconfig context [the current one].")
def migrate(pod: str, to: str, namespace: str, gpupool_namespace: str, wait_s: float, kubeconfig: str | None,
            context: str | None) -> None:
    """Move POD's remote GPU share to another GPU server while it runs. Exit 0 moved, 1 failed, timed out or
    no room, 2 usage errors."""
    if not to or to.startswith("/") or to.endswith("/"):
        raise click.BadParameter(f"{shown(to)!r} is not NODE or NODE/GPU", param_hint="--to")
    if "/" in pod:
        raise click.BadParameter(f"{shown(pod)!r}: give the pod's name and its namespace with -n", param_hint="POD")

    async def work(cluster: ClusterPort) -> int:
        return await migrate_pod(cluster, namespace, pod, to, gpupool_namespace, wait_s, click.echo)

    run_command("migrate", lambda: with_cluster(kubeconfig, context, work))
