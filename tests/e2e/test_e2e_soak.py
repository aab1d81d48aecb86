"""The soak's short schedule (benchmarks/soak.py, docs/e2e.md "Soak"): the chart's own pods on two real nodes,
share pods and claim pods churned throughout, and one fault of each cheap kind in turn (the agent pod of a
node deleted, the scheduler pod deleted, a webhook pod deleted, a node's kubelet restarted). After each fault
has settled and all the while: no GPU over its capacity (limits files on the nodes, the API's allocations),
the scheduler's ledger equal to the API, nothing stranded, no limits file or CDI spec without its pod, every
pending pod explained by an Event. Zero violations.

The fixtures are test_e2e_chart_pods.py's (one control plane that serves pods per machine).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.test_e2e_chart_pods import Cluster, chart_cluster

pytestmark = pytest.mark.e2e


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


soak = _soak()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with chart_cluster("sk", "gpupool-sk", install=True) as c:
        yield c


def test_a_short_soak_of_cheap_faults_has_no_violation(cluster: Cluster) -> None:
    kinds = soak.CHEAP_FAULTS
    # Short gaps and grace: four faults, each once (max_faults), the churn running throughout.
    result = soak.run(cluster, minutes=30, seed=7, kinds=kinds, gap_s=10, population=6, grace_s=60,
                      max_faults=len(kinds))
    line = result.line
    print(line)
    assert line["faults"] == len(kinds) and set(line["settle_s"]) == set(kinds), line
    assert line["pods"] > 0 and line["claims"] > 0, line  # both kinds of tenant were churned
    assert line["chart_pods"] is True
    assert result.violations == [], "\n".join(result.violations)
