"""What one scheduling or binding cycle knows: the pod (as the API shows it) and what plugins derived
from it, and the candidate nodes with the reasons of those that were rejected."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from itertools import repeat
from typing import Any

import numpy as np

from gpupool.api.dra import ClaimAsk
from gpupool.api.pod import ParsedPod
from gpupool.cluster.port import Obj
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.policy import Policy
from gpupool.core.state import BoolArray, IntArray
from gpupool.scheduler.framework.status import Code


class Phase(StrEnum):
    """Which extender call the cycle serves: filter and prioritize are kube-scheduler's scheduling cycle
    (they may nominate), bind is its binding cycle."""

    FILTER = "filter"
    PRIORITIZE = "prioritize"
    BIND = "bind"
    # The claim allocator's cycle (gpupool.scheduler.claims): a gated pod's DRA claim is scheduled and
    # reserved in one go, then its allocation is written; kube-scheduler binds the pod afterwards.
    CLAIM = "claim"
    # A question, never a placement: where would a running remote share's claim go if its share moved
    # (gpupool.scheduler.moves, for `gpupool migrate` / `drain`)? Its pod is bound and stays where it runs; the
    # claim is charged to its queue already.
    MOVE = "move"


@dataclass(slots=True)
class ClaimInCycle:
    """The DRA claim a CLAIM cycle allocates for its pod, with what the claim allocator read of the cluster
    for it. The ledger holds the claim's share under the claim's own UID (as it counts a claim however it
    was allocated), so a reservation of this cycle is the claim's, not the pod's (CycleState.holder)."""

    uid: str
    key: str  # namespace/name of the claim
    ask: ClaimAsk
    isolation: str  # its DeviceClass's
    config: tuple[Obj, ...]  # its DeviceClass's config, copied into the allocation
    # gpupool's untainted devices of the claim's kind (shared GPUs, GPUs in MIG mode, or shared GPUs with a
    # GPU server), by node, from the newest ResourceSlices; and every node that publishes a pool (its agent
    # runs: a remote share's pod may run there)
    gpus: Mapping[str, frozenset[int]]
    agents: frozenset[str]
    spill_factor: Fraction = Fraction(1)  # memory oversubscription its class grants (claim_request reads it)


@dataclass(slots=True)
class CycleState:
    pod: Obj  # from the scheduler's pod cache (or the API server), never from the request body
    phase: Phase
    uid: str
    key: str  # namespace/name
    now: float
    # Set by PreFilter plugins (gpu_request): None = the pod asks for no gpupool resource.
    parsed: ParsedPod | None = None
    request: PodRequest | None = None
    policy: Policy | None = None
    # gpu_fit's answer: the nodes it checked and, per node, the GPU slots that can take the pod's share (see
    # `gpu_ok`, built from them only when a plugin needs it: most filters never do).
    fit_nodes: IntArray | None = None
    fit_rows: BoolArray | None = None
    fit_shape: tuple[int, int] = (0, 0)  # the ledger's ClusterState: (nodes, GPU slots per node)
    _gpu_ok: BoolArray | None = None
    # node index -> why some of its GPUs are not offered to this pod (shares_per_gpu); GPU choice honours
    # gpu_ok, so these nodes need no other treatment.
    narrowed: dict[int, str] = field(default_factory=dict)
    # Allocations a plugin decided per node index (mig_placement: the MIG instance it chose there); None: the
    # policy places the pod. With a dict, Reserve takes the node's allocation from it, and a node without one
    # cannot take the pod. Plugins tell each other through the cycle, never by importing one another.
    placed: dict[int, Allocation] | None = None
    allocation: Allocation | None = None  # the reservation made or kept by Reserve
    data: dict[str, Any] = field(default_factory=dict)  # plugin-private, keyed by plugin name
    claim: ClaimInCycle | None = None  # a CLAIM cycle's claim (set by the claim allocator)
    # Where the pod runs when that is not the node holding its devices (a remote share: remote_tiers' Reserve)
    pod_node: str | None = None

    @property
    def wants_gpu(self) -> bool:
        return self.request is not None

    @property
    def holder(self) -> str:
        """The UID the ledger holds this cycle's reservation under: the claim's in a CLAIM cycle, else the
        pod's."""
        return self.claim.uid if self.claim is not None else self.uid

    def set_fit(self, nodes: IntArray, rows: BoolArray, shape: tuple[int, int]) -> None:
        self.fit_nodes, self.fit_rows, self.fit_shape, self._gpu_ok = nodes, rows, shape, None

    @property
    def gpu_ok(self) -> BoolArray | None:
        """Per node (rows of the ledger's ClusterState) the GPU slots that can take the pod's share, as
        gpu_fit found them; Filter plugins after it may only narrow it (in place). Rows of nodes not checked
        are all False. None before gpu_fit ran."""
        if self._gpu_ok is None and self.fit_nodes is not None and self.fit_rows is not None:
            self._gpu_ok = np.zeros(self.fit_shape, dtype=bool)
            self._gpu_ok[self.fit_nodes] = self.fit_rows
        return self._gpu_ok


@dataclass(frozen=True, slots=True)
class Offered:
    """A request's node names as arrays: the ledger index of each (-1: not a gpupool node), and the names
    themselves as an object array, so that the subsets a filter answers with are taken at C speed. Both
    read-only: NameIndex hands the same arrays to later requests."""

    index: IntArray
    names: np.ndarray

    @classmethod
    def of(cls, names: list[str], index: dict[str, int]) -> Offered:
        # At C speed, straight into the array (a list of thousands of ints first costs as much again).
        found = np.fromiter(map(index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        objects = np.empty(len(names), dtype=object)
        objects[:] = names
        found.flags.writeable = objects.flags.writeable = False
        return cls(found, objects)


class NameIndex:
    """`Offered` remembered for the last few name lists. Where kube-scheduler offers every node
    (`percentageOfNodesToScore: 100`, or a small cluster) the same thousands of names come call after call;
    each arrives as new strings whose hashes the lookup would compute again, while comparing a list with the
    remembered one runs at C speed without hashing. (With its default adaptive percentage it offers a
    rotating part of a large cluster, and this saves nothing.) Kept per ledger index dict (the ledger builds
    a new one when its nodes change)."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._kept: list[tuple[dict[str, int], list[str], Offered]] = []

    def lookup(self, names: list[str], index: dict[str, int]) -> Offered:
        for k, (kept_index, kept_names, found) in enumerate(self._kept):
            if kept_index is index and kept_names == names:
                if k:
                    self._kept.insert(0, self._kept.pop(k))
                return found
        found = Offered.of(names, index)
        self._kept.insert(0, (index, list(names), found))
        del self._kept[self.keep:]
        return found


class NodeSet:
    """The nodes a request offers, by name, with the ledger's index of each (-1: not a gpupool node).
    Filter plugins see the `nodes()` still feasible and `reject` some with a reason; reasons are kept by
    name, split by code as the extender answers them. With `reasons` False (prioritize: its answer has no
    place for them) rejections keep no reasons, and plugins may skip writing them."""

    def __init__(self, names: list[str], index: dict[str, int] | Offered, reasons: bool = True) -> None:
        offered = index if isinstance(index, Offered) else Offered.of(names, index)
        self.names = names
        self.reasons = reasons
        self.index: IntArray = offered.index
        self._objects = offered.names
        self.alive: IntArray = np.arange(len(names), dtype=np.int64)  # positions into names
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self._all_alive = True

    def __len__(self) -> int:
        return len(self.alive)

    def nodes(self) -> IntArray:
        """Ledger indices of the nodes still feasible (-1 for those not yet rejected as unknown)."""
        return self.index if self._all_alive else self.index[self.alive]

    def alive_names(self) -> list[str]:
        if self._all_alive:
            return self.names
        names: list[str] = self._objects[self.alive].tolist()
        return names

    def alive_offered(self) -> Offered:
        """The feasible nodes as an `Offered` of their own (read-only views, like every Offered)."""
        if self._all_alive:
            return Offered(self.index, self._objects)
        index, objects = self.index[self.alive], self._objects[self.alive]
        index.flags.writeable = objects.flags.writeable = False
        return Offered(index, objects)

    def reject(self, bad: BoolArray, reasons: Sequence[str], code: Code) -> None:
        """Reject the feasible nodes where `bad` (aligned with `nodes()`) is True, `reasons` one per
        rejected node in order (ignored, and may be empty, when the set keeps no reasons)."""
        positions = self.alive[bad]
        if not len(positions):
            return
        if self.reasons:
            target = self.unresolvable if code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE else self.failed
            target.update(zip(self._objects[positions].tolist(), reasons, strict=True))
        self.alive = self.alive[~bad]
        self._all_alive = False

    def example(self) -> str | None:
        """One rejected node's reason, to say why nothing fits: the last rejection came from the last Filter
        plugin that rejected, so that node passed the most checks and its reason is the most telling (e.g. a
        GPU at its pod limit rather than a node without room)."""
        return next(reversed(self.failed.values()), None) or next(reversed(self.unresolvable.values()), None)

    def reject_all(self, reason: str, code: Code) -> None:
        self.reject(np.ones(len(self.alive), dtype=bool), [reason] * len(self.alive), code)
