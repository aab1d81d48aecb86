"""kube-scheduler extender v1 JSON (k8s.io/kube-scheduler extender/v1 types).

The Go structs have no json tags, so the keys on the wire are the Go field names (`Pod`, `NodeNames`,
`FailedNodes`, ...). The models below use exactly those spellings as field names. Embedded Pod/Node
objects stay plain Kubernetes JSON dicts. Constants: scores are 0..MAX_EXTENDER_PRIORITY.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10


class ExtenderRequestError(ValueError):
    """A request body that is not valid extender JSON; the message says where."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


_META_STRINGS = ("name", "namespace", "uid")


def _object(obj: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes object as the extender reads it: `metadata`, when present, is an object whose name,
    namespace and uid, when present, are strings. Anything else is a malformed body (400), never a
    TypeError deep in a handler (500)."""
    meta = obj.get("metadata")
    if meta is None:
        return obj
    if not isinstance(meta, dict):
        raise ValueError("metadata is not an object")
    for key in _META_STRINGS:
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"metadata.{key} is not a string")
    return obj


KubeObject = Annotated[dict[str, Any], AfterValidator(_object)]


class NodeList(_Wire):
    items: list[KubeObject] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of /filter and /prioritize. `NodeNames` when nodeCacheCapable, else `Nodes`."""

    Pod: KubeObject
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return self.NodeNames
        if self.Nodes is not None:
            return [str((n.get("metadata") or {}).get("name", "")) for n in self.Nodes.items]
        return []


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=MIN_EXTENDER_PRIORITY, le=MAX_EXTENDER_PRIORITY)


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    Error: str = ""


class MetaPod(_Wire):
    UID: str


class MetaVictims(_Wire):
    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Wire):
    Pods: list[KubeObject] = Field(default_factory=list)
    NumPDBViolations: int = 0

    def meta(self) -> MetaVictims:
        uids = [str((p.get("metadata") or {}).get("uid", "")) for p in self.Pods]
        return MetaVictims(Pods=[MetaPod(UID=u) for u in uids if u], NumPDBViolations=self.NumPDBViolations)


class ExtenderPreemptionArgs(_Wire):
    """Body of the preempt verb: kube-scheduler's candidate victims per node (`NodeNameToMetaVictims` when
    nodeCacheCapable, else whole pods in `NodeNameToVictims`)."""

    Pod: KubeObject
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None

    def candidates(self) -> dict[str, MetaVictims]:
        if self.NodeNameToMetaVictims is not None:
            return self.NodeNameToMetaVictims
        return {node: v.meta() for node, v in (self.NodeNameToVictims or {}).items()}


class ExtenderPreemptionResult(_Wire):
    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


HostPriorityList = TypeAdapter(list[HostPriority])


def _explain(e: ValidationError, what: str) -> ExtenderRequestError:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return ExtenderRequestError(f"invalid {what} at {where}: {first['msg']}")


def parse_args(body: bytes) -> ExtenderArgs:
    try:
        return ExtenderArgs.model_validate_json(body)
    except ValidationError as e:
        raise _explain(e, "ExtenderArgs") from None


def parse_binding_args(body: bytes) -> ExtenderBindingArgs:
    try:
        return ExtenderBindingArgs.model_validate_json(body)
    except ValidationError as e:
        raise _explain(e, "ExtenderBindingArgs") from None


def parse_preemption_args(body: bytes) -> ExtenderPreemptionArgs:
    try:
        return ExtenderPreemptionArgs.model_validate_json(body)
    except ValidationError as e:
        raise _explain(e, "ExtenderPreemptionArgs") from None


# `,"Score":N}` for every valid score: a score outside 0..MAX_EXTENDER_PRIORITY is a KeyError, not JSON.
_SCORE_TAIL = {s: f',"Score":{s}}}' for s in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1)}


def dump_priorities(priorities: list[tuple[str, int]]) -> bytes:
    """HostPriorityList JSON from (host, score) pairs with scores already in 0..MAX_EXTENDER_PRIORITY,
    written without building one model or dict per node (thousands of nodes per request): the bytes
    json.dumps(..., separators=(",", ":")) writes, in a third of its time."""
    if not priorities:
        return b"[]"
    hosts, scores = zip(*priorities, strict=True)
    heads = map('{"Host":'.__add__, map(encode_basestring_ascii, hosts))
    return ("[" + ",".join(map(str.__add__, heads, map(_SCORE_TAIL.__getitem__, scores))) + "]").encode()


def parse_priorities(body: bytes) -> list[HostPriority]:
    try:
        return HostPriorityList.validate_json(body)
    except ValidationError as e:
        raise _explain(e, "HostPriorityList") from None
