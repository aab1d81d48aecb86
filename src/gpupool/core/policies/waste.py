"""Waste: the GPU compute a node will leave idle however the typical workload fills it, from two causes FGD
does not see until the very next pod fails.

* **Pairing.** W(f) is the least compute left idle on a GPU with f milli free once it is packed as well as
  possible with the typical one-GPU sizes (any number of each; W(f) = f when none fits). A 320 share on a
  GPU holding a 470 leaves 210 that no common share fits; the same share on a fresh GPU leaves 680, which
  a 650 fills to 30. Sizes no larger than the remainder of the most popular share above half a GPU are
  left out (on the Alibaba traces: the remainder of a 0.81 share is 190; shares of 160 or less): such
  remainders outnumber those small shares and absorb them, so counting on them elsewhere is false hope.
* **CPU.** The free CPU C of a node can feed about C·r of GPU compute, r being the typical workload's GPU
  milli per CPU milli; anything beyond is stranded. A node's own GPU-to-CPU ratio is the least r used for
  it, so that an empty node, which its owner sized, never counts as stranded (underestimating r on a
  cluster with little CPU otherwise turned the policy into first fit).

    waste(node) = max(sum_j W(f_j), sum_j f_j - C · r_node)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpupool.core.frag import WorkloadArrays
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.policy import FloatArray
from gpupool.core.state import ClusterState, IntArray


def pairing_table(w: WorkloadArrays) -> FloatArray:
    """W(f) for f = 0 .. 1000 milli free (see the module's doc)."""
    one = (w.count == 1) & (w.milli > 0)
    popularity: dict[int, float] = {}
    for milli, weight in zip(w.milli[one].tolist(), w.weight[one].tolist(), strict=True):
        popularity[milli] = popularity.get(milli, 0.0) + weight
    large = {m: p for m, p in popularity.items() if MILLI_PER_GPU // 2 < m < MILLI_PER_GPU}
    absorbed = MILLI_PER_GPU - max(large, key=lambda m: (large[m], m)) if large else 0
    sizes = np.array(sorted(m for m in popularity if m > absorbed), dtype=np.int64)
    table = np.zeros(MILLI_PER_GPU + 1)
    for f in range(1, MILLI_PER_GPU + 1):
        fits = sizes[sizes <= f]
        table[f] = table[f - fits].min() if len(fits) else f  # best packing: dynamic programming over f
    return table


def feed_ratio(state: ClusterState, w: WorkloadArrays) -> FloatArray | None:
    """Per node, GPU milli one CPU milli feeds: max(the workload's ratio, the node's own). None when no
    typical task asks for both GPU and CPU (then CPU strands nothing)."""
    asks = (w.milli > 0) & (w.count > 0) & (w.cpu > 0)
    cpu = float((w.weight[asks] * w.cpu[asks]).sum())
    if cpu <= 0:
        return None
    ratio = float((w.weight[asks] * w.milli[asks] * w.count[asks]).sum()) / cpu
    own = MILLI_PER_GPU * state.gpu_count / np.maximum(state.cpu_total, 1)
    result: FloatArray = np.maximum(ratio, own)
    return result


def node_waste(free: npt.NDArray[np.int64], cpu_free: IntArray, pairing: FloatArray,
               feed: FloatArray | None) -> FloatArray:
    """Waste (milli) of K nodes: `free` [K, G] or [K, C, G], `cpu_free` and `feed` broadcastable to the
    leading dims."""
    paired: FloatArray = pairing[np.clip(free, 0, MILLI_PER_GPU)].sum(axis=-1)
    if feed is None:
        return paired
    result: FloatArray = np.maximum(paired, free.sum(axis=-1) - np.maximum(cpu_free, 0) * feed)
    return result


def share_waste(free: npt.NDArray[np.int64], cpu_after: IntArray, milli: int, pairing: FloatArray,
                feed: FloatArray | None) -> FloatArray:
    """[K, G]: `node_waste` of K nodes once a share of `milli` takes GPU c (column c; the free compute
    floors at 0 where it does not fit). One GPU's term of the pairing sum changes per candidate; the
    table holds whole numbers, so the sums are exact in any order."""
    after = np.maximum(free - milli, 0)
    before = pairing[np.clip(free, 0, MILLI_PER_GPU)]
    paired: FloatArray = before.sum(axis=-1)[:, None] - before + pairing[after]
    if feed is None:
        return paired
    total = free.sum(axis=-1)[:, None] - free + after
    result: FloatArray = np.maximum(paired, total - np.maximum(cpu_after, 0)[:, None] * feed)
    return result
