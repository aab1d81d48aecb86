"""Fill fragmentation: FGD's measure, looking past the next pod.

FGD (gpupool.core.frag) asks of each typical task m: could *one* m be placed here? A node with three free
GPUs and 20 free cores is no fragment for a 1-GPU, 11-core task, yet after one such pod two GPUs are
stranded for want of CPU; a GPU with 530 milli free is no fragment for a 470 task, yet 60 milli stay idle
once it is there. *Fill fragmentation* asks instead: fill the node with as many copies of m as its GPUs
and its CPU allow; how much idle GPU compute is left? For a one-GPU task of s milli and c cores on a
node with per-GPU free f_j and free CPU C:

    copies = min(sum_j floor(f_j / s), floor(C / c)),   fragment = sum_j f_j - copies * s

(all idle compute when m needs no GPU or the node's model is excluded, as in FGD). Tasks that take
several GPUs keep FGD's fragment. The fill measure is always at least FGD's.

The score blends the two, (1 - BLEND) * FGD + BLEND * fill, and then follows FGD exactly (the same
machinery, gpupool.core.policies.fgd, with this measure): the node score is the artifact's integer
sigmoid of the decrease, ties go to the fixed node order, a share takes the first GPU reaching the best
score. A small blend matters: the fill measure alone, or a large share of it,
did worse than FGD on the traces (docs/placement.md), because it no longer makes the ties that keep
placements together.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpupool.core.frag import WorkloadArrays
from gpupool.core.policy import FloatArray
from gpupool.core.state import BoolArray, IntArray

# Share of the fill measure in the blend; measured on seeds 42-51 of the three bundled traces
# (docs/placement.md, "What we tried").
BLEND = 0.07
_NO_CPU_LIMIT = np.iinfo(np.int64).max // 4  # copies allowed by CPU when a task asks for no CPU


def fill_fragmentation(
    free: npt.NDArray[np.int64], cpu_free: IntArray, model_ok: BoolArray, w: WorkloadArrays, blend: float = BLEND
) -> FloatArray:
    """Blended expected fragment (milli-GPU) of K nodes: (1 - blend) * FGD's + blend * fill. `free` is
    [K, G] (or [K, C, G] with `cpu_free` and `model_ok` broadcastable to the leading dims)."""
    f = free[..., :, None]  # [..., G, 1]
    fits = f >= w.milli  # [..., G, M]
    total = free.sum(axis=-1)[..., None]  # [..., 1]
    small = np.where(fits, 0, f).sum(axis=-2)  # FGD: idle compute on GPUs too small for the task
    cpu = cpu_free[..., None]
    hosts = model_ok & (w.milli > 0)
    fgd = np.where(hosts & (cpu >= w.cpu) & (fits.sum(axis=-2) >= w.count), small, total)
    per_gpu = (f // np.maximum(w.milli, 1)).sum(axis=-2)  # copies the GPUs take
    by_cpu = np.where(w.cpu > 0, cpu // np.maximum(w.cpu, 1), _NO_CPU_LIMIT)  # copies the CPU takes
    fill = np.where(hosts, total - np.minimum(per_gpu, by_cpu) * w.milli, total)
    per_task = np.where(w.count > 1, fgd, (1.0 - blend) * fgd + blend * fill)
    result: FloatArray = per_task @ w.weight
    return result
