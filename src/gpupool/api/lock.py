"""The node bind lock: node annotation `gpupool.io/bind-lock`, JSON.

The kubelet's device-plugin Allocate call does not say which pod it serves. The scheduler therefore
takes this lock on the node *before* it binds a GPU pod there, naming the pod; the node agent reads the
lock in Allocate to find the pod (and its `gpupool.io/allocation`), then removes the lock. At most one
pod per node is between bind and Allocate at any time.

Example: {"version": 1, "pod_uid": "5f0c…", "namespace": "default", "name": "train-0",
          "time": "2026-11-21T06:00:00Z"}

Rules (writers use a resourceVersion precondition on the node; a 409 means re-read and decide again):
- absent -> the scheduler may take it;
- held by the same pod UID -> already taken (a replayed bind is idempotent);
- held by another pod -> the scheduler may take it over only when it is older than the lock timeout, or
  the holder pod no longer exists (or has another UID), or the holder is Running/Succeeded/Failed
  (its Allocate already happened); otherwise the bind waits briefly, then fails and is retried;
- the agent removes it after Allocate (only if it still names the pod it served); the scheduler removes
  it when a bind fails after taking it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpupool.api.errors import first_problem

ANN_BIND_LOCK = "gpupool.io/bind-lock"
LOCK_VERSION: Final = 1


class LockError(ValueError):
    pass


class BindLock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: Literal[1] = LOCK_VERSION
    pod_uid: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    time: str  # RFC 3339 UTC, when the scheduler took the lock

    def taken_at(self) -> float:
        """Seconds since the epoch (0.0 when the time cannot be read: treated as very old)."""
        try:
            return datetime.strptime(self.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return 0.0


def format_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_lock(pod_uid: str, namespace: str, name: str, now: float) -> str:
    return BindLock(pod_uid=pod_uid, namespace=namespace, name=name, time=format_time(now)).model_dump_json()


def decode_lock(text: str) -> BindLock:
    try:
        return BindLock.model_validate_json(text)
    except ValidationError as e:
        raise LockError(first_problem(ANN_BIND_LOCK, e)) from None
