"""Eviction on the embedded cluster (the same checks run on the real API server in tests/e2e)."""

from gpupool.cluster.memory import MemoryCluster
from tests.cluster.eviction_contract import check_eviction


async def test_eviction_honours_disruption_budgets() -> None:
    cluster = MemoryCluster()
    try:
        await check_eviction(cluster, "default")
    finally:
        await cluster.close()
