"""The plugin registry and the default profile.

Adding a plugin: write its module under gpupool.scheduler.framework.plugins (a class with `name`,
`gpu_only`, the extension-point methods it takes part in, and an `Args` model), add one line to REGISTRY,
and put its name in PROFILE where it should run (the order in PROFILE is the order at each extension point;
Unreserve runs in reverse). `args_for` maps the scheduler config onto the plugins' typed arguments; a
plugin whose Args has no required field needs no entry there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.interface import Handle, Plugin
from gpupool.scheduler.framework.plugins import (
    binding,
    busy_nodes,
    gpu_fit,
    gpu_node,
    gpu_request,
    mig,
    mps_ready,
    node_exists,
    node_lock,
    nominate,
    pending_note,
    pod_pending,
    policy_score,
    prefer_no_schedule,
    queue_admission,
    queue_reclaim,
    scheduler_name,
    shares_per_gpu,
)


@dataclass(frozen=True, slots=True)
class PluginSpec:
    factory: Callable[[Handle, Any], Plugin]
    args: type[BaseModel]


REGISTRY: dict[str, PluginSpec] = {
    "scheduler_name": PluginSpec(scheduler_name.SchedulerName, scheduler_name.Args),
    "pod_pending": PluginSpec(pod_pending.PodPending, pod_pending.Args),
    "gpu_request": PluginSpec(gpu_request.GPURequestPlugin, gpu_request.Args),
    "node_exists": PluginSpec(node_exists.NodeExists, node_exists.Args),
    "gpu_node": PluginSpec(gpu_node.GPUNode, gpu_node.Args),
    "gpu_fit": PluginSpec(gpu_fit.GPUFit, gpu_fit.Args),
    "shares_per_gpu": PluginSpec(shares_per_gpu.SharesPerGPU, shares_per_gpu.Args),
    "policy_score": PluginSpec(policy_score.PolicyScore, policy_score.Args),
    "busy_nodes": PluginSpec(busy_nodes.BusyNodesScore, busy_nodes.Args),
    "prefer_no_schedule": PluginSpec(prefer_no_schedule.PreferNoSchedule, prefer_no_schedule.Args),
    "nominate": PluginSpec(nominate.Nominate, nominate.Args),
    "node_lock": PluginSpec(node_lock.NodeLock, node_lock.Args),
    "binding": PluginSpec(binding.Binding, binding.Args),
    "pending_note": PluginSpec(pending_note.PendingNote, pending_note.Args),
    "queue_admission": PluginSpec(queue_admission.QueueAdmission, queue_admission.Args),
    "queue_reclaim": PluginSpec(queue_reclaim.QueueReclaim, queue_reclaim.Args),
    "mig_placement": PluginSpec(mig.MigPlacement, mig.Args),
    "mps_ready": PluginSpec(mps_ready.MpsReady, mps_ready.Args),
}

# Where each plugin runs:
#   PreFilter   scheduler_name, pod_pending, gpu_request, nominate, mig_placement
#   Filter      node_exists, gpu_node, gpu_fit, shares_per_gpu, mps_ready, mig_placement, queue_admission
#   PostFilter  pending_note, queue_reclaim
#   Score       mig_placement, policy_score, busy_nodes, prefer_no_schedule
#   Reserve     nominate, queue_admission        Unreserve  node_lock, nominate
#   Permit      node_lock             Bind       binding
PROFILE: tuple[str, ...] = (
    "scheduler_name",
    "pod_pending",
    "gpu_request",
    "node_exists",
    "gpu_node",
    "gpu_fit",
    "shares_per_gpu",
    "mps_ready",
    "mig_placement",
    "policy_score",
    "busy_nodes",
    "prefer_no_schedule",
    "nominate",
    "queue_admission",
    "node_lock",
    "binding",
    "pending_note",
    "queue_reclaim",
)


def args_for(config: SchedulerConfig) -> dict[str, dict[str, Any]]:
    """The plugins' arguments from the scheduler config."""
    return {
        "scheduler_name": {"scheduler_name": config.scheduler_name},
        "busy_nodes": {"avoid": config.avoid_busy_nodes},
        "nominate": {
            "nominate_timeout_s": config.nominate_timeout_s,
            "assume_timeout_s": config.assume_timeout_s,
            "max_nominations": config.max_nominations,
            "max_unbound_s": config.nomination_budget_s,
            "unbound_window_s": config.nomination_budget_window_s,
        },
        "node_lock": {"lock_wait_s": config.lock_wait_s},
    }


def build_plugins(handle: Handle, profile: tuple[str, ...] = PROFILE,
                  args: dict[str, dict[str, Any]] | None = None) -> list[Plugin]:
    """Instantiate the profile's plugins (in order) with validated arguments."""
    given = args_for(handle.config) if args is None else args
    plugins: list[Plugin] = []
    for name in profile:
        spec = REGISTRY[name]
        plugins.append(spec.factory(handle, spec.args.model_validate(given.get(name, {}))))
    return plugins
