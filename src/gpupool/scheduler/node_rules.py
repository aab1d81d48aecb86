"""Whether a pod may go to a node by the node's own rules: its nodeSelector and required node affinity, the
node's NoSchedule/NoExecute taints. kube-scheduler applies these to every pod it places; gpupool applies
them itself only where it decides a node that kube-scheduler then merely follows: the node of a DRA claim
(its allocation pins the pod there), and the node a remote share's pod runs on."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.api.preferences import required_affinity_allows, untolerated

HARD_EFFECTS = ("NoSchedule", "NoExecute")  # taints that keep new pods (and claims) away; PreferNoSchedule does not
MAY_RUN = "its nodeSelector and node affinity, the nodes' taints"  # what may_run reads, as the reasons say it
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"  # the node affinity may_run reads
SHAPES_KEPT = 64  # pod shapes whose answers MayRunCache keeps (a burst's pods mostly share one)


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


def pod_shape(pod: Mapping[str, Any]) -> str:
    """All that may_run reads of the pod, as one key: two pods of one shape get the same answer on every
    node. (Kept beside may_run: a rule that reads more of the pod must add it here.)"""
    spec = pod.get("spec") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)
    return json.dumps([spec.get("nodeSelector") or {}, affinity or {}, spec.get("tolerations") or []],
                      sort_keys=True, default=str)


class MayRunCache:
    """may_run's answers remembered per pod shape and node, each with the version of the node's object it
    was given for (the ledger's node_versions, which change whenever a node's object is replaced): a burst of
    claims asks the same question of thousands of nodes claim after claim (at 5,000 nodes may_run itself
    cost 30 ms a claim), while nodes change rarely. A node that changes (labels, taints) is asked again."""

    def __init__(self, shapes: int = SHAPES_KEPT) -> None:
        self.shapes = shapes
        self._answers: dict[str, dict[str, tuple[int, bool]]] = {}

    def allowed(self, pod: Mapping[str, Any], names: Sequence[str], objs: Mapping[str, Mapping[str, Any]],
                versions: Mapping[str, int]) -> list[bool]:
        """may_run(pod, objs.get(name)) for each of `names`; an answer is remembered only for a node with a
        version."""
        shape = pod_shape(pod)
        answers = self._answers.pop(shape, None)
        if answers is None:
            answers = {}
            if len(self._answers) >= self.shapes:  # the least recently asked shape goes
                del self._answers[next(iter(self._answers))]
        self._answers[shape] = answers  # most recently asked last
        out = []
        version_of, known_of = versions.get, answers.get  # (this loop runs for every node per claim)
        for name in names:
            version, known = version_of(name), known_of(name)
            if known is not None and known[0] == version:
                out.append(known[1])
                continue
            ok = may_run(pod, objs.get(name))
            if version is not None:
                answers[name] = (version, ok)
            out.append(ok)
        return out
