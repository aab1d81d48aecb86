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
- One pool: the replay on every node at once; routing by runtime is placement's own rule (core.fit), and
  fragmentation scoring sees vendors only as data.
- Islands: each vendor's nodes replayed apart with its pods, as separate per-vendor clusters would be; an "any"
  pod goes to one island, drawn with the node shares. The combined unallocated % is measured as the replay
  measures one cluster: the GPU capacity left unallocated when the demand that arrived equals the capacity,
  summed over the islands (each island at arrived = 100 % of its own capacity, so the sum is too), over the
  summed capacity.
- Misrouted: pods placed on a card whose vendor does not run their runtime, counted from the final placement
  with the vendors' runtimes (RUNTIME_OF_VENDOR), not with placement's code. Placement's rule keeps it at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupool.core.model import GPU, Node, PodRequest
from gpupool.core.vendors import AMD, ANY_RUNTIME, ASCEND, NVIDIA, RUNTIME_OF_VENDOR, VENDORS, card_model
from gpupool.sim.parallel import Job
from gpupool.sim.replay import ReplayLog, setup

MIX_SEED = 0
ANY = ANY_RUNTIME  # the mix's key for pods that run anywhere
MODEL_OF_VENDOR = {AMD: "MI300X", ASCEND: "Ascend910B"}  # the card a mixed-in node of the vendor gets
MAX_ENTRIES = 8  # a mix names each vendor and "any" at most once; more entries are an error, not parsed

Runner = Callable[[Sequence[Node], Sequence[PodRequest], Sequence[Job]], list[ReplayLog]]


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


def mix_pods(pods: Sequence[PodRequest], mix: VendorMix, seed: int = MIX_SEED) -> list[PodRequest]:
    """Each GPU pod with a runtime drawn from the mix ("any" first with `any_share`, else a vendor's runtime
    with its share); a pod not drawn cuda loses the NVIDIA models it named."""
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
        out.append(replace(pod, gpu=replace(pod.gpu, runtime=runtime, models=models)))
    return out


def islands(nodes: Sequence[Node], pods: Sequence[PodRequest], mix: VendorMix,
            seed: int = MIX_SEED) -> dict[str, tuple[list[Node], list[PodRequest]]]:
    """Each vendor's GPU nodes and the pods of its runtime (a pod that runs anywhere goes to one island drawn
    with the node shares; a pod without GPUs to the island of its position's draw too, so CPU-only load is
    spread alike). Vendors with no node are left out."""
    by_vendor: dict[str, tuple[list[Node], list[PodRequest]]] = {}
    for node in nodes:
        if node.gpus:
            by_vendor.setdefault(node.gpus[0].vendor, ([], []))[0].append(node)
    vendors = [v for v, _ in mix.shares if v in by_vendor]
    weights = np.array([mix.share(v) for v in vendors])
    pick = np.random.default_rng([seed, 2]).choice(len(vendors), size=len(pods), p=weights / weights.sum())
    vendor_of_runtime = {r: v for v, r in RUNTIME_OF_VENDOR.items()}
    for k, pod in enumerate(pods):
        vendor = vendor_of_runtime.get(pod.gpu.runtime or "") if pod.gpu.count else None
        if vendor is None:
            by_vendor[vendors[int(pick[k])]][1].append(pod)
        elif vendor in by_vendor:  # else it runs on no card of the node list, in one pool as in none
            by_vendor[vendor][1].append(pod)
    return by_vendor


def misrouted(nodes: Sequence[Node], submitted: Sequence[PodRequest], log: ReplayLog) -> int:
    """Pods of `submitted` (a replay's pods in order) that the replay placed on at least one card whose vendor
    does not run their runtime."""
    if log.node is None or log.gpus is None:
        raise ValueError("the replay log has no placements (node and GPUs per pod)")
    out = 0
    for k, pod in enumerate(submitted):
        i, bits = int(log.node[k]), int(log.gpus[k])
        runtime = pod.gpu.runtime
        if i < 0 or not pod.gpu.count or runtime is None or runtime == ANY:
            continue
        cards = [g for g in nodes[i].gpus if bits >> g.index & 1]
        if any(RUNTIME_OF_VENDOR.get(g.vendor) != runtime for g in cards):
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
    and mean), each island's own, and the misrouted pods of every replay (summed over seeds and islands)."""
    mixed_nodes, mixed_pods = mix_nodes(nodes, mix, mix_seed), mix_pods(pods, mix, mix_seed)
    jobs = [Job(p, s) for p in policies for s in seeds]
    pool_logs = run(mixed_nodes, mixed_pods, jobs)
    wrong = {job: misrouted(mixed_nodes, setup(mixed_nodes, mixed_pods, job.seed).submitted, log)
             for job, log in zip(jobs, pool_logs, strict=True)}
    parts = islands(mixed_nodes, mixed_pods, mix, mix_seed)
    island_logs: dict[str, list[ReplayLog]] = {}
    for vendor, (vendor_nodes, vendor_pods) in parts.items():
        island_logs[vendor] = run(vendor_nodes, vendor_pods, jobs) if vendor_pods else []
        for job, log in zip(jobs, island_logs[vendor], strict=True):
            wrong[job] += misrouted(vendor_nodes, setup(vendor_nodes, vendor_pods, job.seed).submitted, log)
    out: dict[str, Any] = {
        "mix": mix.text(),
        "mix_seed": mix_seed,
        "vendors": {v: {"nodes": len(n), "gpus": sum(len(x.gpus) for x in n), "pods": len(p),
                        "models": sorted({g.model for x in n for g in x.gpus})} for v, (n, p) in parts.items()},
        "pods": len(mixed_pods),
        "policies": {},
    }
    for policy in policies:
        at = [k for k, job in enumerate(jobs) if job.policy == policy]
        one = [unallocated_pct([pool_logs[k]]) for k in at]
        apart = [unallocated_pct([island_logs[v][k] for v in island_logs if island_logs[v]]) for k in at]
        per_island = {v: round(float(np.mean([unallocated_pct([logs[k]]) for k in at])), 4)
                      for v, logs in island_logs.items() if logs}
        out["policies"][policy] = {
            "unallocated_pct_one_pool": round(float(np.mean(one)), 4),
            "unallocated_pct_islands": round(float(np.mean(apart)), 4),
            "one_pool_per_seed": [round(x, 4) for x in one],
            "islands_per_seed": [round(x, 4) for x in apart],
            "unallocated_pct_per_island": per_island,
            "misrouted": sum(wrong[jobs[k]] for k in at),
            "failed_pods_one_pool_mean": round(float(np.mean([pool_logs[k].failed for k in at])), 1),
        }
    return out
