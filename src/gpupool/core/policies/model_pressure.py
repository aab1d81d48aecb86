"""How short a GPU model's pool is running for the pods that can use only it.

Pods that name GPU models (the trace's `gpu_spec`) can go to those models' nodes only; pods that name
none can go anywhere. FGD's fragment measure sees the model constraint per node but not per pool: it
happily fills the last free T4s with pods that could as well have run on the idle G2s, and the T4-only
pods that arrive later find nothing. Measured on the `default` trace with a third of the pods naming
models (seed 50), nine in ten failed pods were model-constrained while hundreds of GPUs of other models
stayed idle (docs/placement.md).

The pressure on model m compares the share of the expected demand that only m can serve, c(m), with m's
share of the free GPU compute now, f(m):

    pressure(m) = c(m) / f(m)        (0 when no task is confined to m)

c(m) counts a task naming k models as 1/k of its demand on each. A pool with pressure above 1 is being
asked for more by its own pods than its share of what is left; placing a pod that could go elsewhere
there moves the shortage onto pods that cannot. With no constrained task in the workload every pressure
is 0, so nothing changes for unconstrained traces.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.frag import WorkloadArrays
from gpupool.core.policy import FloatArray
from gpupool.core.state import ClusterState, IntArray

MAX_PRESSURE = 8.0  # a pool with nearly nothing free: bounded, so that one term cannot swamp the rest


def confined_demand(state: ClusterState, w: WorkloadArrays) -> FloatArray:
    """c(m) per model id of `state`: the share of the workload's GPU demand that only model m serves."""
    out = np.zeros(len(state.models))
    demand = w.weight * w.milli * w.count
    total = float(demand.sum())
    if total <= 0 or not len(state.models):
        return out
    node_model = state.gpu_model[:, 0]
    has_gpu = node_model >= 0
    for j in range(len(demand)):
        hosts = w.model_ok[has_gpu, j]
        if hosts.all():
            continue  # a task any GPU node may take (or one naming every model) confines nothing
        models = np.unique(node_model[has_gpu][hosts])
        if len(models):
            out[models] += demand[j] / total / len(models)
    return out


def pressure(state: ClusterState, confined: FloatArray) -> FloatArray:
    """pressure(m) per model id, from the cluster's free compute now (healthy GPUs only)."""
    if not confined.any():
        return np.zeros(len(confined))
    usable = state.gpu_present & state.gpu_healthy
    free = np.bincount(state.gpu_model[usable], weights=state.gpu_milli_free[usable],
                       minlength=len(confined)).astype(np.float64)
    total = free.sum()
    share = free / total if total > 0 else free
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(confined > 0, confined / share, 0.0)
    result: FloatArray = np.minimum(np.nan_to_num(p, nan=MAX_PRESSURE, posinf=MAX_PRESSURE), MAX_PRESSURE)
    return result


def node_pressure(state: ClusterState, per_model: FloatArray, nodes: IntArray) -> FloatArray:
    """The pressure of each node's model (0 for nodes without GPUs)."""
    model = state.gpu_model[nodes, 0]
    result: FloatArray = np.where(model >= 0, per_model[np.maximum(model, 0)], 0.0) if len(per_model) else \
        np.zeros(len(nodes))
    return result
