"""The claim allocator writes allocations beside its next decisions (gpupool.scheduler.claims.MAX_WRITES):
the API round trips of a burst overlap, the decisions stay one at a time against the ledger (a burst still
packs exactly), and a write the API refuses gives its room back and leaves the pod gated with the reason."""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.cluster.port import RESOURCE_CLAIMS, ApiError
from gpupool.scheduler import claims as claims_module
from tests.scheduler.test_claim_allocator import (
    NS,
    burst_packs_two_per_gpu,
    claim,
    gated_pod,
    run,
    setup,
    ungated,
    until,
)


async def test_a_bursts_writes_overlap_and_it_still_packs_each_gpu_exactly() -> None:
    cluster, svc = await setup()
    inner = cluster.patch_object
    at_once, most = 0, 0

    async def slow_patch(*args: Any, **kw: Any) -> Any:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        try:
            await asyncio.sleep(0.05)  # an API server's round trip
            return await inner(*args, **kw)
        finally:
            at_once -= 1

    cluster.patch_object = slow_patch  # type: ignore[method-assign]
    try:
        await burst_packs_two_per_gpu(cluster)
        assert 1 < most <= claims_module.MAX_WRITES
    finally:
        await svc.stop()


async def test_a_refused_write_gives_the_room_back_and_the_pod_waits_with_the_reason() -> None:
    cluster, svc = await setup()
    inner = cluster.patch_object
    refused: list[str] = []

    async def refusing(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if kind == RESOURCE_CLAIMS and kw.get("subresource") == "status" and not refused:
            refused.append(name)
            raise ApiError("the API server said no")
        return await inner(kind, name, patch, **kw)

    cluster.patch_object = refusing  # type: ignore[method-assign]
    try:
        await run(cluster, (claim("c0", "16Gi", "100"), gated_pod("p0", "c0")))

        async def told() -> list[str]:
            return [e["message"] for e in cluster.events
                    if e["involvedObject"]["name"] == "p0" and e["reason"] == "FailedScheduling"]

        (message,) = await until(told)
        assert message == "gpupool: claim team-dra/c0 could not be allocated: the API server said no"
        # a later pass places it (the refused write's room was given back: the ledger holds it once)
        await until(lambda: ungated(cluster, "p0"))
        stored = await cluster.get_object(RESOURCE_CLAIMS, "c0", NS)
        assert stored["status"]["allocation"] and refused == ["c0"]
        held = [e for e in svc.ledger.entries.values() if e.claim]
        assert len(held) == 1 and held[0].uid == stored["metadata"]["uid"]
    finally:
        await svc.stop()
