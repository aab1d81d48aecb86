"""Filter `gpu_fit`: the pod's request against the free capacity of each node (gpupool.core.fit, all nodes
at once). Nodes without room are UNSCHEDULABLE with core's reason (e.g. `needs 1 x a GPU with 30 percent
compute and 8192 MiB free; 0 available`). Leaves, per node, the GPU slots that can take the share in
`cycle.gpu_ok`, which later Filter plugins narrow and Score / Reserve use.

The GPU part of the check (core.fit.gpu_rows, the costly part at thousands of nodes) is kept per GPU
request and recomputed only for the nodes whose `ClusterState.node_version` moved since (a bind changes
one node; a burst of pods has a handful of shapes), so every answer is exactly `core.fit.check`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.core.fit import NO_CPU, NO_MEMORY, OK, Fit, check, gpu_rows
from gpupool.core.model import GPURequest, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code

# GPU requests whose rows are kept (each [nodes, GPU slots] booleans plus two ints per node: ~90 kB at
# 5,000 nodes); the least recently used goes first.
MAX_SHAPES = 64


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(slots=True)
class _Rows:
    gpu_fit: BoolArray  # [N, G]: gpu_rows' first answer
    code: IntArray  # [N]: gpu_rows' second answer
    version: IntArray  # [N]: node version the row was computed at (-1: never)


class FitRows:
    """`core.fit.check` for one ClusterState with the GPU rows cached per GPU request (bounded LRU)."""

    def __init__(self, state: ClusterState, max_shapes: int = MAX_SHAPES) -> None:
        self.state = state
        self.max_shapes = max_shapes
        self._rows: OrderedDict[tuple[GPURequest, int], _Rows] = OrderedDict()

    def check(self, pod: PodRequest, idx: IntArray) -> Fit:
        st = self.state
        if pod.problems():
            return check(st, pod, idx)
        key = (pod.gpu, st.max_sharers)  # gpu_rows reads max_sharers too, which moves no node version
        rows = self._rows.get(key)
        if rows is None:
            n = len(st)
            rows = _Rows(np.zeros((n, st.width), dtype=bool), np.zeros(n, dtype=np.int64),
                         np.full(n, -1, dtype=np.int64))
            self._rows[key] = rows
            while len(self._rows) > self.max_shapes:
                self._rows.popitem(last=False)
        else:
            self._rows.move_to_end(key)
        stale = np.flatnonzero(rows.version != st.node_version)
        if len(stale):
            fit, code = gpu_rows(st, pod.gpu, stale)
            rows.gpu_fit[stale] = fit
            rows.code[stale] = code
            rows.version[stale] = st.node_version[stale]
        # The same steps as core.fit.check after its gpu_rows (fancy indexing copies: callers may write).
        code = rows.code[idx]
        code[st.mem_free[idx] < pod.memory_mib] = NO_MEMORY
        code[st.cpu_free[idx] < pod.cpu_milli] = NO_CPU
        return Fit(idx, code, rows.gpu_fit[idx])


class GPUFit:
    name: ClassVar[str] = "gpu_fit"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self._rows: FitRows | None = None

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        assert cycle.request is not None
        state = self.handle.ledger.state
        if self._rows is None or self._rows.state is not state:  # the ledger rebuilt its state
            self._rows = FitRows(state)
        idx = nodes.nodes()
        fit = self._rows.check(cycle.request, idx)
        cycle.set_fit(idx, fit.gpu_fit, (len(state), state.width))
        bad = fit.code != OK
        if not bad.any():
            return
        if not nodes.reasons:
            nodes.reject(bad, (), Code.UNSCHEDULABLE)
            return
        # Reasons depend only on (code, number of fitting GPUs): write each distinct one once.
        rows = np.flatnonzero(bad)
        keys = fit.code[rows] * 1024 + fit.gpu_fit[rows].sum(axis=1)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        texts = [fit.reason(int(rows[f]), cycle.request) for f in first]
        nodes.reject(bad, list(map(texts.__getitem__, inverse.tolist())), Code.UNSCHEDULABLE)
