"""Whether a pod may go to a node by the node's own rules: its nodeSelector and required node affinity, the
node's NoSchedule/NoExecute taints. kube-scheduler applies these to every pod it places; gpupool applies
them itself only where it decides a node that kube-scheduler then merely follows: the node of a DRA claim
(its allocation pins the pod there), and the node a remote share's pod runs on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupool.api.preferences import required_affinity_allows, untolerated
from gpupool.core.state import BoolArray

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


@dataclass
class _Shape:
    """What MayRunCache knows for one pod shape: the answer per node with the node's version, and the last
    answer for a whole list of names with the ledger's node serial it holds for."""

    answers: dict[str, tuple[int, bool]] = field(default_factory=dict)
    last: tuple[int, list[str], BoolArray] | None = None


class MayRunCache:
    """may_run's answers remembered per pod shape and node, each with the version of the node's object it
    was given for (the ledger's node_versions, which change whenever a node's object is replaced): a burst of
    claims asks the same question of thousands of nodes claim after claim (at 5,000 nodes may_run itself
    cost 30 ms a claim), while nodes change rarely. A node that changes (labels, taints) is asked again. The
    whole answer for the same names is kept too while no node changes at all (the ledger's node serial
    stays): then a claim costs no look at each node."""

    def __init__(self, shapes: int = SHAPES_KEPT) -> None:
        self.shapes = shapes
        self._shapes: dict[str, _Shape] = {}

    def allowed(self, pod: Mapping[str, Any], names: list[str], objs: Mapping[str, Mapping[str, Any]],
                versions: Mapping[str, int], serial: int) -> BoolArray:
        """may_run(pod, objs.get(name)) for each of `names` (read-only); an answer is remembered only for a
        node with a version; `serial` changes whenever any node's version does or a node goes."""
        key = pod_shape(pod)
        shape = self._shapes.pop(key, None)
        if shape is None:
            shape = _Shape()
            if len(self._shapes) >= self.shapes:  # the least recently asked shape goes
                del self._shapes[next(iter(self._shapes))]
        self._shapes[key] = shape  # most recently asked last
        if shape.last is not None and shape.last[0] == serial and shape.last[1] == names:
            return shape.last[2]
        out = np.empty(len(names), dtype=bool)
        answers = shape.answers
        version_of, known_of = versions.get, answers.get  # (this loop runs for every node)
        versioned = True
        for k, name in enumerate(names):
            version, known = version_of(name), known_of(name)
            if known is not None and known[0] == version:
                out[k] = known[1]
                continue
            ok = out[k] = may_run(pod, objs.get(name))
            if version is None:
                versioned = False
            else:
                answers[name] = (version, ok)
        out.flags.writeable = False
        shape.last = (serial, list(names), out) if versioned else None
        return out
