"""What kube-scheduler weighs softly for a pod, read from the API's objects: the pod's own preferences
(preferred node affinity, preferred pod affinity or anti-affinity, topology spread that may be broken) and
nodes' `PreferNoSchedule` taints.

The extender decides a GPU pod's node in /filter when the pod states no soft preference
(gpupool.scheduler.extender): kube-scheduler then has one node left and scores nothing. A pod that does
state one goes through /prioritize, where kube-scheduler's own scores count beside the policy's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PREFER_NO_SCHEDULE = "PreferNoSchedule"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def soft_preferences(pod: Mapping[str, Any]) -> list[str]:
    """The kinds of soft scheduling preference the pod's spec states (empty: none)."""
    spec = _map(pod.get("spec"))
    affinity = _map(spec.get("affinity"))
    found = [kind for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity")
             if _list(_map(affinity.get(kind)).get(_PREFERRED))]
    if any(_map(c).get("whenUnsatisfiable") == "ScheduleAnyway" for c in _list(spec.get("topologySpreadConstraints"))):
        found.append("topologySpreadConstraints")
    return found


def soft_taints(node: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The node's `PreferNoSchedule` taints."""
    taints = _list(_map(node.get("spec")).get("taints"))
    return tuple(t for t in taints if isinstance(t, Mapping) and t.get("effect") == PREFER_NO_SCHEDULE)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    # Kubernetes' matching rule: an empty effect matches every effect, an empty key with Exists every key;
    # Equal (the default operator) also compares the value.
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod: Mapping[str, Any], taints: Sequence[Mapping[str, Any]]) -> int:
    """How many of `taints` no toleration of the pod tolerates."""
    tolerations = [t for t in _list(_map(pod.get("spec")).get("tolerations")) if isinstance(t, Mapping)]
    return sum(not any(_tolerates(t, taint) for t in tolerations) for taint in taints)
