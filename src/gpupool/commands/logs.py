"""Logging for the long-running services (scheduler, agent, webhook): one format, to stderr."""

from __future__ import annotations

import logging
import sys

# The HTTP client libraries log every request at INFO: at a service's default level that is one line per API
# call (the agent lists its node's pods several times a second), which buries what the service says.
CHATTY = ("httpx", "httpx2", "httpcore", "httpcore2")


def configure(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
