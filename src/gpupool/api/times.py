"""Times as gpupool writes them into annotations and Events: RFC 3339, UTC, whole seconds."""

from __future__ import annotations

from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime(_FORMAT)


def parse_time(text: str) -> float:
    """Seconds since the epoch; 0.0 when `text` cannot be read (callers treat that as very old)."""
    try:
        return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
