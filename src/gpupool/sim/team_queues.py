"""Team queues in the timeline replay, with the scheduler's own rules (gpupool.core.queues for admission,
gpupool.core.preemption for reclaim): the replay asks before a pod starts, and when it may not start or fits
nowhere, evicts the victims core chooses (they go back to the queue and run again in full later).

Pods join queues by a stable hash of their name (`--queues N`: N queues each guaranteed 1/N of the GPUs),
or as a YAML file lists them (`--queues FILE.yaml`):

  queues:
    - {name: research, guaranteed: {gpus: "600"}, weight: 2}
    - {name: prod, guaranteed: {gpus: "400"}, maximum: {gpus: "800"}, lend: false}

(the GPUQueue spec's fields; pods are spread over the listed queues by the same hash). Charges are those of
the live scheduler: a pod is charged what it holds, card by card.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpupool.api.queue import QueueError, queue_spec
from gpupool.core.fit import fits_without
from gpupool.core.model import MILLI_PER_GPU, Node
from gpupool.core.preemption import Preemptor, Running, in_quota, plan_preemption
from gpupool.core.queue_order import Waiting, order
from gpupool.core.queues import (
    Admitted,
    QueueSpec,
    QueueTree,
    Quota,
    admit,
    card_memory,
    charge_of_allocation,
    charge_of_request,
)
from gpupool.core.state import ClusterState
from gpupool.sim.timeline import TimedPod
from gpupool.sim.timeline_report import percentile_of_waits


class QueueFileError(ValueError):
    pass


def queue_of(key: str, names: Sequence[str]) -> str:
    """The queue a pod joins: a hash of its name that is the same on every run and machine."""
    return names[zlib.crc32(key.encode()) % len(names)]


def even_queues(count: int, nodes: Sequence[Node]) -> list[QueueSpec]:
    """`count` queues, each guaranteed an equal share of the GPUs (whole milli-GPUs; GPUs only)."""
    gpus = sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
    return [QueueSpec(f"q{i}", Quota(gpus // count, 0, 0), dims=frozenset({"gpu_milli"})) for i in range(count)]


def queues_from_file(path: Path) -> list[QueueSpec]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise QueueFileError(f"{path}: {e}") from None
    items = (doc or {}).get("queues") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise QueueFileError(f"{path}: expected a mapping with a non-empty list `queues`")
    out: list[QueueSpec] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not item.get("name"):
            raise QueueFileError(f"{path}: queues[{i}] needs a name")
        spec = {k: v for k, v in item.items() if k != "name"}
        try:
            out.append(queue_spec({"metadata": {"name": str(item["name"])}, "spec": spec}))
        except QueueError as e:
            raise QueueFileError(f"{path}: queues[{i}]: {e}") from None
    return out


@dataclass
class TeamQueues:
    """The replay's Hooks for one policy's run (state is per run: build one per replay)."""

    tree: QueueTree
    pods: Sequence[TimedPod]
    nodes: Sequence[Node]
    assignment: Sequence[str] | None = None  # each pod's queue; None: by the hash of its name
    queue: list[str] = field(init=False)
    usage: dict[str, Quota] = field(init=False)
    charge: dict[int, Quota] = field(init=False)
    running_on: dict[int, int] = field(init=False)  # pod index -> node index
    started_at: dict[int, int] = field(init=False)
    served_milli_s: dict[str, int] = field(init=False)
    preemptions: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        names = sorted(n for n in self.tree.specs if self.tree.is_leaf(n))
        self.queue = list(self.assignment) if self.assignment is not None else [
            queue_of(p.request.key, names) for p in self.pods]
        self.usage = {n: Quota() for n in self.tree.specs}
        self.charge, self.running_on, self.started_at = {}, {}, {}
        self.served_milli_s = dict.fromkeys(self.tree.specs, 0)
        self.preemptions = dict.fromkeys(self.tree.specs, 0)
        # Known before the first admission (a share's charge depends on the card it may get).
        self._memory = card_memory(self.nodes)
        self._card_mib = max(self._memory.values(), default=0)

    # --- Hooks -------------------------------------------------------------------------------------------
    def group(self, k: int) -> str:
        return self.queue[k]

    def admit(self, k: int) -> bool:
        charge = charge_of_request(self.pods[k].request.gpu, self._card_mib)
        return isinstance(admit(self.tree, self.usage, self.queue[k], charge), Admitted)

    def started(self, k: int, state: ClusterState, t: int) -> None:
        held = state.held[self.pods[k].request.key]
        charge = charge_of_allocation(held.allocation, self._memory)
        self.charge[k] = charge
        self.usage[self.queue[k]] = self.usage[self.queue[k]] + charge
        self.running_on[k] = held.node_index
        self.started_at[k] = t

    def ended(self, k: int, t: int) -> None:
        charge = self.charge.pop(k)
        q = self.queue[k]
        self.usage[q] = self.usage[q] - charge
        self.running_on.pop(k)
        self.served_milli_s[q] += charge.gpu_milli * (t - self.started_at.pop(k))

    def victims(self, k: int, state: ClusterState, t: int) -> list[int]:
        pod = self.pods[k]
        if pod.request.gpu.count == 0:
            return []
        queue = self.queue[k]
        preemptor = Preemptor(str(k), queue, 0, charge_of_request(pod.request.gpu, self._card_mib))
        if not in_quota(self.tree, self.usage, preemptor):
            return []  # only a pod within its queue's guarantee reclaims (trace pods have no priorities)
        borrowing = {q for q, s in self.tree.specs.items() if s.borrowed(self.usage[q]).gpu_milli > 0}
        if not borrowing:
            return []
        names = [n.name for n in state.nodes]
        running = [Running(str(v), str(v), self.queue[v], names[i], 0, self.charge[v], float(self.started_at[v]))
                   for v, i in self.running_on.items() if self.queue[v] in borrowing]
        index = {name: i for i, name in enumerate(names)}

        def fits(node: str, gone: frozenset[str]) -> bool:
            return fits_without(state, pod.request, index[node], [self.pods[int(v)].request for v in gone])

        plan = plan_preemption(self.tree, self.usage, preemptor, running, fits, float(t))
        if plan is None:
            return []
        for victim in plan.victims:
            self.preemptions[victim.pod.queue] += 1
        return [int(v.pod.uid) for v in plan.victims]

    # --- report ------------------------------------------------------------------------------------------
    def summary(self, start: np.ndarray, created: np.ndarray, end: int, lost_gpu_s: float) -> dict[str, Any]:
        for k in list(self.running_on):  # what still runs at the end counts as served until then
            self.ended(k, end)
        waits = np.where(start >= 0, start - created, np.inf)
        out: dict[str, Any] = {}
        span = max(end - int(created.min()), 1) if len(created) else 1
        for q in sorted(self.served_milli_s):
            mine = np.array([waits[k] for k in range(len(self.pods)) if self.queue[k] == q])
            if not len(mine):
                continue
            ran = mine[np.isfinite(mine)]
            spec = self.tree.specs[q]
            out[q] = {
                "pods": int(len(mine)),
                "wait_p50_s": percentile_of_waits(mine, 50),
                "wait_p99_s": percentile_of_waits(mine, 99),
                "never_ran": int(len(mine) - len(ran)),
                "gpu_hours_served": round(self.served_milli_s[q] / MILLI_PER_GPU / 3600, 1),
                "gpu_hours_guaranteed": round(spec.guaranteed.gpu_milli / MILLI_PER_GPU * span / 3600, 1),
                "preemptions": self.preemptions[q],
            }
        out["_lost_gpu_hours"] = round(lost_gpu_s / 3600, 1)
        return out


class TeamPending:
    """The replay's pending queue in the queues' order (gpupool.core.queue_order: fifo, priority, fair)."""

    def __init__(self, hooks: TeamQueues, how: str) -> None:
        self.hooks, self.how = hooks, how
        self._items: dict[int, TimedPod] = {}

    def push(self, index: int, pod: TimedPod) -> None:
        self._items[index] = pod

    def remove(self, index: int) -> None:
        del self._items[index]

    def order(self) -> list[int]:
        h = self.hooks
        waiting = [Waiting(str(k), h.queue[k], 0, float(p.created)) for k, p in self._items.items()]
        return [int(w.key) for w in order(waiting, self.how, h.tree, h.usage)]

    def __len__(self) -> int:
        return len(self._items)
