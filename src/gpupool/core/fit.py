"""Feasibility: which nodes (and which GPUs on them) can host a pod, and why the others cannot.

Everything is computed for many nodes at once on the arrays of `ClusterState`; reasons are short codes
turned into text only for the nodes that fail.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, RUNTIMES, GPURequest, Node, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.vendors import ISOLATION_OF_VENDOR, RUNTIME_OF_VENDOR, SHARE_MODES, share_holders

OK = 0
BAD_REQUEST = 1
NO_CPU = 2
NO_MEMORY = 3
NO_MODEL = 4
NO_GPU_SHARE = 5
NO_GPU_COUNT = 6
NO_GPU_LARGE_ENOUGH = 7  # even empty, no allowed GPU of the node could hold the share: waiting will not help
NO_RUNTIME = 8  # too few GPUs whose vendor runs the pod's runtime (cuda on NVIDIA, rocm on AMD, cann on Ascend)
NO_SHARE_MODE = 9  # too few GPUs whose vendor holds a share in the pod's isolation mode (none on Ascend cards)

_TEXT = {
    NO_CPU: "insufficient CPU",
    NO_MEMORY: "insufficient memory",
    NO_MODEL: "no GPU of an allowed model",
}


@dataclass(frozen=True, slots=True)
class Fit:
    """Result of a feasibility check over `nodes` (indices into the cluster state)."""

    nodes: IntArray
    code: IntArray  # per node: OK or the first failing check
    gpu_fit: BoolArray  # [len(nodes), width]: GPU slot can take the pod's per-GPU share

    def reason(self, k: int, pod: PodRequest, problems: list[str] | None = None) -> str:
        """Human text for the k-th checked node."""
        code = int(self.code[k])
        if code == BAD_REQUEST:
            return "invalid request: " + "; ".join(problems or pod.problems())
        if code == NO_GPU_SHARE:
            g = pod.gpu
            # No '%' in reasons: kube-scheduler formatted extender messages as printf strings (seen in 1.20).
            share = "a whole free GPU" if g.whole else f"a GPU with {g.cores_percent:g} percent compute"
            if not g.whole:
                share += " and " + (f"{g.memory_mib} MiB" if g.memory_mib is not None else "matching memory")
                share += " free"
            n = int(self.gpu_fit[k].sum())
            return f"needs {g.count} x {share}; {n} available"
        if code == NO_GPU_COUNT:
            return f"needs {pod.gpu.count} healthy GPU(s); the node has fewer"
        if code == NO_RUNTIME:
            return f"needs {pod.gpu.count} GPU(s) that run {pod.gpu.runtime}; the node has fewer"
        if code == NO_SHARE_MODE:
            mode = pod.gpu.share_mode or ""
            return (f"needs {pod.gpu.count} GPU(s) that hold a share under isolation {mode} "
                    f"({', '.join(share_holders(mode) or ())} cards); the node has fewer")
        if code == NO_GPU_LARGE_ENOUGH:
            return (f"needs {pod.gpu.count} x a GPU with {pod.gpu.memory_mib} MiB; "
                    "no GPU of this node is that large")
        return _TEXT.get(code, "fits")


# Per GPU slot of a state, two codes from its card's vendor: the runtime it runs, as an index into RUNTIMES (-1:
# padding, or a vendor gpupool has no runtime for, which only an "any" request may use), and the share modes it
# holds, one bit per core.vendors.SHARE_MODES entry (0: padding, an unknown vendor, or Ascend). A state's nodes
# never change after it is built and its copies share the same list (ClusterState.copy), so the arrays are kept
# per node list: built once per ledger or replay, not once per question. The list itself is held, so its id
# cannot be reused while cached.
_RUNTIME_CODE = {r: k for k, r in enumerate(RUNTIMES)}
_MODE_BIT = {m: 1 << k for k, m in enumerate(SHARE_MODES)}
_VENDOR_BITS = {v: sum(_MODE_BIT[m] for m in SHARE_MODES if m in modes) for v, modes in ISOLATION_OF_VENDOR.items()}
_RUNTIMES_KEPT = 32  # the ledger's and a replay's states stay: what-if copies of one node come and go
_runtimes: dict[int, tuple[list[Node], IntArray, IntArray, dict[str, BoolArray]]] = {}
_runtimes_lock = threading.Lock()


def _slot_codes(state: ClusterState) -> tuple[IntArray, IntArray, dict[str, BoolArray]]:
    """[N, width] runtime codes and [N, width] share-mode bits of every GPU slot (see above), and the bits as one
    boolean array per share mode (what the filter reads: one gather per question, no arithmetic)."""
    key = id(state.nodes)
    with _runtimes_lock:
        kept = _runtimes.pop(key, None)
        if kept is not None and kept[0] is state.nodes:
            _runtimes[key] = kept  # most recently used last: the eviction below takes the least recent
            return kept[1], kept[2], kept[3]
    runtimes = np.full((len(state), state.width), -1, dtype=np.int64)
    modes = np.zeros((len(state), state.width), dtype=np.int64)
    common = sum(_MODE_BIT.values())  # the modes every card holds, narrowed card by card
    for i, node in enumerate(state.nodes):
        for j, gpu in enumerate(node.gpus):
            runtime = RUNTIME_OF_VENDOR.get(gpu.vendor)
            if runtime is not None:
                runtimes[i, j] = _RUNTIME_CODE[runtime]
            bits = _VENDOR_BITS.get(gpu.vendor, 0)
            modes[i, j] = bits
            common &= bits
    # Per share mode, which slots hold it; a mode every card of the state holds (an all-NVIDIA cluster's hook)
    # is left out, so the filter asks nothing there.
    held = {m: (modes & bit) != 0 for m, bit in _MODE_BIT.items() if not common & bit}
    with _runtimes_lock:
        while len(_runtimes) >= _RUNTIMES_KEPT:
            del _runtimes[next(iter(_runtimes))]  # the least recently used: dicts keep insertion order
        _runtimes[key] = (state.nodes, runtimes, modes, held)
    return runtimes, modes, held


def gpu_runtimes(state: ClusterState) -> IntArray:
    """[N, width]: per GPU slot the index in RUNTIMES of the runtime its vendor runs (-1: none)."""
    return _slot_codes(state)[0]


def gpu_share_modes(state: ClusterState) -> IntArray:
    """[N, width]: per GPU slot the share modes its vendor holds, bit k for core.vendors.SHARE_MODES[k]."""
    return _slot_codes(state)[1]


def _runtime_allowed(state: ClusterState, g: GPURequest, nodes: IntArray) -> BoolArray | None:
    """Which GPU slots of `nodes` run the request's runtime; None when it runs anywhere. The one place the
    routing rule is applied: the framework, the claim path, moves and the simulator all ask core.fit."""
    if g.runs_anywhere or g.runtime not in _RUNTIME_CODE:
        return None  # an unknown runtime is refused as a bad request before placement (GPURequest.problems)
    runs: BoolArray = gpu_runtimes(state)[nodes] == _RUNTIME_CODE[g.runtime]
    return runs


def _share_allowed(state: ClusterState, g: GPURequest, nodes: IntArray) -> BoolArray | None:
    """Which GPU slots of `nodes` hold the request's share in its isolation mode (a hook share on NVIDIA and
    AMD cards, never on Ascend, where nothing would enforce it: core.vendors.ISOLATION_OF_VENDOR); None when
    any card will do (a whole card, a partition, no mode said)."""
    by_mode = _slot_codes(state)[2]
    mode = g.share_mode
    if mode is None or mode not in by_mode:  # no rule, or every card of the state holds the mode
        return None
    held: BoolArray = by_mode[mode][nodes]
    return held


def _allowed_gpus(state: ClusterState, g: GPURequest, nodes: IntArray) -> BoolArray:
    ok = state.gpu_present[nodes] & state.gpu_healthy[nodes]
    runs = _runtime_allowed(state, g, nodes)
    if runs is not None:
        ok &= runs
    held = _share_allowed(state, g, nodes)
    if held is not None:
        ok &= held
    if g.models:
        ids = [state.model_id(m) for m in g.models]
        ok &= np.isin(state.gpu_model[nodes], ids)
    if g.include_uuids or g.exclude_uuids:
        uu = np.array(
            [[gpu.uuid for gpu in state.nodes[i].gpus] + [""] * (state.width - len(state.nodes[i].gpus))
             for i in nodes],
            dtype=object,
        ).reshape(len(nodes), state.width)
        if g.include_uuids:
            ok &= np.isin(uu, list(g.include_uuids))
        if g.exclude_uuids:
            ok &= ~np.isin(uu, list(g.exclude_uuids))
    return ok


def gpu_rows(state: ClusterState, g: GPURequest, idx: IntArray) -> tuple[BoolArray, IntArray]:
    """The GPU part of `check` for nodes `idx`: per GPU slot whether it takes the share, and per node OK or
    the GPU code that fails. Row by row, so a cache may recompute only the nodes that changed."""
    code = np.zeros(len(idx), dtype=np.int64)
    if g.count == 0:
        return np.zeros((len(idx), state.width), dtype=bool), code
    allowed = _allowed_gpus(state, g, idx)
    mem_total = state.gpu_mem_total[idx]
    need_mem = mem_total * g.milli // MILLI_PER_GPU if g.memory_mib is None else g.memory_mib
    gpu_fit = allowed & (state.gpu_milli_free[idx] >= g.milli) & (state.gpu_mem_free[idx] >= need_mem)
    if state.max_sharers:
        gpu_fit &= state.gpu_sharers[idx] < state.max_sharers
    short = gpu_fit.sum(axis=1) < g.count
    code[short] = NO_GPU_SHARE
    code[short & ((allowed & (mem_total >= need_mem)).sum(axis=1) < g.count)] = NO_GPU_LARGE_ENOUGH
    too_few = allowed.sum(axis=1) < g.count
    constrained = bool(g.models or g.include_uuids or g.exclude_uuids)
    code[too_few] = NO_MODEL if constrained else NO_GPU_COUNT
    runs = _runtime_allowed(state, g, idx)
    if runs is not None:
        # Enough healthy GPUs but too few that run the pod's runtime (before models or UUIDs narrow them): the
        # runtime is the reason. A node with too few GPUs of any kind keeps the reason it had before runtimes.
        usable = state.gpu_present[idx] & state.gpu_healthy[idx]
        code[((runs & usable).sum(axis=1) < g.count) & (usable.sum(axis=1) >= g.count)] = NO_RUNTIME
    by_mode = _slot_codes(state)[2]
    mode = g.share_mode
    ruled = mode is not None and mode in by_mode
    # A node the runtime rules out keeps that reason (it has too few cards that run the pod at all).
    failing = np.flatnonzero(short & (code != NO_RUNTIME)) if ruled else np.zeros(0, dtype=np.int64)
    if mode is not None and ruled and len(failing):
        # Enough GPUs that run the runtime, too few of them whose vendor holds the share's mode (an "any" share
        # on an Ascend node): the mode is the reason, whatever else fails on the node's other cards. Only nodes
        # without room can have it (a node with room has enough holding cards), so only they are asked.
        at = idx[failing]
        held = by_mode[mode][at]
        usable = state.gpu_present[at] & state.gpu_healthy[at]
        if runs is not None:
            usable &= runs[failing]
        code[failing[((usable & held).sum(axis=1) < g.count) & (usable.sum(axis=1) >= g.count)]] = NO_SHARE_MODE
    return gpu_fit, code


def check(state: ClusterState, pod: PodRequest, nodes: IntArray | None = None) -> Fit:
    """Which of `nodes` (default: all) can host `pod`; per GPU, which slots can take its share."""
    idx = np.arange(len(state), dtype=np.int64) if nodes is None else np.asarray(nodes, dtype=np.int64)
    if pod.problems():
        return Fit(idx, np.full(len(idx), BAD_REQUEST, dtype=np.int64), np.zeros((len(idx), state.width), bool))
    gpu_fit, code = gpu_rows(state, pod.gpu, idx)
    code[state.mem_free[idx] < pod.memory_mib] = NO_MEMORY
    code[state.cpu_free[idx] < pod.cpu_milli] = NO_CPU
    return Fit(idx, code, gpu_fit)


def fits_without(state: ClusterState, pod: PodRequest, node: int, gone: Iterable[PodRequest]) -> bool:
    """Would `pod` fit on node `node` if the pods `gone` (holding allocations in `state`, by key) were gone?
    Asked on a copy of that node (ClusterState.node_copy): `state` is never changed, even for a moment. The
    simulator's reclaim asks it."""
    alone = state.node_copy(node)
    for p in gone:
        alone.release(p.key)
    return bool(check(alone, pod, np.asarray([0], dtype=np.int64)).code[0] == OK)
