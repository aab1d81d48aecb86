"""The scheduler's view of team queues: the GPUQueue objects and namespace labels from their watch caches,
and each queue's usage derived from the ledger (never from what a pod says about itself).

No GPUQueue in the cluster (or no CRD installed): queues are off and every queue plugin passes. The
reflectors retry with back-off while the CRD is missing, so installing it later turns queues on.

Usage is kept incrementally: the ledger tells the cache which entry appeared, went or changed, and each
change moves one pod's charge in or out of its queue's sum, so a filter or reserve reads it in
O(queues + pods left out), not O(pods). The sums are recounted from scratch only when what a charge
depends on changes: the queues, a namespace's labels (which queue it joins), or the ledger's nodes (card
sizes).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from gpupool.api.logsafe import shown
from gpupool.api.queue import GROUP, KIND, PLURAL, VERSION, Queues, read_queues
from gpupool.cluster.port import NAMESPACES, ClusterPort, Kind, Obj
from gpupool.cluster.reflector import Reflector
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.queues import ZERO, Quota, card_memory, charge_of_allocation
from gpupool.scheduler.ledger import Ledger

log = logging.getLogger(__name__)

GPUQUEUES = Kind(GROUP, VERSION, KIND, PLURAL, namespaced=False)


def namespace_of(key: str) -> str:
    return key.split("/", 1)[0]


class QueueCache:
    def __init__(self, cluster: ClusterPort, ledger: Ledger, default_queue: str = "default") -> None:
        self.ledger = ledger
        self.default_queue = default_queue
        self._queues_ref = Reflector(cluster, GPUQUEUES, on_event=self._queues_changed)
        self._ns_ref = Reflector(cluster, NAMESPACES, on_event=self._namespace_changed)
        self._queues: Queues | None = None
        self._memory_generation = -1
        self._capacity_generation = -1
        self._memory: dict[str, int] = {}
        # The incremental usage: each counted pod's (queue, charge) and the sums per queue; None = recount.
        self._charges: dict[str, tuple[str, Quota]] = {}
        self._sums: dict[str, Quota] | None = None
        self._sums_basis: tuple[int, int] = (-1, -1)  # (queues built, ledger generation) they were counted on
        self._queues_built = 0
        ledger.listeners.append(self._entry_changed)

    async def start(self) -> None:
        self._queues_ref.start()
        self._ns_ref.start()

    async def stop(self) -> None:
        await self._queues_ref.stop()
        await self._ns_ref.stop()

    def _queues_changed(self, type_: str, obj: Obj, old: Obj | None) -> None:
        self._queues = None  # rebuilt at the next read: many events in a burst cost one rebuild
        self._sums = None

    def _namespace_changed(self, type_: str, obj: Obj, old: Obj | None) -> None:
        labels = ((obj.get("metadata") or {}).get("labels") or {})
        before = (((old or {}).get("metadata") or {}).get("labels") or {})
        if type_ != "MODIFIED" or labels != before:
            self._sums = None  # its pods may join another queue: recounted at the next read

    def objects(self) -> list[Obj]:
        return self._queues_ref.items()

    @property
    def enabled(self) -> bool:
        return bool(self._queues_ref.store)

    @property
    def queues(self) -> Queues:
        if self._queues is None or self._capacity_generation != self.ledger.generation:
            # The root lends what nobody is guaranteed: the cluster's GPUs as the ledger knows them.
            state = self.ledger.state
            gpus = [g for n in state.nodes for g in n.gpus]
            capacity = Quota(len(gpus) * MILLI_PER_GPU, sum(g.memory_mib for g in gpus), len(gpus) * 100)
            self._capacity_generation = self.ledger.generation
            self._queues = read_queues(self._queues_ref.items(), capacity=capacity, default=self.default_queue)
            self._queues_built += 1
            for name, problem in self._queues.errors.items():
                log.warning("GPUQueue %s ignored: %s", shown(name, 64), shown(problem, 300))
        return self._queues

    def queue_of(self, namespace: str) -> str:
        ns = self._ns_ref.get(namespace)
        labels: Mapping[str, str] = ((ns or {}).get("metadata") or {}).get("labels") or {}
        return self.queues.queue_of(labels)

    def gpu_memory(self) -> dict[str, int]:
        """GPU memory by UUID (for charging shares by the card they sit on)."""
        if self._memory_generation != self.ledger.generation:
            self._memory = card_memory(self.ledger.state.nodes)
            self._memory_generation = self.ledger.generation
        return self._memory

    def largest_gpu_mib(self) -> int:
        return max(self.gpu_memory().values(), default=0)

    def usage(self, without: str = "", gone: Collection[str] = ()) -> dict[str, Quota]:
        """Per leaf queue, what the ledger's allocations (bound and in flight) charge; `without` leaves
        one pod UID out (the pod being decided), `gone` more (pods being evicted). A fresh dict each call."""
        out = dict(self._current_sums())
        for uid in {without, *gone}:
            held = self._charges.get(uid)
            if held is not None:
                queue, charge = held
                out[queue] = out[queue] - charge
        return out

    def recount(self) -> dict[str, Quota]:
        """The usage counted from scratch over the ledger (what `usage()` keeps incrementally)."""
        memory = self.gpu_memory()
        out: dict[str, Quota] = {}
        for entry in self.ledger.entries.values():
            queue = self.queue_of(namespace_of(entry.key))
            out[queue] = out.get(queue, Quota()) + charge_of_allocation(entry.allocation, memory)
        return out

    def _current_sums(self) -> dict[str, Quota]:
        self.queues  # noqa: B018  (rebuilds the queues, and counts the rebuild, when the nodes changed)
        basis = (self._queues_built, self.ledger.generation)
        if self._sums is None or self._sums_basis != basis:
            memory = self.gpu_memory()
            self._charges = {}
            for uid, entry in self.ledger.entries.items():
                self._charges[uid] = (self.queue_of(namespace_of(entry.key)),
                                      charge_of_allocation(entry.allocation, memory))
            self._sums = {}
            for queue, charge in self._charges.values():
                self._sums[queue] = self._sums.get(queue, ZERO) + charge
            self._sums_basis = basis
        return self._sums

    def _entry_changed(self, uid: str) -> None:
        """The ledger's entry for `uid` appeared, went or was replaced: move its charge."""
        sums = self._sums
        if sums is None or self._sums_basis != (self._queues_built, self.ledger.generation):
            self._sums = None  # counted again at the next read, on the new basis
            return
        old = self._charges.pop(uid, None)
        if old is not None:
            sums[old[0]] = sums[old[0]] - old[1]
        entry = self.ledger.entries.get(uid)
        if entry is not None:
            queue = self.queue_of(namespace_of(entry.key))
            charge = charge_of_allocation(entry.allocation, self.gpu_memory())
            self._charges[uid] = (queue, charge)
            sums[queue] = sums.get(queue, ZERO) + charge

    def describe(self) -> dict[str, Any]:
        """For the debug view: queue names and the objects that could not be used."""
        return {"enabled": self.enabled, "queues": sorted(self.queues.tree.specs), "errors": dict(self.queues.errors)}
