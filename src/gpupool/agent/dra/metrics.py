"""gpupool_dra_* metrics of the DRA driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpupool.agent.dra.driver import DraDriver


class DraCollector(Collector):
    """gpupool_dra_* on the agent's /metrics (where the agent is a DRA driver)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def collect(self) -> Iterator[Any]:
        d = self.driver
        yield GaugeMetricFamily("gpupool_dra_claims_prepared", "Claims prepared on this node now",
                                value=len(d.prepared))
        summary = SummaryMetricFamily("gpupool_dra_prepare_seconds",
                                      "NodePrepareResources per claim: read, grant, CDI spec, checkpoint")
        summary.samples.extend([Sample("gpupool_dra_prepare_seconds_count", {}, d.prepare_count),
                                Sample("gpupool_dra_prepare_seconds_sum", {}, d.prepare_seconds)])
        yield summary
        yield CounterMetricFamily("gpupool_dra_prepare_errors", "Claims whose preparation failed (kubelet retries)",
                                  value=d.prepare_errors)
