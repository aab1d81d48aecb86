"""PreFilter / Filter / Score / Reserve / Unreserve `remote_tiers` (the claim profile): where a remote share
(DeviceClass isolation `remote`, docs/remote.md) is served and where its pod runs.

The share lives in the GPU server of a GPU's node, and its pod may run on that node or on any other node
whose agent runs (it mounts the forwarding library). The framework chooses among GPU nodes as for any claim;
this plugin ranks them in tiers, the first tier with a node that fits winning, the policy choosing within
it: (a) a GPU node the pod may run on itself, with room for the pod's CPU and memory there (the pod then
runs there); (b) a GPU node in a zone (`topology.kubernetes.io/zone`) of a node the pod may run on (the pod
on such a node); (c) any GPU node with a server (the pod on any node it may run on). Within (b) and (c) the
pod goes to the node with the most CPU free, nodes of unknown CPU last, ties by name.

PreFilter: one GPU per remote claim (the forwarding library reaches one GPU server; more is
UNSCHEDULABLE_AND_UNRESOLVABLE with the reason), and the request the GPU node must give becomes the share and
its memory spill alone (oversubscription spills into the GPU server's worker, on the GPU node): the pod's
CPU and memory are its own node's. Filter: no node the pod may run on (gpupool.scheduler.node_rules, its
CPU and memory requests) fails every GPU node with the reason (UNSCHEDULABLE_AND_UNRESOLVABLE: evicting
GPU pods makes no room on a pod's node). Reserve records the pod's node in
`cycle.pod_node` and holds its CPU and memory there (`holds`): the ledger holds the share on the GPU node
and none of the pod's CPU or memory, so a burst of remote pods spreads over the pod nodes instead of all
picking the one that looked roomiest. A hold goes with its claim's ledger entry.

A move's question (Phase.MOVE, gpupool.scheduler.moves): the pod runs already and stays where it runs, its
CPU and memory held there. Its one node is the pod's (`spec.nodeName`; a pod not known: every node whose agent
runs that it may run on), with no room asked; the tiers are the same (the pod's own node, its zone, any), and
Reserve holds nothing on the pod's node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.dra import REMOTE_ISOLATION, oversub_mib
from gpupool.api.quantity import QuantityError, bytes_to_mib, cpu_milli, parse_quantity
from gpupool.core.model import PodRequest
from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState, NodeSet, Phase
from gpupool.scheduler.framework.interface import Handle, NodeScores
from gpupool.scheduler.framework.status import SUCCESS, Code, Status, unresolvable
from gpupool.scheduler.node_rules import MAY_RUN, may_run

ZONE_LABEL = "topology.kubernetes.io/zone"  # a remote share prefers a GPU in the zone of its pod's node
TIER_SCORE = 1e9  # one tier outweighs any policy score (and MIG's fragmentation, which remote shares have not)
SAME_NODE, SAME_ZONE, ANY = 2, 1, 0
NO_HOST = f"no node that runs gpupool's agent can take this pod ({MAY_RUN}, its CPU and memory requests)"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, slots=True)
class PodNode:
    """A node a remote share's pod may run on."""

    name: str
    zone: str | None  # its topology.kubernetes.io/zone label
    cpu_free: int | None  # milli-cores, at most what is free there (RemoteTiers.headroom); None: unknown


@dataclass(slots=True)
class _Remote:
    full: PodRequest  # the pod's request with its share, as claim_request read it
    spill: int  # MiB the share may spill, on the GPU node
    hosts: list[PodNode]
    tiers: dict[int, int]  # GPU node index -> tier


def wants_remote(cycle: CycleState) -> bool:
    return cycle.claim is not None and cycle.claim.isolation == REMOTE_ISOLATION and cycle.request is not None


class RemoteTiers:
    name: ClassVar[str] = "remote_tiers"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        # claim UID -> (the pod's node, its CPU milli-cores, its memory MiB), see the module doc
        self.holds: dict[str, tuple[str, int, int]] = {}

    # --- PreFilter ------------------------------------------------------------------------------------

    def pre_filter(self, cycle: CycleState) -> Status:
        if not wants_remote(cycle):
            return SUCCESS
        assert cycle.claim is not None and cycle.request is not None
        ask = cycle.claim.ask
        if ask.count != 1:
            return unresolvable(
                f"claim {cycle.claim.key} asks for {ask.count} GPUs of isolation {REMOTE_ISOLATION}: a remote share "
                "is served by one GPU (the forwarding library reaches one GPU server); ask for count 1")
        spill = 0 if ask.memory_mib is None else oversub_mib(ask.memory_mib, cycle.claim.spill_factor)
        full = cycle.request
        cycle.data[self.name] = _Remote(full, spill, [], {})
        cycle.request = replace(full, cpu_milli=0, memory_mib=spill)
        return SUCCESS

    # --- Filter: the pod's nodes, each GPU node's tier ---------------------------------------------------

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        remote: _Remote | None = cycle.data.get(self.name)
        if remote is None or cycle.claim is None:
            return
        pod_request = replace(remote.full, memory_mib=remote.full.memory_mib - remote.spill)
        moving = cycle.phase is Phase.MOVE
        remote.hosts = self._running_on(cycle) if moving else \
            self._pod_nodes(cycle, sorted(cycle.claim.agents), pod_request)
        if not remote.hosts:
            # No eviction on a GPU node can make room on a pod's node: no reclaim or preemption for it.
            nodes.reject_all(NO_HOST, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
            return
        state = self.handle.ledger.state
        host_names = {h.name for h in remote.hosts}
        zones = {h.zone for h in remote.hosts} - {None}
        for i, name in zip(nodes.nodes().tolist(), nodes.alive_names(), strict=True):
            if i < 0:
                continue
            # On its own node the pod needs its CPU and memory beside the share (the ledger's room there).
            own = name in host_names and (moving or int(state.cpu_free[i]) >= remote.full.cpu_milli
                                          and int(state.mem_free[i]) >= remote.full.memory_mib)
            remote.tiers[i] = SAME_NODE if own else SAME_ZONE if self._zone(name) in zones else ANY

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        remote: _Remote | None = cycle.data.get(self.name)
        if remote is None:
            return NodeScores()
        return NodeScores(values=np.array([TIER_SCORE * remote.tiers.get(i, ANY) for i in nodes.tolist()],
                                          dtype=np.float64))

    # --- Reserve: the pod's node ---------------------------------------------------------------------

    def reserved(self, cycle: CycleState, node: str) -> bool:
        return False  # holds nothing the framework could keep

    def reserve(self, cycle: CycleState, node: str) -> Status:
        remote: _Remote | None = cycle.data.get(self.name)
        if remote is None or cycle.claim is None:
            return SUCCESS
        i = self.handle.ledger.state.index.get(node, -1)
        tier = remote.tiers.get(i, ANY)
        if tier == SAME_NODE:
            pod_node = node
        else:
            zone = self._zone(node)
            pod_node = self._roomiest([h for h in remote.hosts if tier == ANY or h.zone == zone] or remote.hosts)
        cycle.pod_node = pod_node
        if cycle.phase is Phase.MOVE:
            return SUCCESS  # the pod's CPU and memory are held where it runs already
        self.holds[cycle.claim.uid] = (pod_node, remote.full.cpu_milli, remote.full.memory_mib - remote.spill)
        return SUCCESS

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        if cycle.claim is not None:
            self.holds.pop(cycle.claim.uid, None)

    # --- the pods' nodes ------------------------------------------------------------------------------

    def _zone(self, name: str) -> str | None:
        obj = self.handle.ledger.node_objs.get(name) or {}
        zone = ((obj.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL)
        return None if zone is None else str(zone)

    def _running_on(self, cycle: CycleState) -> list[PodNode]:
        """A moving share's pod's node: where it is bound, else every node whose agent runs that it may run
        on (no room asked: it runs already)."""
        assert cycle.claim is not None
        bound = (cycle.pod.get("spec") or {}).get("nodeName")
        objs = self.handle.ledger.node_objs
        names = [str(bound)] if bound else [n for n in sorted(cycle.claim.agents) if may_run(cycle.pod, objs.get(n))]
        return [PodNode(n, self._zone(n), None) for n in names]

    def _pod_nodes(self, cycle: CycleState, names: Iterable[str], request: PodRequest) -> list[PodNode]:
        """The nodes among `names` (nodes running gpupool's agent) that the pod may run on, less those where
        its CPU or memory request clearly does not fit (see headroom)."""
        out = []
        held = self._held_by_pods()
        objs = self.handle.ledger.node_objs
        for name in names:
            if not may_run(cycle.pod, objs.get(name)):
                continue
            room = self.headroom(name, held.get(name, (0, 0)))
            if room is not None and (room[0] < request.cpu_milli or room[1] < request.memory_mib):
                continue
            out.append(PodNode(name, self._zone(name), None if room is None else room[0]))
        return out

    def _held_by_pods(self) -> dict[str, tuple[int, int]]:
        """(CPU milli-cores, memory MiB) the pods of remote shares hold, by their node; the holds of claims
        that left the ledger are dropped first (their pods are gone)."""
        for uid in [u for u in self.holds if u not in self.handle.ledger.entries]:
            del self.holds[uid]
        out: dict[str, tuple[int, int]] = {}
        for node, cpu, mem in self.holds.values():
            have = out.get(node, (0, 0))
            out[node] = (have[0] + cpu, have[1] + mem)
        return out

    def headroom(self, name: str, held: tuple[int, int]) -> tuple[int, int] | None:
        """(CPU milli-cores, memory MiB) at most free on a node, None when its Node does not say: its
        allocatable less what the ledger holds there (pods of gpupool's GPUs; claims hold none), from the
        ledger's state for a node it knows, else from the Node's allocatable (a GPU-less node without an
        inventory, where the ledger holds nothing), less `held` by the pods of remote shares placed there.
        Other pods are kube-scheduler's to count, so this can only over-estimate: a node it finds too small
        is too small."""
        state = self.handle.ledger.state
        i = state.index.get(name)
        if i is not None:
            free = int(state.cpu_free[i]), int(state.mem_free[i])
        else:
            allocatable = ((self.handle.ledger.node_objs[name].get("status") or {}).get("allocatable") or {})
            if "cpu" not in allocatable or "memory" not in allocatable:
                return None
            try:
                free = (cpu_milli(allocatable["cpu"]),
                        bytes_to_mib(parse_quantity(allocatable["memory"], "allocatable memory")[0], round_up=False))
            except QuantityError:
                return None
        return free[0] - held[0], free[1] - held[1]

    @staticmethod
    def _roomiest(nodes: Iterable[PodNode]) -> str:
        """The node with the most CPU free (an upper bound, see headroom), nodes of unknown CPU last; ties by
        name, so that the choice is the same on every pass."""
        return min(nodes, key=lambda n: (n.cpu_free is None, -(n.cpu_free or 0), n.name)).name
