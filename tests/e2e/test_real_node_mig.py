"""Isolation mig on a real node: the scheduler plans the instance from the agent's inventory, the real
kubelet 1.20 calls the agent's Allocate, the agent carves the instance (fake MIG driver: same geometry and
answers as NVML) and the container receives exactly that MIG device; the pod's deletion makes the instance
idle again in the inventory."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.inventory import MigInstanceDoc, decode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY, ANN_ISOLATION, ANN_MIG_PROFILE
from tests.e2e.real_node_fixtures import (
    RealCluster,
    no_pods_left,  # noqa: F401  (autouse: each test leaves empty nodes)
    real_cluster,  # noqa: F401  (module fixture)
    share_pod,
    wait_for,
)

pytestmark = pytest.mark.e2e

MIG_GPUS = {0: (2,)}  # node 0's GPU 2 is an A100-80GB in MIG mode


def mig_instances(c: RealCluster, gpu: str) -> list[MigInstanceDoc] | None:
    node = c.node_obj(0) or {}
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_INVENTORY)
    if not text:
        return None
    doc = next(g for g in decode_inventory(text).gpus if g.uuid == gpu)
    return doc.mig_instances if doc.mig else None


def test_mig_pod_gets_the_instance_the_scheduler_planned_and_the_agent_carved(
    real_cluster: RealCluster,  # noqa: F811
) -> None:
    c = real_cluster
    gpu = c.agent(0).gpu_uuids[2]
    wait_for(lambda: mig_instances(c, gpu) == [], 60, "the MIG GPU in the inventory, no instances")
    annotations = {ANN_ISOLATION: "mig", ANN_MIG_PROFILE: "3g.40gb"}
    c.apply([share_pod("mig-a", c.node(0).name, None, None, annotations=annotations)])
    running: dict[str, Any] = c.wait_running(["mig-a"])[0]
    (grant,) = decode_allocation(running["metadata"]["annotations"][ANN_ALLOCATION]).gpus
    assert grant.uuid == gpu and grant.mig is not None and grant.mig.profile == "3g.40gb"
    # the agent reports the instance it carved where the scheduler planned it, held by the pod
    planned = (grant.mig.profile, grant.mig.start, True)
    instances = wait_for(lambda: (found := mig_instances(c, gpu)) and [(i.profile, i.start, i.used) for i in found]
                         == [planned] and found, 30, "the carved instance in the inventory",
                         lambda: str(mig_instances(c, gpu)))
    mig_uuid = instances[0].uuid
    env, mounts = c.grant("mig-a")
    assert mig_uuid.startswith("MIG-") and env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
    assert (env["GPUPOOL_ISOLATION"], env["GPUPOOL_MIG_PROFILE"]) == ("mig", "3g.40gb")
    assert not mounts and not any(k.startswith("CUDA_MPS") for k in env)  # hardware isolation: no hook, no MPS
    c.delete_pods(["mig-a"])
    c.wait_pods_gone()
    idle = [MigInstanceDoc(profile="3g.40gb", start=grant.mig.start, used=False, uuid=mig_uuid)]
    wait_for(lambda: mig_instances(c, gpu) == idle, 30, "the instance idle again", lambda: str(mig_instances(c, gpu)))
