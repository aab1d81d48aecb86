"""Prometheus metrics of the scheduler service. The registry is injected so that tests, the demo and a
later exporter can each own theirs (or share one)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpupool_extender_requests", "Extender HTTP requests by verb and status code", ["verb", "code"], registry=r
        )
        self.latency = Histogram(
            "gpupool_extender_request_duration_seconds",
            "Time to answer an extender request",
            ["verb"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.binds = Counter("gpupool_binds", "Bind outcomes", ["result"], registry=r)
        self.conflicts = Counter(
            "gpupool_api_conflicts", "409 answers from the API server, by what was written", ["object"], registry=r
        )
        self.forgotten = Counter(
            "gpupool_assumed_forgotten", "Assumed allocations dropped (bind failed or not confirmed)", registry=r
        )
        self.ledger_entries = Gauge("gpupool_ledger_entries", "Ledger entries by state", ["state"], registry=r)
        self.gpus = Gauge("gpupool_gpus", "GPUs known to the scheduler", registry=r)
        self.ready = Gauge("gpupool_scheduler_ready", "1 when the cache is synced and this replica leads", registry=r)
        self.refused = Counter(
            "gpupool_extender_refused",
            "Extender requests refused before any decision (no such pod, not gpupool's, invalid request), by verb",
            ["verb"], registry=r,
        )

    def track_ledger(self, assumed: Callable[[], int], confirmed: Callable[[], int], gpus: Callable[[], int]) -> None:
        """Read the ledger sizes at scrape time (no bookkeeping on the hot path)."""
        self.ledger_entries.labels("assumed").set_function(assumed)
        self.ledger_entries.labels("confirmed").set_function(confirmed)
        self.gpus.set_function(gpus)
