"""MIG pods through the real kube-scheduler 1.20 with the gpupool extender: a node whose inventory marks
GPU 0 (an A100-40GB) in MIG mode with a used 3g.20gb at slices 0-3, beside a plain node. MIG pods go to
that GPU on disjoint slices, recorded in their grants; share pods never do."""

from __future__ import annotations

import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from tests.e2e.conftest import Extender
from tests.e2e.test_e2e_scheduling import _create_all, _wait_bound
from tests.harness import fleet

pytestmark = pytest.mark.e2e

MIG_NODE, PLAIN_NODE = "e2e-mig-0", "e2e-mig-1"


def _mig_node(group: dict[str, str]) -> dict:
    node = fleet.gpu_node(MIG_NODE, gpus=2, model="A100-40GB", memory_mib=40960, labels=group)
    gpus = fleet.fake_gpus(MIG_NODE, 2, "A100-40GB", 40960)
    extra = {0: {"mig": True, "mig_instances": [{"profile": "3g.20gb", "start": 0, "used": True, "uuid": "MIG-x"}]}}
    node["metadata"]["annotations"][ANN_INVENTORY] = encode_inventory(MIG_NODE, gpus, 10, driver="570.86",
                                                                      cuda="12.8", extra=extra)
    return node


async def test_mig_pods_get_disjoint_instances_and_shares_stay_off_mig_gpus(
    api: fleet.KubeApi, extender: Extender, kube_scheduler: object
) -> None:
    ns, group = "e2e-mig", {"e2e/group": "mig"}
    await api.ensure_namespace(ns)
    nodes = [_mig_node(group), fleet.gpu_node(PLAIN_NODE, gpus=2, model="A100-40GB", memory_mib=40960, labels=group)]
    await fleet.create_nodes(api, nodes)
    # Slices 4-7 are free. "two" (25 % of the compute: 2/7 = 28.6 % is the smallest that holds it) gets
    # 2g.10gb at 4, the only 2g start left (2g starts at 0, 2 or 4); then "one" (4000 MiB: 1g.5gb, the
    # smallest by memory) gets slice 6 (1g.5gb starts at 0-6; 4-5 are the 2g's even before any agent
    # reports that instance). Created one after the other: with no demand observed yet, a 1g first would
    # take slice 4 and leave no 2g start.
    mig = {"gpupool.io/isolation": "mig"}
    two = fleet.share_pod("two", ns, memory_mib=None, cores=25, annotations=mig, node_selector=group)
    one = fleet.share_pod("one", ns, memory_mib=4000, cores=None, annotations=mig, node_selector=group)
    shares = [fleet.share_pod(f"share-{i}", ns, memory_mib=4096, cores=20, node_selector=group) for i in range(6)]
    async with fleet.StatusKubelet(api, nodes={n["metadata"]["name"] for n in nodes}, namespace=ns) as kubelet:
        await _create_all(api, [two])
        await _wait_bound(api, ns, 1, timeout_s=120)
        await _create_all(api, [one, *shares])
        bound = await _wait_bound(api, ns, 2 + len(shares), timeout_s=240)
        assert kubelet.failures == {}
    grants = {p["metadata"]["name"]: (p["spec"]["nodeName"],
                                      decode_allocation(p["metadata"]["annotations"][ANN_ALLOCATION]).gpus[0])
              for p in bound}
    for name, profile, start in (("two", "2g.10gb", 4), ("one", "1g.5gb", 6)):
        node, grant = grants[name]
        assert (node, grant.index) == (MIG_NODE, 0)
        assert grant.mig is not None and (grant.mig.profile, grant.mig.start) == (profile, start)
    for k in range(6):
        node, grant = grants[f"share-{k}"]
        assert grant.mig is None and (node, grant.index) != (MIG_NODE, 0)
    ledger = extender.ledger()
    assert ledger["diff"] == {"missing": [], "extra": [], "different": [], "overcommitted": []}
