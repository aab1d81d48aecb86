"""The plugin registry and the default profile.

Adding a plugin: write its module under gpupool.scheduler.framework.plugins (a class with `name`,
`gpu_only`, the extension-point methods it takes part in, and an `Args` model), add one line to REGISTRY,
and put its name in PROFILE and/or CLAIM_PROFILE where it should run (the order in a profile is the order at
each extension point; Unreserve runs in reverse). `args_for` maps the scheduler config onto the plugins'
typed arguments; a plugin whose Args has no required field needs no entry there.

Two profiles, one set of plugins: PROFILE serves pods through the extender, CLAIM_PROFILE the DRA claims of
gated pods (gpupool.scheduler.claims). A plugin in both is one instance (build_profiles), so the queues,
fit, fragmentation score, MIG planning, preferences and their state are the same for both forms by
construction. What differs is only what has to: how the request is read (gpu_request from the pod's
limits, claim_request from its claim), the claim's own rules (claim_nodes, claim_devices, remote_tiers) and
how capacity is taken (nominate and node_lock and binding for a pod kube-scheduler binds through the extender;
claim_reserve for a claim, whose allocation the claim allocator writes). kube-scheduler binds a claim's pod
itself, with the claim's device already chosen and prepared by name, so neither the extender's bind nor
node_lock (which keeps two pods of one node from waiting for the device plugin's Allocate at once, a wait a
claim never has) takes part; nor scheduler_name (the pod is kube-scheduler's).
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
    claim_devices,
    claim_nodes,
    claim_request,
    claim_reserve,
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
    remote_tiers,
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
    "claim_request": PluginSpec(claim_request.ClaimRequest, claim_request.Args),
    "claim_nodes": PluginSpec(claim_nodes.ClaimNodes, claim_nodes.Args),
    "claim_devices": PluginSpec(claim_devices.ClaimDevices, claim_devices.Args),
    "remote_tiers": PluginSpec(remote_tiers.RemoteTiers, remote_tiers.Args),
    "claim_reserve": PluginSpec(claim_reserve.ClaimReserve, claim_reserve.Args),
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

# Where each plugin runs for a claim (the plugins of PROFILE, save those named in the module doc):
#   PreFilter   pod_pending, claim_request, remote_tiers, mig_placement
#   Filter      node_exists, gpu_node, claim_nodes, remote_tiers, gpu_fit, claim_devices, shares_per_gpu,
#               mps_ready, mig_placement, queue_admission   (claim_nodes and remote_tiers first: what
#               kube-scheduler's own filters rule out for a pod fails before any capacity check, unresolvable,
#               so no reclaim acts on such a node)
#   PostFilter  pending_note, queue_reclaim
#   Score       remote_tiers, mig_placement, policy_score, busy_nodes, prefer_no_schedule
#   Reserve     remote_tiers, claim_reserve, queue_admission     Unreserve  claim_reserve, remote_tiers
CLAIM_PROFILE: tuple[str, ...] = (
    "pod_pending",
    "claim_request",
    "node_exists",
    "gpu_node",
    "claim_nodes",
    "remote_tiers",
    "gpu_fit",
    "claim_devices",
    "shares_per_gpu",
    "mps_ready",
    "mig_placement",
    "policy_score",
    "busy_nodes",
    "prefer_no_schedule",
    "claim_reserve",
    "queue_admission",
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
                  args: dict[str, dict[str, Any]] | None = None,
                  built: dict[str, Plugin] | None = None) -> list[Plugin]:
    """Instantiate the profile's plugins (in order) with validated arguments; those already in `built` (by
    name) are reused, and the new ones added to it."""
    given = args_for(handle.config) if args is None else args
    made = {} if built is None else built
    plugins: list[Plugin] = []
    for name in profile:
        if name not in made:
            spec = REGISTRY[name]
            made[name] = spec.factory(handle, spec.args.model_validate(given.get(name, {})))
        plugins.append(made[name])
    return plugins


def build_profiles(handle: Handle) -> tuple[list[Plugin], list[Plugin]]:
    """The plugins of PROFILE and of CLAIM_PROFILE, each plugin one instance shared by both."""
    built: dict[str, Plugin] = {}
    return build_plugins(handle, PROFILE, built=built), build_plugins(handle, CLAIM_PROFILE, built=built)
