"""What a plugin answers at an extension point, modelled on kube-scheduler's framework.Status.

Codes and what the framework does with each:

* SUCCESS — the plugin is satisfied; the next plugin runs.
* UNSCHEDULABLE — the pod does not fit (this node, or any node, now); it may fit later, e.g. once other
  pods leave. Filter: the node goes to the extender's `FailedNodes`. Reserve / Permit / Bind: the bind is
  refused with the reason and kube-scheduler retries the pod.
* UNSCHEDULABLE_AND_UNRESOLVABLE — it will not fit whatever happens to other pods: the request names a
  pod that does not exist or is not gpupool's, a node that does not exist or has no GPUs, or the pod's
  request is invalid. Filter: `FailedAndUnresolvableNodes` (a PostFilter such as preemption must not try
  to make room for it). Bind: refused with the reason.
* ERROR — something broke (the API server did not answer, an internal error); the reason is returned as
  the extender's `Error` and nothing of the cycle stays reserved.
* WAIT — Permit only: the pod must wait for another one (the node has a bound pod not yet
  allocated by its agent). The framework keeps the reservation, waits until the plugin's `wake` event fires
  or its back-off passes, and asks again, up to the plugin's wait limit; then the bind is UNSCHEDULABLE.
* SKIP — PreFilter: the plugin has nothing to do for this pod. From `gpu_request` it means the pod asks
  for no gpupool resource, and every plugin marked `gpu_only` is skipped at every later extension point.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""  # which plugin answered (set by the framework)
    # WAIT only: an event that fires when waiting may be over, and the longest pause before asking again.
    wake: asyncio.Event | None = None
    retry_after_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    @property
    def rejected(self) -> bool:
        """The pod does not fit (either unschedulable code)."""
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def by(self, plugin: str) -> Status:
        return self if self.plugin else Status(self.code, self.reason, plugin, self.wake, self.retry_after_s)


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(reason: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reason)


def unresolvable(reason: str) -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason)


def error(reason: str) -> Status:
    return Status(Code.ERROR, reason)


def wait(reason: str, wake: asyncio.Event | None = None, retry_after_s: float = 0.0) -> Status:
    return Status(Code.WAIT, reason, wake=wake, retry_after_s=retry_after_s)
