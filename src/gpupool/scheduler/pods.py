"""The scheduler's own view of pods: the pod watch's cache, and the one way a decision finds its pod.

The extender's request bodies only *name* a pod (namespace, name, UID); every decision reads the pod
from here. `resolve` answers from the watch cache, matched by UID. The cache can lag the API server by a
watch delivery (kube-scheduler filters a pod as soon as its own informer saw it), so on a miss it asks the
API server once (GET), bounded: `max_lookups` at a time, each within `lookup_timeout_s`, and a UID the API
server did not know is remembered (a UID is never reused), so forged names cost the API server at most one
read each. What the GET returns is used for that decision only; the cache stays the watch's.

Refusals are `PodRefused` with the reason (and whether a retry may help).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.pod import pod_key
from gpupool.cluster.port import ApiError, ClusterPort, NotFound, Obj

# Kubernetes limits (apimachinery validation): namespace is a DNS label, a pod name a DNS subdomain.
MAX_NAMESPACE = 63
MAX_NAME = 253
MAX_UID = 128  # UIDs are 36-character UUIDs; leave room, refuse anything absurd
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
UNKNOWN_UIDS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class PodRef:
    """What a request says about its pod. Nothing else in a request body is believed."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        """The reference a (caller's) pod object carries; its other fields are ignored."""
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            meta = {}
        return cls(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""))

    def problem(self) -> str | None:
        """Why this cannot name a Kubernetes pod (checked before any lookup), or None."""
        if not self.uid:
            return "the request names no pod UID"
        if len(self.uid) > MAX_UID or not self.uid.isprintable():
            return "the request's pod UID is not a Kubernetes UID"
        if not (0 < len(self.namespace) <= MAX_NAMESPACE and _DNS.match(self.namespace)):
            return "the request's pod namespace is not a valid namespace name"
        if not (0 < len(self.name) <= MAX_NAME and _DNS.match(self.name)):
            return "the request's pod name is not a valid pod name"
        return None

    def short(self) -> str:
        """For messages: bounded, whatever the caller sent."""
        text = f"{self.namespace}/{self.name}"
        return text if len(text) <= 80 else text[:77] + "..."


class PodRefused(Exception):
    """The request's pod cannot be decided for; the message says why. `retry` when it may be transient
    (the pod may simply not be visible yet)."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


def _slim(pod: Mapping[str, Any]) -> Obj:
    """What decisions read of a pod (managedFields can be most of an object's size)."""
    meta = pod.get("metadata") or {}
    if "managedFields" not in meta:
        return dict(pod)
    return {**pod, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


class PodCache:
    """Pods by UID as the pod watch shows them (fed by gpupool.scheduler.watch)."""

    def __init__(self, cluster: ClusterPort, lookup_timeout_s: float = 2.0, max_lookups: int = 8) -> None:
        self.cluster = cluster
        self.lookup_timeout_s = lookup_timeout_s
        self._lookups = asyncio.Semaphore(max_lookups)
        self._by_uid: dict[str, Obj] = {}
        self._unknown: OrderedDict[str, None] = OrderedDict()  # UIDs the API server did not know
        self.fetches = 0  # GETs made on cache misses (tests and metrics read it)

    def __len__(self) -> int:
        return len(self._by_uid)

    # --- fed by the watch -----------------------------------------------------------------------------

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._by_uid = {}
        for p in pods:
            self.apply("ADDED", p)

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if event_type == "DELETED":
            self._by_uid.pop(uid, None)
        else:
            self._by_uid[uid] = _slim(pod)

    def get(self, uid: str) -> Obj | None:
        return self._by_uid.get(uid)

    # --- lookups for decisions ------------------------------------------------------------------------

    async def resolve(self, ref: PodRef) -> Obj:
        """The pod `ref` names, as the API shows it: from the cache by UID, else one bounded GET.
        Raises PodRefused (no such pod, UID of another pod, a re-created pod, an invalid reference)."""
        problem = ref.problem()
        if problem is not None:
            raise PodRefused(problem)
        pod = self._by_uid.get(ref.uid)
        if pod is not None:
            if pod_key(pod) != ref.key:
                raise PodRefused(f"UID {ref.uid} belongs to pod {pod_key(pod)}, not {ref.short()}")
            return pod
        if ref.uid in self._unknown:
            raise PodRefused(f"pod {ref.short()} does not exist")
        return await self.fetch(ref)

    async def fetch(self, ref: PodRef) -> Obj:
        """Read the pod from the API server (bounded), checking that it is still the one `ref` names."""
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                async with self._lookups:
                    self.fetches += 1
                    pod = await self.cluster.get_pod(ref.namespace, ref.name)
        except TimeoutError:
            raise PodRefused(f"pod {ref.short()} is not in the scheduler's cache yet and the API server did not "
                             "answer in time; retry", retry=True) from None
        except NotFound:
            self._remember_unknown(ref.uid)
            raise PodRefused(f"pod {ref.short()} does not exist") from None
        except ApiError as e:
            raise PodRefused(f"pod {ref.short()} could not be read: {e}", retry=True) from None
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if uid != ref.uid:
            self._remember_unknown(ref.uid)
            raise PodRefused(f"pod {ref.short()} was re-created (UID {uid}, the request is for {ref.uid})")
        return pod

    def _remember_unknown(self, uid: str) -> None:
        if uid in self._by_uid:  # the watch delivered it meanwhile: it exists
            return
        self._unknown[uid] = None
        self._unknown.move_to_end(uid)
        while len(self._unknown) > UNKNOWN_UIDS_KEPT:
            self._unknown.popitem(last=False)
