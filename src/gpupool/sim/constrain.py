"""Trace variants in which a share of the GPU pods name the GPU models they accept (the trace's
`gpu_spec`), for pods lists that leave it empty (the bundled ones).

Chosen pods (a seeded sample of the GPU pods) get one model (four in five) or two, drawn in proportion to
the GPUs of each model in the node list among the models with a node that could host the pod when empty
(enough GPUs per node and CPU and memory), as the trace's own gpuspec files mostly name one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpupool.core.model import Node, PodRequest

PAIR_SHARE = 0.2  # share of constrained pods that accept two models


def constrain_models(pods: Sequence[PodRequest], nodes: Sequence[Node], fraction: float,
                     seed: int = 0) -> list[PodRequest]:
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction {fraction} must be between 0 and 1")
    rng = np.random.default_rng(seed)
    gpus_of: dict[str, int] = {}
    for n in nodes:
        if n.gpus:
            gpus_of[n.gpus[0].model] = gpus_of.get(n.gpus[0].model, 0) + len(n.gpus)
    models = sorted(gpus_of)
    gpu_pods = [k for k, p in enumerate(pods) if p.gpu.count > 0]
    chosen = rng.choice(len(gpu_pods), size=round(fraction * len(gpu_pods)), replace=False)
    out = list(pods)
    for c in sorted(chosen.tolist()):
        k = gpu_pods[c]
        pod = pods[k]
        hosts = [m for m in models if any(
            n.gpus and n.gpus[0].model == m and len(n.gpus) >= pod.gpu.count and n.cpu_milli >= pod.cpu_milli
            and n.memory_mib >= pod.memory_mib for n in nodes)]
        if not hosts:
            continue
        weight = np.array([gpus_of[m] for m in hosts], dtype=np.float64)
        size = 2 if len(hosts) > 1 and rng.random() < PAIR_SHARE else 1
        picked = rng.choice(len(hosts), size=size, replace=False, p=weight / weight.sum())
        out[k] = replace(pod, gpu=replace(pod.gpu, models=frozenset(hosts[int(i)] for i in picked)))
    return out
