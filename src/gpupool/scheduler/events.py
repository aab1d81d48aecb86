"""Events the scheduler writes about pods (FailedBinding, Preempted, Preempting, ...): best effort, never
failing the decision they describe."""

from __future__ import annotations

import logging

from gpupool.api.times import format_time
from gpupool.cluster.port import Obj
from gpupool.scheduler.framework.interface import Handle

log = logging.getLogger(__name__)


async def pod_event(handle: Handle, namespace: str, name: str, uid: str, reason: str, message: str,
                    type_: str) -> None:
    """Record `reason: message` on the pod (the caller bounds and escapes the message)."""
    now = format_time(handle.clock())
    event: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": handle.config.scheduler_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await handle.cluster.create_event(event)
    except Exception as e:  # events are best effort
        log.debug("event %s for %s/%s not written: %s", reason, namespace, name, e)
