"""The leader's background beat (gpupool.scheduler.beat): runs only when due, and outlives expected errors."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.cluster.port import ApiError
from gpupool.scheduler.beat import Beat


async def test_a_beat_runs_when_due_and_goes_on_after_an_expected_error(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    due = [False]

    async def once() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ApiError("the API server is restarting")

    beat = Beat("test", 0.0, lambda: due[0], once, (ApiError,), "round not done")
    beat.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert calls == [] and beat.running  # not due: never called
    due[0] = True
    while len(calls) < 3:
        await asyncio.sleep(0)
    await beat.stop()
    assert not beat.running
    assert "round not done" in caplog.text and "the API server is restarting" in caplog.text
