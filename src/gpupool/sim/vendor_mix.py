"""A vendor mix for the static replay: one pool of NVIDIA, AMD and Ascend cards against per-vendor islands.

`--vendor-mix amd=0.3,ascend=0.1` (gpupool simulate) turns that share of the node list's GPU nodes into AMD /
Ascend nodes and gives each GPU pod a runtime drawn with the same shares (NVIDIA: the rest). `any=0.2` also
makes that share of the GPU pods images that run anywhere (runtime "any"). All draws are seeded (MIX_SEED
unless told otherwise), so every policy and replay seed sees the same cluster and the same pods.

- Nodes: a seeded choice of round(share x GPU nodes) nodes per vendor (largest remainders, so that the counts
  add up to the node list) keep their CPU, memory and number of GPUs; their cards become the vendor's model in
  the catalogue (gpupool.core.vendors: MODEL_OF_VENDOR), with its memory and compute units.
- Pods: a GPU pod's runtime is drawn per pod; a pod of another runtime than cuda loses the NVIDIA models the
  trace or --constrain-models named (they are NVIDIA cards it could never use). Pods without GPUs run anywhere.
  Every GPU pod is held in the cluster's default isolation, hook (SIM_ISOLATION): its share may only go to a card
  whose vendor holds hook shares (NVIDIA, AMD: core.fit's rule, core.vendors.ISOLATION_OF_VENDOR). A pod drawn a
  runtime whose cards hold no share at all (cann: Ascend) that asks a share of a card asks for the whole card
  instead, as the webhook's refusal tells such a pod to (vNPUs are not replayed).
- One pool: the replay on every node at once; routing by runtime is placement's own rule (core.fit), and
  fragmentation scoring sees vendors only as data.
- Islands: the same pods in the same order as the one-pool replay of that seed (its shuffle and top-up to
  130 % of the whole capacity), each sent to its vendor's cluster, placed there by the same policy apart from
  the others (its own fit, typical workload for scoring, and the one pool's tie-break ranks of its nodes), as
  separate per-vendor pools would place them; a pod that runs anywhere, or has no GPU, goes to one island
  drawn with the node shares (a share among the islands whose cards hold it). The combined unallocated % is
  measured exactly as the replay measures one
  cluster: allocated GPU over all islands at the pod where the arrived demand reaches 100 % of the summed
  capacity (ReplayLog.allocated_at).
- Misrouted: pods placed on a card whose vendor does not run their runtime, or a share of a card whose vendor does
  not hold its isolation mode (hook when the pod says none, the simulator's shares being hook shares), counted
  from the final placement with the vendors' runtimes and modes (RUNTIME_OF_VENDOR, ISOLATION_OF_VENDOR), not with
  placement's code. Placement's rules keep it at 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupool.core.frag import typical_workload
from gpupool.core.model import GPU, MILLI_PER_GPU, Node, PodRequest
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.core.vendors import (
    AMD,
    ANY_RUNTIME,
    ASCEND,
    ISOLATION_HOOK,
    NVIDIA,
    RUNTIME_OF_VENDOR,
    SHARE_MODES,
    VENDORS,
    card_model,
    holds,
)
from gpupool.sim.engine import Placer
from gpupool.sim.parallel import Job
from gpupool.sim.replay import TUNE, ReplayLog, replay, setup

MIX_SEED = 0
ANY = ANY_RUNTIME  # the mix's key for pods that run anywhere
MODEL_OF_VENDOR = {AMD: "MI300X", ASCEND: "Ascend910B"}  # the card a mixed-in node of the vendor gets
MAX_ENTRIES = 8  # a mix names each vendor and "any" at most once; more entries are an error, not parsed
SIM_ISOLATION = ISOLATION_HOOK  # the isolation of every replayed GPU pod: the cluster's default (api.names)

# run(fn, nodes, pods, jobs, **options): fn(nodes, pods, job.policy, job.seed, progress=..., **options) per job
# (gpupool.sim.parallel.run_all's contract, so that the caller chooses processes and progress bars).
Runner = Callable[..., list[ReplayLog]]


class VendorMixError(ValueError):
    """A vendor mix that cannot be used; the message names the entry at fault."""


@dataclass(frozen=True, slots=True)
class VendorMix:
    """Shares of GPU nodes (and of GPU pods' runtimes) per vendor, NVIDIA being the rest; `any_share`: the
    share of GPU pods that run anywhere."""

    shares: tuple[tuple[str, float], ...]  # (vendor, share) for every vendor in VENDORS order, summing to 1
    any_share: float = 0.0

    def share(self, vendor: str) -> float:
        return dict(self.shares).get(vendor, 0.0)

    def text(self) -> str:
        parts = [f"{v}={s:g}" for v, s in self.shares if s]
        return ",".join(parts + ([f"{ANY}={self.any_share:g}"] if self.any_share else []))


def parse_mix(text: str) -> VendorMix:
    """`amd=0.3,ascend=0.1[,nvidia=0.6][,any=0.2]`: fractions from 0 to 1; the vendors' shares add up to at
    most 1, NVIDIA taking the rest (when it is named too, they must add up to 1)."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise VendorMixError("empty; expected vendor=fraction entries such as amd=0.3,ascend=0.1")
    if len(entries) > MAX_ENTRIES:
        raise VendorMixError(f"{len(entries)} entries; a mix names each of {', '.join((*VENDORS, ANY))} at most once")
    given: dict[str, float] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        name = name.strip().lower()
        shown = entry if len(entry) <= 40 else entry[:37] + "..."
        if not sep:
            raise VendorMixError(f"entry {shown!r}: expected vendor=fraction, such as amd=0.3")
        if name not in (*VENDORS, ANY):
            raise VendorMixError(f"entry {shown!r}: unknown vendor {name[:20]!r} (use {', '.join((*VENDORS, ANY))})")
        if name in given:
            raise VendorMixError(f"entry {shown!r}: {name} is given twice")
        try:
            share = float(value) if len(value) <= 32 else math.nan
        except ValueError:
            share = math.nan
        if not 0.0 <= share <= 1.0:  # false for nan
            raise VendorMixError(f"entry {shown!r}: {value.strip()[:32]!r} is not a fraction from 0 to 1")
        given[name] = share
    others = sum(s for v, s in given.items() if v not in (NVIDIA, ANY))
    if others > 1.0 + 1e-9:
        raise VendorMixError(f"the vendors' shares add up to {others:g}, more than 1")
    if NVIDIA in given and abs(others + given[NVIDIA] - 1.0) > 1e-9:
        raise VendorMixError(f"the vendors' shares add up to {others + given[NVIDIA]:g}; with nvidia named they "
                             "must add up to 1 (leave nvidia out to give it the rest)")
    shares = {v: given.get(v, 0.0) for v in VENDORS if v != NVIDIA}
    shares[NVIDIA] = max(0.0, 1.0 - sum(shares.values()))
    return VendorMix(tuple((v, shares[v]) for v in VENDORS), given.get(ANY, 0.0))


def node_counts(mix: VendorMix, gpu_nodes: int) -> dict[str, int]:
    """How many of `gpu_nodes` nodes each vendor gets: share x nodes rounded by largest remainder (ties to
    the vendors' order), so that the counts add up. VendorMixError when a vendor with a share gets none."""
    exact = {v: s * gpu_nodes for v, s in mix.shares}
    counts = {v: math.floor(x) for v, x in exact.items()}
    left = gpu_nodes - sum(counts.values())
    for v in sorted(exact, key=lambda v: (-(exact[v] - counts[v]), VENDORS.index(v)))[:left]:
        counts[v] += 1
    for v, s in mix.shares:
        if s > 0 and counts[v] == 0:
            raise VendorMixError(f"{v}={s:g} of {gpu_nodes} GPU nodes gives {v} no node; give it a larger share")
    return counts


def vendor_card(vendor: str, uuid: str, index: int) -> GPU:
    """A card of the model the mix gives `vendor`'s nodes, with the catalogue's memory and compute units."""
    row = card_model(MODEL_OF_VENDOR[vendor])
    if row is None:  # the catalogue lost a model this module names: a programming error, not input
        raise RuntimeError(f"no catalogue row for {MODEL_OF_VENDOR[vendor]}")
    return GPU(uuid=uuid, index=index, model=row.name, memory_mib=row.memory_mib, sm_count=row.compute_units,
               vendor=vendor)


def mix_nodes(nodes: Sequence[Node], mix: VendorMix, seed: int = MIX_SEED) -> list[Node]:
    """The node list with a seeded choice of its GPU nodes turned into each vendor's nodes (same order, names,
    CPU, memory and number of GPUs)."""
    with_gpus = [i for i, n in enumerate(nodes) if n.gpus]
    counts = node_counts(mix, len(with_gpus))
    order = np.random.default_rng([seed, 0]).permutation(len(with_gpus))
    vendor_at: dict[int, str] = {}
    start = 0
    for vendor in VENDORS:
        for k in order[start:start + counts[vendor]]:
            vendor_at[with_gpus[int(k)]] = vendor
        start += counts[vendor]
    out = list(nodes)
    for i, vendor in vendor_at.items():
        if vendor != NVIDIA:
            node = nodes[i]
            out[i] = replace(node, gpus=tuple(vendor_card(vendor, g.uuid, g.index) for g in node.gpus))
    return out


def _unshared(runtime: str) -> bool:
    """Whether the cards that run `runtime` hold no share in any mode (cann: Ascend); never for "any"."""
    vendors = [v for v, r in RUNTIME_OF_VENDOR.items() if r == runtime]
    return bool(vendors) and not any(holds(v, m) for v in vendors for m in SHARE_MODES)


def mix_pods(pods: Sequence[PodRequest], mix: VendorMix, seed: int = MIX_SEED) -> list[PodRequest]:
    """Each GPU pod with a runtime drawn from the mix ("any" first with `any_share`, else a vendor's runtime
    with its share) and the isolation SIM_ISOLATION; a pod not drawn cuda loses the NVIDIA models it named; a
    share drawn a runtime whose cards hold no share (cann) becomes a whole card (the module's text says why)."""
    rng = np.random.default_rng([seed, 1])
    runtimes = [RUNTIME_OF_VENDOR[v] for v, _ in mix.shares]
    weights = np.array([s for _, s in mix.shares])
    anywhere = rng.random(len(pods)) < mix.any_share
    drawn = rng.choice(len(runtimes), size=len(pods), p=weights / weights.sum())
    out = []
    for k, pod in enumerate(pods):
        if not pod.gpu.count:
            out.append(pod)
            continue
        runtime = ANY if anywhere[k] else runtimes[int(drawn[k])]
        models = pod.gpu.models if runtime == RUNTIME_OF_VENDOR[NVIDIA] else frozenset()
        gpu = replace(pod.gpu, runtime=runtime, models=models, isolation=SIM_ISOLATION)
        if not gpu.whole and _unshared(runtime):
            gpu = replace(gpu, milli=MILLI_PER_GPU, memory_mib=None)
        out.append(replace(pod, gpu=gpu))
    return out


def vendor_nodes(nodes: Sequence[Node]) -> dict[str, list[int]]:
    """Indices of each vendor's GPU nodes (a node's vendor: its first card's), vendors in VENDORS order."""
    out: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if node.gpus:
            out.setdefault(node.gpus[0].vendor, []).append(i)
    return {v: out[v] for v in (*VENDORS, *sorted(set(out) - set(VENDORS))) if v in out}


def island_of(pods: Sequence[PodRequest], vendors: Sequence[str], mix: VendorMix, seed: int) -> list[str | None]:
    """The island (vendor) of each pod: its runtime's vendor; a pod that runs anywhere, or has no GPU, one drawn
    with the node shares (a share that runs anywhere: among the islands whose cards hold its mode); None for a
    pod whose runtime no island's cards run, or a share no island's cards hold (it fits nowhere in one pool
    either)."""
    weights = np.array([mix.share(v) for v in vendors])
    pick = np.random.default_rng([seed, 2]).choice(len(vendors), size=len(pods), p=weights / weights.sum())
    # A share that runs anywhere is drawn among the islands whose cards hold its mode, from a stream of its own
    # so that every other pod's draw is the same as without the rule.
    share_rng = np.random.default_rng([seed, 3])
    vendor_of_runtime = {r: v for v, r in RUNTIME_OF_VENDOR.items()}
    out: list[str | None] = []
    for k, pod in enumerate(pods):
        vendor = vendor_of_runtime.get(pod.gpu.runtime or "") if pod.gpu.count else None
        mode = pod.gpu.share_mode if pod.gpu.count else None
        if vendor is None and mode is not None:
            held = np.array([mix.share(v) if holds(v, mode) else 0.0 for v in vendors])
            out.append(vendors[int(share_rng.choice(len(vendors), p=held / held.sum()))] if held.sum() > 0 else None)
            continue
        out.append(vendors[int(pick[k])] if vendor is None else vendor if vendor in vendors else None)
    return out


def replay_islands(nodes: Sequence[Node], pods: Sequence[PodRequest], policy_name: str, seed: int,
                   progress: Callable[[int, int], None] | None = None, mix: VendorMix | None = None,
                   mix_seed: int = MIX_SEED, tune: float = TUNE) -> ReplayLog:
    """The islands' replay of one seed (module doc): the one-pool replay's pods in its order, each placed in its
    vendor's cluster alone. The log is over the whole node list (node indices and capacity), so that it is
    measured as one replay's; `mix` draws the island of pods that run anywhere."""
    if mix is None:
        raise ValueError("replay_islands needs the vendor mix")
    start = time.perf_counter()
    run = setup(nodes, pods, seed, tune)  # the one pool's draws: its pods, order and node ranks
    groups = vendor_nodes(nodes)
    where = island_of(run.submitted, list(groups), mix, mix_seed)
    placers: dict[str, tuple[Placer, list[int]]] = {}
    for vendor, members in groups.items():
        state = ClusterState([nodes[i] for i in members])
        own = [p for p, v in zip(run.submitted, where, strict=True) if v == vendor]
        rank = run.ctx.rank[members] if run.ctx.rank is not None else None
        ctx = PolicyContext(rng=np.random.default_rng(seed + 1), workload=typical_workload(own), rank=rank)
        placers[vendor] = (Placer(state, get_policy(policy_name), ctx), members)
    n = len(run.submitted)
    allocated, arrived = np.zeros(n), np.zeros(n)
    placed_node, placed_gpus = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    allocated_total = arrived_total = failed = 0
    for k, pod in enumerate(run.submitted):
        arrived_total += pod.gpu.total_milli
        island = where[k]
        choice = placers[island][0].decide(pod) if island is not None else None
        if island is not None and choice is not None:
            placer, members = placers[island]
            allocated_total += placer.take(pod, choice)
            placed_node[k] = members[choice.node]
            placed_gpus[k] = sum(1 << j for j in choice.gpus)
        else:
            failed += 1
        allocated[k], arrived[k] = allocated_total, arrived_total
        if progress is not None:
            progress(k + 1, n)
    capacity = sum(len(node.gpus) for node in nodes) * MILLI_PER_GPU
    return ReplayLog(allocated, arrived, np.zeros(n), capacity, failed, time.perf_counter() - start,
                     placed_node, placed_gpus)


def misrouted(nodes: Sequence[Node], submitted: Sequence[PodRequest], log: ReplayLog) -> int:
    """Pods of `submitted` (a replay's pods in order) that the replay placed on at least one card whose vendor
    does not run their runtime, or, for a share, does not hold its isolation mode (hook when none is said)."""
    if log.node is None or log.gpus is None:
        raise ValueError("the replay log has no placements (node and GPUs per pod)")
    out = 0
    for k, pod in enumerate(submitted):
        i, bits = int(log.node[k]), int(log.gpus[k])
        if i < 0 or not pod.gpu.count:
            continue
        runtime = pod.gpu.runtime
        mode = None if pod.gpu.whole else pod.gpu.isolation or SIM_ISOLATION
        cards = [g for g in nodes[i].gpus if bits >> g.index & 1]
        wrong_runtime = runtime not in (None, ANY) and any(RUNTIME_OF_VENDOR.get(g.vendor) != runtime for g in cards)
        unheld = mode in SHARE_MODES and any(not holds(g.vendor, mode) for g in cards)
        if wrong_runtime or unheld:
            out += 1
    return out


def unallocated_pct(logs: Sequence[ReplayLog]) -> float:
    """GPU capacity left unallocated at arrived demand = 100 % of capacity, over one or several clusters
    replayed apart (islands): the allocated milli-GPU at that point summed over them, against their summed
    capacity. For one log, what `gpupool simulate` reports."""
    capacity = sum(log.capacity_milli for log in logs)
    allocated = sum(log.allocated_at(100) / 100.0 * log.capacity_milli for log in logs)
    return 100.0 - 100.0 * allocated / capacity if capacity else 0.0


def compare(nodes: Sequence[Node], pods: Sequence[PodRequest], mix: VendorMix, policies: Sequence[str],
            seeds: Sequence[int], run: Runner, mix_seed: int = MIX_SEED) -> dict[str, Any]:
    """One pool against islands for each policy over `seeds`: per policy the unallocated % of each (per seed
    and mean), each island's own at the same point, and the misrouted pods of every replay (summed over
    seeds, one pool and islands)."""
    mixed_nodes, mixed_pods = mix_nodes(nodes, mix, mix_seed), mix_pods(pods, mix, mix_seed)
    jobs = [Job(p, s) for p in policies for s in seeds]
    pool_logs = run(replay, mixed_nodes, mixed_pods, jobs)
    island_logs = run(replay_islands, mixed_nodes, mixed_pods, jobs, mix=mix, mix_seed=mix_seed)
    groups = vendor_nodes(mixed_nodes)
    submitted = {seed: setup(mixed_nodes, mixed_pods, seed).submitted for seed in seeds}
    where = {seed: island_of(submitted[seed], list(groups), mix, mix_seed) for seed in seeds}
    out: dict[str, Any] = {
        "mix": mix.text(),
        "mix_seed": mix_seed,
        "vendors": {v: {"nodes": len(members), "gpus": sum(len(mixed_nodes[i].gpus) for i in members),
                        "pods": sum(1 for p in mixed_pods if p.gpu.count and _vendor_of(p) == v),
                        "models": sorted({g.model for i in members for g in mixed_nodes[i].gpus})}
                    for v, members in groups.items()},
        "pods": len(mixed_pods),
        "policies": {},
    }
    for policy in policies:
        at = [k for k, job in enumerate(jobs) if job.policy == policy]
        one = [unallocated_pct([pool_logs[k]]) for k in at]
        apart = [unallocated_pct([island_logs[k]]) for k in at]
        per_island = {v: round(float(np.mean([_island_pct(island_logs[k], where[jobs[k].seed], submitted[jobs[k].seed],
                                                          v, mixed_nodes, members) for k in at])), 4)
                      for v, members in groups.items()}
        wrong = sum(misrouted(mixed_nodes, submitted[jobs[k].seed], pool_logs[k])
                    + misrouted(mixed_nodes, submitted[jobs[k].seed], island_logs[k]) for k in at)
        out["policies"][policy] = {
            "unallocated_pct_one_pool": round(float(np.mean(one)), 4),
            "unallocated_pct_islands": round(float(np.mean(apart)), 4),
            "one_pool_per_seed": [round(x, 4) for x in one],
            "islands_per_seed": [round(x, 4) for x in apart],
            "unallocated_pct_per_island": per_island,
            "misrouted": wrong,
            "failed_pods_one_pool_mean": round(float(np.mean([pool_logs[k].failed for k in at])), 1),
            "failed_pods_islands_mean": round(float(np.mean([island_logs[k].failed for k in at])), 1),
        }
    return out


def _vendor_of(pod: PodRequest) -> str | None:
    return {r: v for v, r in RUNTIME_OF_VENDOR.items()}.get(pod.gpu.runtime or "")


def _island_pct(log: ReplayLog, where: Sequence[str | None], submitted: Sequence[PodRequest], vendor: str,
                nodes: Sequence[Node], members: Sequence[int]) -> float:
    """One island's unallocated % of its own capacity at the pod where the whole arrived demand reaches 100 %
    of the whole capacity (the point the combined figure is read at)."""
    capacity = sum(len(nodes[i].gpus) for i in members) * MILLI_PER_GPU
    x = np.round(100.0 * log.arrived / log.capacity_milli).astype(np.int64)
    upto = np.flatnonzero(x <= 100)
    last = int(upto[-1]) if len(upto) else -1
    held = sum(p.gpu.total_milli for k, p in enumerate(submitted[:last + 1])
               if where[k] == vendor and log.node[k] >= 0) if log.node is not None else 0
    return 100.0 - 100.0 * held / capacity if capacity else 0.0
