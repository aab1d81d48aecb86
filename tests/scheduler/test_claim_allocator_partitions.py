"""gpupool's claim allocator placing AMD partitions (issue 40): a node whose agent reports its MI300X cards in
partition mode (inventory `mig: true` and their partitions, as for MIG) and publishes them as partitions
(api.dra.resource_slices); a claim naming `CPX/NPS4` gets a partition of the card that can take it, by the
MIG plugin with core.partitions, and the ledger holds the partition's share."""

from __future__ import annotations

import json

from gpupool.api.dra import DRIVER, SliceDevice, resource_slices
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.port import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.scheduler.test_claim_allocator import (
    MIG_CLASS,
    NS,
    allocation,
    device_class,
    gated_pod,
    mig_claim,
    reporting,
    run,
    setup,
    ungated,
    until,
)

MI300X_MIB = 196_592


async def test_a_cpx_claim_gets_the_card_not_held_in_another_mode() -> None:
    cluster, svc = await setup(gpu_mib=MI300X_MIB)
    try:
        node = await cluster.get_node("gpu-0000")
        doc = reporting(node, mig=True, model="MI300X", vendor="amd")
        # card 0 has a QPX/NPS1 partition in use: its mode is fixed until it ends; card 1 is idle
        inventory = json.loads(doc["metadata"]["annotations"][ANN_INVENTORY])
        inventory["gpus"][0]["mig_instances"] = [{"profile": "QPX/NPS1", "start": 0, "used": True, "uuid": "p0"}]
        await cluster.patch_node_annotations("gpu-0000", {ANN_INVENTORY: json.dumps(inventory)})

        async def known() -> bool:
            plugin = svc.claim_framework.plugin("mig_placement")
            return "gpu-0000" in plugin.layouts.nodes  # type: ignore[attr-defined]

        await until(known)
        cards = [SliceDevice(i, g["uuid"], "MI300X", MI300X_MIB, mig_mode=True)
                 for i, g in enumerate(inventory["gpus"])]
        await cluster.delete_object(RESOURCE_SLICES, f"gpu-0000-{DRIVER}")
        for s in resource_slices("gpu-0000", "uid", cards, "", 1):
            await cluster.create_object(RESOURCE_SLICES, s)
        await cluster.create_object(DEVICE_CLASSES, device_class(MIG_CLASS, "mig"))
        await run(cluster, (mig_claim("cpx", "CPX/NPS4"), gated_pod("p-cpx", "cpx")))
        await until(lambda: ungated(cluster, "p-cpx"))
        allocated = await allocation(cluster, "cpx")
        assert allocated is not None
        (result,) = allocated["devices"]["results"]
        assert (result["pool"], result["device"]) == ("gpu-0000", "gpu-1-cpx-nps4-0")
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "cpx", NS))["metadata"]["uid"]
        (grant,) = svc.ledger.entries[uid].allocation.grants
        # 38 of 304 CUs: 125 milli; 196,592 MiB // 8 = 24,574 MiB
        assert (grant.index, grant.milli, grant.memory_mib) == (1, 125, 24_574)
    finally:
        await svc.stop()
