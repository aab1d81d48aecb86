"""What-if planning: what a workload would cost if every GPU were one model, per isolation.

Isolations compared:
- `whole`: every GPU pod takes whole GPUs (a 30 % pod strands the other 70 %);
- `mig`: a share pod gets the smallest MIG profile whose compute slices cover its share (the trace asks
  for compute only), placed by gpupool.core.mig_placement (or first-fit start slots, for comparison);
  a whole-GPU pod takes whole GPUs;
- `hook`: shares packed by their exact compute share (best fit), as gpupool's interception allows.

Two figures per isolation:
- unallocated GPU % when the arrived demand reaches 100 % of the cluster: pods (in a seeded shuffle,
  cycled if the trace is shorter than the cluster) arrive until the next one would take the arrived
  compute past the cluster's capacity; a pod that fits nowhere is dropped; unallocated = compute no
  placed pod asked for;
- GPUs needed: every pod of the trace once, on a pool that opens a new GPU when nothing fits.

Only GPUs count: CPU and host memory are ignored, and a multi-GPU pod needs that many empty GPUs on one
node of the given cluster (on one fresh node when counting GPUs needed).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.mig import MigModel, mig_model
from gpupool.core.mig_placement import Demand, MigChoice, MigGPU, MigInstance, choose, observed_demand
from gpupool.core.mig_request import ProfileRefusal, smallest_profile
from gpupool.core.model import MILLI_PER_GPU, PodRequest

ISOLATIONS = ("whole", "mig", "hook")
_WHOLE = -1  # in a Held pair: the pod holds the whole GPU
Held = tuple[tuple[int, int], ...]  # (GPU, milli given back or instance start slot) per GPU a pod holds


@dataclass(frozen=True, slots=True)
class WhatIfRow:
    isolation: str
    unallocated_pct: float  # at arrived demand = 100 % of the cluster's GPU compute
    gpus_needed: int  # to host every pod of the trace once
    placed: int  # pods placed until arrived demand reached 100 %
    dropped: int  # pods that fit nowhere until then
    churn_unallocated_pct: float | None = None  # mean unallocated % under churn (None: not asked)


def _milli(pod: PodRequest) -> int:
    return pod.gpu.milli if pod.gpu.count == 1 else MILLI_PER_GPU


class _Pool:
    """GPUs grouped by state, so a pod is scored once per distinct state, not once per GPU.

    A state is what decides fit: for `whole` 0 (empty) or 1, for `hook` the free milli-GPU, for `mig`
    the tuple of instances. Each state keeps a heap of its GPU indices (stale entries skipped)."""

    def __init__(self, isolation: str, model: MigModel, demand: Demand, first_fit: bool,
                 node_sizes: Sequence[int], unbounded: bool, highest_start: bool = False) -> None:
        self.isolation, self.model, self.demand, self.first_fit = isolation, model, demand, first_fit
        self.highest_start = highest_start
        self.unbounded = unbounded
        self.empty: Hashable = {"whole": 0, "hook": MILLI_PER_GPU, "mig": ()}[isolation]
        self.state: list[Hashable] = []
        self.node_of: list[int] = []
        self.node_gpus: list[list[int]] = []
        self.empty_on: list[int] = []  # empty GPUs per node
        self.classes: dict[Hashable, list[int]] = {}
        for size in node_sizes:
            self._add_node(size)

    def _add_node(self, size: int) -> int:
        node = len(self.node_gpus)
        ids = list(range(len(self.state), len(self.state) + size))
        self.node_gpus.append(ids)
        self.empty_on.append(size)
        for g in ids:
            self.state.append(self.empty)
            self.node_of.append(node)
            heapq.heappush(self.classes.setdefault(self.empty, []), g)
        return node

    @property
    def gpus(self) -> int:
        return len(self.state)

    def _first(self, key: Hashable) -> int | None:
        heap = self.classes.get(key)
        while heap and self.state[heap[0]] != key:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _move(self, gpu: int, key: Hashable) -> None:
        if self.state[gpu] == self.empty:
            self.empty_on[self.node_of[gpu]] -= 1
        if key == self.empty:
            self.empty_on[self.node_of[gpu]] += 1
        self.state[gpu] = key
        heapq.heappush(self.classes.setdefault(key, []), gpu)

    def place(self, pod: PodRequest, profile: str | None) -> Held | None:
        """Place the pod; what it holds (to release it later), or None when it fits nowhere."""
        count, milli = pod.gpu.count, _milli(pod)
        if count > 1 or milli >= MILLI_PER_GPU or self.isolation == "whole":
            return self._place_whole(count)
        if self.isolation == "hook":
            return self._place_hook(milli)
        return self._place_mig(profile) if profile is not None else None

    def release(self, held: Held) -> None:
        for gpu, what in held:
            key = self.state[gpu]
            if what == _WHOLE:
                self._move(gpu, self.empty)
            elif isinstance(key, int):  # hook: `what` is the milli-GPU given back
                self._move(gpu, key + what)
            else:  # mig: `what` is the start slot of the pod's instance, destroyed with it
                self._move(gpu, MigGPU(self.model.name, key).without_instance(what).instances)  # type: ignore[arg-type]

    def _place_whole(self, count: int) -> Held | None:
        """`count` empty GPUs on one node: the lowest-numbered empty GPU for one, else the first node
        with enough empty GPUs."""
        if count == 1:
            first = self._first(self.empty)
            free = [first] if first is not None else []
        else:
            node = next((n for n in range(len(self.node_gpus)) if self.empty_on[n] >= count), None)
            free = [g for g in self.node_gpus[node] if self.state[g] == self.empty] if node is not None else []
        if not free:
            if not self.unbounded:
                return None
            free = self.node_gpus[self._add_node(count)]
        full = {"whole": 1, "hook": 0, "mig": (MigInstance(self._full_profile(), 0, True),)}[self.isolation]
        for g in free[:count]:
            self._move(g, full)
        return tuple((g, _WHOLE) for g in free[:count])

    def _full_profile(self) -> str:
        return max(self.model.profiles, key=lambda p: (p.memory_slices, p.compute_slices)).name

    def _place_hook(self, milli: int) -> Held | None:
        fits = [k for k in self.classes if isinstance(k, int) and k >= milli and self._first(k) is not None]
        if not fits:
            if not self.unbounded:
                return None
            self._add_node(1)
            fits = [MILLI_PER_GPU]
        key = min(fits)  # best fit: the fullest GPU that still takes the share
        gpu = self._first(key)
        assert gpu is not None and isinstance(key, int)
        self._move(gpu, key - milli)
        return ((gpu, milli),)

    def _place_mig(self, profile: str) -> Held | None:
        keys = [(g, k) for k in self.classes if isinstance(k, tuple) and (g := self._first(k)) is not None]
        if self.unbounded and self._first(()) is None:
            keys.append((self.gpus, ()))  # a fresh GPU stands by
        keys.sort()
        reps = [MigGPU(self.model.name, k) for _, k in keys]
        choice = choose(reps, profile, self.demand, self.first_fit, self.highest_start)
        if not isinstance(choice, MigChoice):
            return None
        gpu, _ = keys[choice.gpu]
        if gpu == self.gpus:
            self._add_node(1)
        after = reps[choice.gpu].with_instance(choice.option.profile, choice.option.start)
        self._move(gpu, after.instances)
        return ((gpu, choice.option.start),)


def _profiles(pods: Sequence[PodRequest], model: MigModel) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pod in pods:
        if pod.gpu.count == 1 and pod.gpu.milli < MILLI_PER_GPU:
            p = smallest_profile(model, cores_percent=pod.gpu.milli / 10)
            out[pod.key] = None if isinstance(p, ProfileRefusal) else p.name
    return out


def arrivals(pods: Sequence[PodRequest], seed: int) -> Iterator[PodRequest]:
    """GPU pods in a seeded shuffle, reshuffled each time the list is used up (endless)."""
    gpu_pods = sorted((p for p in pods if p.gpu.count > 0), key=lambda p: p.key)
    rng = np.random.default_rng(seed)
    while gpu_pods:
        for i in rng.permutation(len(gpu_pods)):
            yield gpu_pods[int(i)]


def _demand(pod: PodRequest) -> int:
    return pod.gpu.count * _milli(pod)


def what_if(node_gpu_counts: Sequence[int], pods: Sequence[PodRequest], gpu_model: str,
            isolations: Sequence[str] = ISOLATIONS, seed: int = 42, mig_first_fit: bool = False,
            churn: int = 0, mig_highest_start: bool = False) -> list[WhatIfRow]:
    """Per isolation, unallocated GPU % at 100 % arrival on a cluster with nodes of the given GPU counts
    (every GPU being `gpu_model`), and the GPUs the trace needs.

    With `churn` > 0 the replay goes on after 100 % arrival: `churn` times, a random running pod ends
    (its MIG instance is destroyed with it) and the next pod arrives; `churn_unallocated_pct` is the mean
    unallocated % over those steps (a steady state in which layouts fragment as they do in a real
    cluster). Raises ValueError for an unknown model or isolation, or a cluster without GPUs."""
    model = mig_model(gpu_model)
    if model is None:
        raise ValueError(f"unknown GPU model {gpu_model!r}")
    bad = [i for i in isolations if i not in ISOLATIONS]
    if bad:
        raise ValueError(f"unknown isolation {', '.join(bad)} (use {', '.join(ISOLATIONS)})")
    capacity = sum(node_gpu_counts) * MILLI_PER_GPU
    if capacity == 0:
        raise ValueError("the cluster has no GPUs")
    profiles = _profiles(pods, model)
    whole = max(model.profiles, key=lambda p: p.memory_slices).name
    demand = observed_demand((profiles.get(p.key) or whole) for p in pods for _ in range(p.gpu.count))
    rows = []
    for iso in isolations:
        pool = _Pool(iso, model, demand, mig_first_fit, node_gpu_counts, unbounded=False,
                     highest_start=mig_highest_start)
        stream = arrivals(pods, seed)
        running: list[tuple[PodRequest, Held]] = []
        placed = dropped = allocated = arrived = 0
        for pod in stream:
            if arrived + _demand(pod) > capacity:
                break
            arrived += _demand(pod)
            held = pool.place(pod, profiles.get(pod.key))
            if held is None:
                dropped += 1
                continue
            placed += 1
            allocated += _demand(pod)
            running.append((pod, held))
        at_100 = 100.0 * (capacity - allocated) / capacity
        churned: float | None = None
        if churn and running:
            rng = np.random.default_rng(seed + 1)
            live, total = allocated, 0.0
            for _ in range(churn):
                k = int(rng.integers(len(running)))
                gone, held = running[k]
                running[k] = running[-1]
                running.pop()
                pool.release(held)
                live -= _demand(gone)
                pod = next(stream)
                got = pool.place(pod, profiles.get(pod.key))
                if got is not None:
                    running.append((pod, got))
                    live += _demand(pod)
                total += 100.0 * (capacity - live) / capacity
                if not running:
                    break
            churned = total / churn
        need = _Pool(iso, model, demand, mig_first_fit, (), unbounded=True, highest_start=mig_highest_start)
        for pod in sorted((p for p in pods if p.gpu.count > 0), key=lambda p: p.key):
            need.place(pod, profiles.get(pod.key))
        rows.append(WhatIfRow(iso, at_100, need.gpus, placed, dropped, churned))
    return rows
