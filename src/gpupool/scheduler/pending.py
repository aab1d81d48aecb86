"""GPU pods that fit nowhere at their last filter, and why: what the pool views show as pending.

Only pods the scheduler found in its own cache get an entry (the key comes from the API's pod, never from
a request body), and the map is bounded three ways: at most `max_entries` pods (the oldest note goes
first), a key of at most MAX_KEY characters, and an entry not noted again within `ttl_s` expires
(kube-scheduler retries an unschedulable pod at least every five minutes, so a live pending pod is noted
again long before). A pod that is bound or deleted leaves at once (the pod watch says so).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping

MAX_KEY = 320  # namespace (63) + "/" + pod name (253), with room
MAX_WHY = 1024


class PendingPods(Mapping[str, tuple[str, float]]):
    """key (namespace/name) -> (why it fits nowhere, since when). Reading it drops expired entries."""

    def __init__(self, clock: Callable[[], float], max_entries: int = 10_000, ttl_s: float = 900.0) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        # key -> (why, since, last noted); ordered by last note, oldest first
        self._entries: OrderedDict[str, tuple[str, float, float]] = OrderedDict()

    def note(self, key: str, why: str) -> None:
        now = self.clock()
        key, why = key[:MAX_KEY], why[:MAX_WHY]
        old = self._entries.pop(key, None)
        self._entries[key] = (why, old[1] if old is not None else now, now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        self._entries.pop(key[:MAX_KEY], None)

    def expire(self) -> int:
        """Drop entries not noted within ttl_s; returns how many went."""
        cutoff = self.clock() - self.ttl_s
        gone = 0
        while self._entries:
            key, (_, _, last) = next(iter(self._entries.items()))
            if last > cutoff:
                break
            del self._entries[key]
            gone += 1
        return gone

    def __getitem__(self, key: str) -> tuple[str, float]:
        self.expire()
        why, since, _ = self._entries[key]
        return why, since

    def __iter__(self) -> Iterator[str]:
        self.expire()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self.expire()
        return len(self._entries)
