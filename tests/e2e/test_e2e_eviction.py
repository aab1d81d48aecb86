"""Eviction through the `kube` adapter on the real API server: the same contract as the embedded cluster,
with the budgets' status written by kube-controller-manager's disruption controller."""

import pytest

from gpupool.cluster.kube import KubeCluster
from tests.cluster.eviction_contract import check_eviction
from tests.harness import fleet

pytestmark = pytest.mark.e2e


async def test_eviction_honours_disruption_budgets(kube: KubeCluster, api: fleet.KubeApi) -> None:
    await api.ensure_namespace("e2e-eviction")
    await check_eviction(kube, "e2e-eviction", controller=True)
