"""Aggregating replays over seeds into the `results.json` document and the allocation plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.sim.replay import ReplayLog


def summarise(logs: Sequence[ReplayLog]) -> dict[str, Any]:
    """Mean over seeds of one policy's replays, in the fixed results.json shape."""
    at100 = [100.0 - log.allocated_at(100) for log in logs]
    at130 = [100.0 - log.allocated_at(130) for log in logs]
    buckets: dict[int, list[float]] = {}
    for log in logs:
        for x, y in log.curve():
            buckets.setdefault(x, []).append(y)
    curve = [[x, round(float(np.mean(ys)), 4)] for x, ys in sorted(buckets.items())]
    return {
        "unallocated_pct_at_100": round(float(np.mean(at100)), 4),
        "std_pct_at_100": round(float(np.std(at100)), 4),
        "unallocated_pct_at_130": round(float(np.mean(at130)), 4),
        "curve": curve,
        "seconds_per_seed": round(float(np.mean([log.seconds for log in logs])), 3),
        "failed_pods_mean": round(float(np.mean([log.failed for log in logs])), 1),
        "fragmented_pct_at_100": round(float(np.nanmean([log.frag_pct_at(100) for log in logs])), 4),
    }


def summarise_moves(logs: Sequence[ReplayLog], max_moves: int, cost_per_gib: float, movable: float) -> dict[str, Any]:
    """The `moves` section of a policy in results.json: its replays with moves allowed, mean over seeds."""
    at100 = [100.0 - log.allocated_at(100) for log in logs]
    until100 = [log.moves_until(100) for log in logs]
    until130 = [log.moves_until(130) for log in logs]
    return {
        "max_moves": max_moves,
        "cost_per_gib": cost_per_gib,
        "movable": f"{movable:g} of the placed one-GPU shares below a whole GPU (seeded by a hash of seed and key)",
        "unallocated_pct_at_100": round(float(np.mean(at100)), 4),
        "std_pct_at_100": round(float(np.std(at100)), 4),
        "unallocated_pct_at_130": round(float(np.mean([100.0 - log.allocated_at(130) for log in logs])), 4),
        "moves_at_100": round(float(np.mean([m for m, _ in until100])), 2),
        "moved_gib_at_100": round(float(np.mean([g for _, g in until100])), 2),
        "moves_at_130": round(float(np.mean([m for m, _ in until130])), 2),
        "moved_gib_at_130": round(float(np.mean([g for _, g in until130])), 2),
        "cost_mean": round(float(np.mean([log.move_cost for log in logs])), 2),
        "seconds_per_seed": round(float(np.mean([log.seconds for log in logs])), 3),
        "failed_pods_mean": round(float(np.mean([log.failed for log in logs])), 1),
    }


def write_results(out: Path, trace: str, seeds: Sequence[int], policies: dict[str, dict[str, Any]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps({"trace": trace, "seeds": list(seeds), "policies": policies}, indent=1))
    return path


def plot(out: Path, trace: str, policies: dict[str, dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers or CI
    import matplotlib.pyplot as plt

    fig, (full, zoom) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, res in policies.items():
        xs = [x for x, _ in res["curve"]]
        ys = [y for _, y in res["curve"]]
        label = f"{name} ({res['unallocated_pct_at_100']:.2f}% unallocated at 100%)"
        full.plot(xs, ys, label=label)
        zoom.plot(xs, ys, label=name)
    for ax in (full, zoom):
        ax.plot([0, 100, 130], [0, 100, 100], color="grey", linestyle=":", label="ideal" if ax is full else None)
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel("GPU allocated (% of capacity)")
        ax.grid(alpha=0.3)
    zoom.set_xlim(80, 130)
    zoom.set_ylim(80, 100)
    full.set_title(f"Allocation vs arrived demand — trace {trace}")
    zoom.set_title("zoom")
    full.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "allocation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
