"""`gpupool drain NODE`: take a GPU node out of service, moving what can move instead of evicting it.

1. Cordon the node (spec.unschedulable: new pods and claims go elsewhere).
2. Move every remote share served from the node's GPUs to another GPU server, the one the scheduler's
   framework chooses (gpupool.scheduler.moves, as `gpupool migrate`: never NODE, never a cordoned node), the
   largest share first, each choice counted before the next is asked. Their pods, on any node, keep
   running: their clients are handed over by the agents. A share that fits nowhere is listed and left where
   it is.
3. Evict (the Eviction API: PodDisruptionBudgets hold; a 429 is tried again until --wait runs out) the pods
   running on NODE that hold its GPUs in place: pods granted gpupool's device-plugin resources, and pods
   whose DRA claims are allocated on NODE's pool with an isolation other than remote. Every other pod is
   left to `kubectl drain` (gpupool does not decide about workloads that hold none of its GPUs).
4. Follow the moves until they finish or --wait runs out.

Exit status: 0 all of it done; 1 something left (listed: shares that fit nowhere, failed or unfinished moves,
pods not evicted); 2 usage errors (no such node). --dry-run prints the plan and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from gpupool.api.counted import TERMINAL_PHASES, counted_allocation
from gpupool.api.dra import REMOTE_ISOLATION, ClaimError, claim_shares
from gpupool.api.logsafe import shown
from gpupool.api.moves import DEFAULT_DEADLINE_S, Move, new_move
from gpupool.api.names import DOMAIN
from gpupool.api.pod import pod_key
from gpupool.cluster.port import NODES, ClusterPort, Conflict, NotFound, Obj, TooManyRequests
from gpupool.commands.migrate import (
    DEFAULT_NAMESPACE,
    DEFAULT_WAIT_S,
    Echo,
    Pool,
    Refused,
    Share,
    Sleep,
    choose_target,
    follow,
    live_claims,
    outcome,
    pod_claim_names,
    read_pool,
    run_command,
    with_cluster,
    write_moves,
)

EVICT_RETRY_S = 5.0  # a budget that forbids an eviction now is asked again this often


@dataclass(slots=True)
class Plan:
    moves: dict[str, tuple[Share, Move]] = field(default_factory=dict)  # claim UID -> the share, its new move
    moving: dict[str, Share] = field(default_factory=dict)  # already moving away from NODE: followed
    stuck: list[str] = field(default_factory=list)  # shares that stay, with why
    evict: list[Obj] = field(default_factory=list)


def holds_gpus_in_place(pod: Mapping[str, Any], node: str, claims: Mapping[tuple[str, str], Obj]) -> bool:
    """Whether the pod, running on `node`, holds that node's GPUs itself: a device-plugin grant (gpupool's
    resources, or an allocation gpupool wrote for it), or a claim allocated on `node`'s pool served in place
    (any isolation but remote, whose share a GPU server holds and a move hands over)."""
    if counted_allocation(pod) is not None:
        return True
    for c in (pod.get("spec") or {}).get("containers") or []:
        resources = c.get("resources") or {}
        if any(str(k).startswith(f"{DOMAIN}/") for part in ("limits", "requests")
               for k in (resources.get(part) or {})):
            return True
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    for name in pod_claim_names(pod):
        claim = claims.get((namespace, name))
        if claim is None:
            continue
        try:
            shares = claim_shares(claim)
        except ClaimError:
            continue
        if shares.isolation != REMOTE_ISOLATION and any(d.pool == node for d in shares.devices):
            return True
    return False


def plan_drain(pool: Pool, node: str, pods: list[Obj], now: float | None = None,
               deadline_s: float = DEFAULT_DEADLINE_S) -> Plan:
    plan = Plan()
    others = sorted(n for n in pool.servers if n != node)
    # the largest shares choose first: small ones fit into what is left more easily
    for share in sorted(pool.shares(), key=lambda s: (-share_size(pool, s), s.label)):
        move = share.move
        if share.unfinished and move is not None:
            if move.source.node == node and move.target.node != node:
                plan.moving[share.uid] = share
            elif move.target.node == node:
                plan.stuck.append(f"claim {shown(share.label)}: a move to {shown(str(move.target))} is unfinished "
                                  f"({move.state}); run gpupool drain again once it is")
            continue
        if share.served.node != node:
            continue
        chosen = choose_target(pool, share, others, avoid=[node])
        refused = chosen if isinstance(chosen, str) else pool.targets.take(pool.moving(share), chosen)
        if isinstance(chosen, str) or refused is not None:
            plan.stuck.append(f"claim {shown(share.label)} on {shown(str(share.served))} fits on no other GPU "
                              f"server: {shown(refused or '', 2000)}")
            continue
        at = time.time() if now is None else now
        plan.moves[share.uid] = (share, new_move(share.label, share.served, chosen, at, deadline_s))
    claims = {(str(c["metadata"].get("namespace", "")), str(c["metadata"].get("name", ""))): c for c in pool.claims}
    plan.evict = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node
                  and (p.get("status") or {}).get("phase") not in TERMINAL_PHASES
                  and holds_gpus_in_place(p, node, claims)]
    plan.evict.sort(key=pod_key)
    return plan


def share_size(pool: Pool, share: Share) -> int:
    """The share's memory where it is served (for the order the targets are chosen in)."""
    state = pool.targets.ledger.state
    i = state.index.get(share.served.node)
    if i is None:
        return 0
    try:
        (d,) = claim_shares(share.claim).devices
    except (ClaimError, ValueError):
        return 0
    return d.memory_mib if d.memory_mib is not None else int(state.gpu_mem_total[i, share.served.index])


async def evict(cluster: ClusterPort, pod: Obj, deadline: float, sleep: Sleep,
                clock: Callable[[], float]) -> str | None:
    """Evict one pod, asking again while a budget forbids it and time is left; None when it is gone, else why
    not."""
    meta = pod["metadata"]
    while True:
        try:
            await cluster.evict_pod(str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))
            return None
        except (NotFound, Conflict):
            return None  # gone already, or replaced by another pod of the name: not this one's to hold
        except TooManyRequests as e:
            if clock() >= deadline:
                return f"its disruption budget forbids it ({shown(e.message, 500)})"
        await sleep(min(EVICT_RETRY_S, max(0.0, deadline - clock())))


async def drain_node(cluster: ClusterPort, node: str, gpupool_namespace: str, wait_s: float, dry_run: bool,
                     echo: Echo, sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
                     deadline_s: float = DEFAULT_DEADLINE_S, wall: Callable[[], float] = time.time) -> int:
    """The command's work; returns the exit status (raises Refused for usage errors)."""
    try:
        await cluster.get_node(node)
    except NotFound:
        raise Refused(f"node {shown(node)} not found") from None
    deadline = clock() + wait_s
    pool = await read_pool(cluster, gpupool_namespace)
    pods, _ = await cluster.list_pods(fields={"spec.nodeName": node})
    plan = plan_drain(pool, node, pods, wall(), deadline_s)
    prefix = "would " if dry_run else ""
    echo(f"{prefix}cordon {shown(node)}")
    for share, move in plan.moves.values():
        echo(f"{prefix}move claim {shown(share.label)}: {shown(str(move.source))} -> {shown(str(move.target))}")
    for share in plan.moving.values():
        assert share.move is not None
        echo(f"claim {shown(share.label)} is already moving to {shown(str(share.move.target))} ({share.move.state})")
    for pod in plan.evict:
        echo(f"{prefix}evict pod {shown(pod_key(pod))} (it holds a GPU of {shown(node)} in place)")
    left = list(plan.stuck)
    if dry_run:
        for why in left:
            echo(f"would leave: {why}")
        return 1 if left else 0
    await cluster.patch_object(NODES, node, {"spec": {"unschedulable": True}})
    if plan.moves:
        await write_moves(cluster, gpupool_namespace, {uid: m for uid, (_, m) in plan.moves.items()},
                          live_claims(pool))
    for pod in plan.evict:
        refused = await evict(cluster, pod, deadline, sleep, clock)
        if refused is None:
            echo(f"evicted pod {shown(pod_key(pod))}")
        else:
            left.append(f"pod {shown(pod_key(pod))} not evicted: {refused}")
    following = {uid: s.label for uid, (s, _) in plan.moves.items()} | {u: s.label for u, s in plan.moving.items()}
    if following and wait_s > 0:
        last = await follow(cluster, gpupool_namespace, following, max(0.0, deadline - clock()), echo, sleep, clock)
        left += [o for uid, label in following.items() if (o := outcome(label, last[uid], wait_s)) is not None]
    elif following:
        echo(f"{len(following)} move(s) requested; not waiting (--wait 0)")
    for why in left:
        echo(f"left: {why}")
    echo(f"gpupool drain {shown(node)}: {'done' if not left else f'{len(left)} thing(s) left'}; other pods are "
         "kubectl drain's")
    return 1 if left else 0


@click.command("drain")
@click.argument("node")
@click.option("--gpupool-namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="The namespace gpupool is installed in (its moves ConfigMap).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=DEFAULT_WAIT_S, show_default=True,
              help="Seconds to keep asking for evictions a disruption budget forbids and to follow the moves.")
@click.option("--deadline", "deadline_s", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_DEADLINE_S,
              show_default=True, help="Seconds each move may take; still unfinished then, the scheduler cancels it.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig file [$KUBECONFIG, ~/.kube/config, or the in-cluster service account].")
@click.option("--context", default=None, help="Kubeconfig context [the current one].")
def drain(node: str, gpupool_namespace: str, wait_s: float, deadline_s: float, dry_run: bool,
          kubeconfig: str | None, context: str | None) -> None:
    """Cordon NODE, move the remote GPU shares it serves to other GPU servers, and evict the pods that hold its
    GPUs in place. Exit 0 done, 1 something left (listed), 2 usage errors."""

    async def work(cluster: ClusterPort) -> int:
        return await drain_node(cluster, node, gpupool_namespace, wait_s, dry_run, click.echo,
                                deadline_s=deadline_s)

    run_command("drain", lambda: with_cluster(kubeconfig, context, work))
