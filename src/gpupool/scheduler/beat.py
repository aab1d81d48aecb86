"""A leader's background task on a beat: `once` every `interval_s` while `due()`; an error of the kinds it
expects is logged and the next beat tries again (the API may be briefly unreachable; a task that died on it
would stop the work for good without anyone noticing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Beat:
    def __init__(self, name: str, interval_s: float, due: Callable[[], bool], once: Callable[[], Awaitable[object]],
                 expected: tuple[type[Exception], ...], failed: str) -> None:
        self.name, self.interval_s, self.due, self.once = name, interval_s, due, once
        self.expected, self.failed = expected, failed  # `failed`: what the log line says was not done
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.due():
                continue
            try:
                await self.once()
            except self.expected as e:
                log.warning("%s: %s", self.failed, e)
