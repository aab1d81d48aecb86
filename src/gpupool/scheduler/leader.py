"""Leader election on a coordination.k8s.io/v1 Lease, the way Kubernetes components do it.

The holder renews `spec.renewTime` every `retry_period`; another candidate takes the lease only after
`renewTime + leaseDurationSeconds` has passed. Every write carries the Lease's resourceVersion, so two
candidates can never both win a round (the loser gets 409). A leader that could not renew within
`renew_deadline` steps down by itself before anyone else may take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from gpupool.cluster.port import ApiError, ClusterPort, Conflict, NotFound, Obj

log = logging.getLogger(__name__)

Callback = Callable[[], Awaitable[None]]


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> float:
    if not text:
        return 0.0
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return 0.0


class LeaderElector:
    def __init__(
        self,
        cluster: ClusterPort,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        on_started: Callback | None = None,
        on_stopped: Callback | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock = clock
        self.on_started, self.on_stopped = on_started, on_stopped
        self.is_leader = False
        self._last_renew = 0.0

    async def _set_leader(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        log.info("%s %s leadership of lease %s/%s", self.identity, "acquired" if leading else "lost",
                 self.namespace, self.name)
        callback = self.on_started if leading else self.on_stopped
        if callback is not None:
            await callback()

    def _spec(self, now: float, acquire: float, transitions: int) -> Obj:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration_s)),
            "acquireTime": micro_time(acquire),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round; returns whether this candidate leads afterwards."""
        now = self.clock()
        try:
            lease = await self.cluster.get_lease(self.namespace, self.name)
        except NotFound:
            try:
                await self.cluster.create_lease({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0),
                })
            except ApiError:
                return await self._renew_failed(now)
            self._last_renew = now
            await self._set_leader(True)
            return True
        except ApiError:
            return await self._renew_failed(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        expires = parse_micro_time(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and now < expires:
            await self._set_leader(False)
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = parse_micro_time(spec.get("acquireTime")) if holder == self.identity else now
        if holder != self.identity:
            transitions += 1
        lease["spec"] = self._spec(now, acquire, transitions)
        try:
            await self.cluster.replace_lease(lease)
        except Conflict:
            await self._set_leader(False)  # someone else wrote first: re-read next round
            return False
        except ApiError:
            return await self._renew_failed(now)
        self._last_renew = now
        await self._set_leader(True)
        return True

    async def _renew_failed(self, now: float) -> bool:
        if self.is_leader and now - self._last_renew > self.renew_deadline_s:
            await self._set_leader(False)
        return self.is_leader

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.try_acquire_or_renew()
                except Exception as e:  # keep campaigning
                    log.warning("leader election round failed: %s", e)
                await asyncio.sleep(self.retry_period_s)
        finally:
            with contextlib.suppress(Exception):
                await self._set_leader(False)
