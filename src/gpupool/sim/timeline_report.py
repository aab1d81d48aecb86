"""Figures of a timeline replay: waits, pods that never ran, GPU allocation and fragmentation over time
(time-weighted over the trace's span, from the first creation to the end), and the timeline plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpupool.core.model import MILLI_PER_GPU
from gpupool.sim.timeline import TimelineLog


def percentile_of_waits(waits: np.ndarray, q: float) -> float:
    """The q-th percentile of waits, a pod that never ran counted as waiting forever (inf), so a cluster
    cannot meet a wait target by never running pods. No interpolation: a real wait. 0 for no pods."""
    if len(waits) == 0:
        return 0.0
    return float(np.percentile(waits, q, method="inverted_cdf"))


def wait_percentile(log: TimelineLog, q: float) -> float:
    """The q-th percentile of waits over every pod of the replay (`percentile_of_waits`)."""
    return percentile_of_waits(log.waits, q)


def _durations(log: TimelineLog) -> np.ndarray:
    """How long each logged value held: until the next event, the last one until the end."""
    edges = np.append(log.t, max(log.end, int(log.t[-1]))) if len(log.t) else np.zeros(1)
    return np.diff(edges).astype(np.float64)


def time_weighted(log: TimelineLog, values: np.ndarray) -> tuple[float, float]:
    """(mean, 10th percentile) of a piecewise-constant series over the replay's span."""
    if len(log.t) == 0:
        return 0.0, 0.0
    dt = _durations(log)
    span = dt.sum()
    if span <= 0:
        return float(values[-1]), float(values[-1])
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(dt[order])
    p10 = float(values[order][np.searchsorted(cum, 0.1 * span)])
    return float((values * dt).sum() / span), p10


def summarise_timeline(log: TimelineLog) -> dict[str, Any]:
    gpus = log.capacity_milli / MILLI_PER_GPU
    alloc_mean, alloc_p10 = time_weighted(log, log.allocated / MILLI_PER_GPU)
    frag_mean, _ = time_weighted(log, log.fragmented / MILLI_PER_GPU)
    waits = log.waits
    ran = waits[np.isfinite(waits)]

    def pct(x: float) -> float:
        return round(100.0 * x / gpus, 4) if gpus else 0.0

    return {
        "pods": int(len(waits)),
        "wait_p50_s": wait_percentile(log, 50),
        "wait_p95_s": wait_percentile(log, 95),
        "wait_p99_s": wait_percentile(log, 99),
        "wait_max_ran_s": float(ran.max()) if len(ran) else 0.0,
        "never_ran": int((~np.isfinite(waits)).sum()),
        "never_ran_pct": round(100.0 * float((~np.isfinite(waits)).mean()), 4) if len(waits) else 0.0,
        "gpus": gpus,
        "gpu_alloc_mean": round(alloc_mean, 3),
        "gpu_alloc_p10": round(alloc_p10, 3),
        "gpu_alloc_peak": round(float(log.allocated.max()) / MILLI_PER_GPU, 3) if len(log.t) else 0.0,
        "gpu_alloc_mean_pct": pct(alloc_mean),
        "gpu_alloc_p10_pct": pct(alloc_p10),
        "frag_mean_gpus": round(frag_mean, 3),
        "frag_mean_pct": pct(frag_mean),
        "pending_peak": int(log.pending.max()) if len(log.t) else 0,
        "seconds": round(log.seconds, 3),
    }


def json_ready(value: Any) -> Any:
    """`value` with every infinite or NaN float as None: JSON has no infinity, and a wait that never ends is
    one (strict readers such as jq refuse Python's `Infinity`)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def plot_timeline(out: Path, trace: str, logs: dict[str, TimelineLog], speedup: float = 1.0) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers or CI
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for name, log in logs.items():
        hours = log.t / 3600.0 / speedup
        top.step(hours, log.allocated / MILLI_PER_GPU, where="post", label=name, linewidth=0.8)
        bottom.step(hours, log.pending, where="post", label=name, linewidth=0.8)
    top.set_ylabel("allocated GPUs")
    bottom.set_ylabel("pending pods")
    unit = "hours of trace time" if speedup == 1 else f"hours of display time (trace time / {speedup:g})"
    bottom.set_xlabel(unit)
    top.set_title(f"Timeline replay — trace {trace}")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8)
    fig.tight_layout()
    path = out / "timeline.png"
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
