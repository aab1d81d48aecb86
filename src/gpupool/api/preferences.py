"""What kube-scheduler weighs for a pod, read from the API's objects: softly, the pod's own preferences
(preferred node affinity, preferred pod affinity or anti-affinity, topology spread that may be broken) and
nodes' `PreferNoSchedule` taints; as hard rules, the taints a pod does not tolerate, its required node
affinity (gpupool's claim allocator chooses a node itself and must not choose one kube-scheduler would
then refuse) and whether it states rules about other pods (which the claim allocator leaves to
kube-scheduler).

The extender decides a GPU pod's node in /filter when the pod states no soft preference
(gpupool.scheduler.extender): kube-scheduler then has one node left and scores nothing. A pod that does
state one goes through /prioritize, where kube-scheduler's own scores count beside the policy's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PREFER_NO_SCHEDULE = "PreferNoSchedule"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


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


def pod_rules(pod: Mapping[str, Any]) -> list[str]:
    """The kinds of hard rule the pod's spec states about other pods: required pod affinity or
    anti-affinity, topology spread that may not be broken (empty: none). Whether a node meets them depends
    on every pod of the cluster, which only kube-scheduler weighs."""
    spec = _map(pod.get("spec"))
    affinity = _map(spec.get("affinity"))
    found = [kind for kind in ("podAffinity", "podAntiAffinity") if _list(_map(affinity.get(kind)).get(_REQUIRED))]
    # whenUnsatisfiable is required by the API; a constraint without it is read as the stricter DoNotSchedule
    if any(_map(c).get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
           for c in _list(spec.get("topologySpreadConstraints"))):
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


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _requirement_holds(req: Mapping[str, Any], value: str | None) -> bool:
    """One node selector requirement against the node's value for its key (None: the node has none).
    Kubernetes' rules: NotIn and DoesNotExist hold for a missing key; Gt and Lt compare integers and
    fail on a value that is not one; an unknown operator matches nothing."""
    op = req.get("operator")
    values = [str(v) for v in _list(req.get("values"))]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _int(value), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, Any], name: str) -> bool:
    expressions = [e for e in _list(term.get("matchExpressions")) if isinstance(e, Mapping)]
    fields = [f for f in _list(term.get("matchFields")) if isinstance(f, Mapping)]
    if not expressions and not fields:  # an empty term selects no node
        return False
    labels_ok = all(_requirement_holds(e, None if (v := labels.get(str(e.get("key")))) is None else str(v))
                    for e in expressions)
    # metadata.name is the only field a node selector term may name
    fields_ok = all(_requirement_holds(f, name if f.get("key") == "metadata.name" else None) for f in fields)
    return labels_ok and fields_ok


def required_affinity_allows(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the pod's required node affinity lets it run on `node`: no such affinity, or one of its
    node selector terms matches the node (the terms are ORed, a term's requirements ANDed)."""
    required = _map(_map(_map(_map(pod.get("spec")).get("affinity")).get("nodeAffinity")).get(_REQUIRED))
    if not required:
        return True
    meta = _map(node.get("metadata"))
    labels, name = _map(meta.get("labels")), str(meta.get("name") or "")
    terms = [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]
    return any(_term_matches(t, labels, name) for t in terms)
