"""Waiting for the operator to stop a long-running command."""

from __future__ import annotations

import asyncio
import contextlib
import signal


async def until_stopped() -> None:
    """Return once SIGINT or SIGTERM arrives (Ctrl-C, or the kubelet stopping the container)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # loops without signal support: wait forever
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
