"""Whether a pod may go to a node by the node's own rules: its nodeSelector and required node affinity, the
node's NoSchedule/NoExecute taints. kube-scheduler applies these to every pod it places; gpupool applies
them itself only where it decides a node that kube-scheduler then merely follows: the node of a DRA claim
(its allocation pins the pod there), and the node a remote share's pod runs on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.preferences import required_affinity_allows, untolerated

HARD_EFFECTS = ("NoSchedule", "NoExecute")  # taints that keep new pods (and claims) away; PreferNoSchedule does not
MAY_RUN = "its nodeSelector and node affinity, the nodes' taints"  # what may_run reads, as the reasons say it


def may_run(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> bool:
    """Whether the pod may go to `node` (its Node object); a node the watch has not shown (None) is not one
    it may go to."""
    if node is None:
        return False
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    hard = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") in HARD_EFFECTS]
    return (all(labels.get(k) == v for k, v in selector.items()) and required_affinity_allows(pod, node)
            and not untolerated(pod, hard))
