"""The allocation and inventory annotations: round trips, and errors that name the field."""

import pytest

from gpupool.api.allocation import AllocationError, decode_allocation, encode_allocation
from gpupool.api.inventory import InventoryError, decode_inventory, encode_inventory, node_from_object
from gpupool.core.model import GPU, Allocation, GPUGrant


def test_allocation_round_trip() -> None:
    alloc = Allocation("team/p", "n1", (GPUGrant("GPU-a", 3, 300, 8192),), "gpupool")
    doc = decode_allocation(encode_allocation(alloc, "uid-1", "mps", "2026-11-21T06:00:00Z"))
    assert doc.pod_uid == "uid-1" and doc.gpus[0].cores == 30.0  # 300 milli = 30 %
    assert doc.allocation("team/p") == alloc


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "invalid gpupool.io/allocation at document"),
        ('{"version": 3, "pod_uid": "u", "node": "n", "gpus": []}', "at version"),
        ('{"pod_uid": "u", "node": "n", "gpus": [{"uuid": "g", "index": 0, "memory_mib": 1, "cores": 150}]}',
         "at gpus.0.cores"),
    ],
)
def test_bad_allocation_names_the_field(text: str, fragment: str) -> None:
    with pytest.raises(AllocationError, match=fragment.replace(".", r"\.")):
        decode_allocation(text)


def test_inventory_to_node() -> None:
    gpus = [GPU("GPU-0", 0, "H100", 81_559, sm_count=132, nvlink_peers=(1,)),
            GPU("GPU-1", 1, "H100", 81_559, sm_count=132, nvlink_peers=(0,))]
    text = encode_inventory("n1", gpus, split=10, extra={0: {"pci_bus_id": "0000:3b:00.0"}})
    node = node_from_object({"metadata": {"name": "n1", "annotations": {"gpupool.io/inventory": text}},
                             "status": {"allocatable": {"cpu": "96", "memory": "512Gi"}}})
    assert node is not None and node.cpu_milli == 96_000 and node.memory_mib == 524_288
    assert node.gpus == tuple(gpus)
    assert node_from_object({"metadata": {"name": "cpu-only"}}) is None  # not a gpupool node


def test_bad_inventory_names_the_problem() -> None:
    with pytest.raises(InventoryError, match=r"at gpus\.0\.memory_mib"):
        decode_inventory('{"node": "n", "gpus": [{"uuid": "u", "index": 0, "model": "T4", "memory_mib": 0}]}')
    gap = ('{"node": "n", "gpus": [{"uuid": "a", "index": 0, "model": "T4", "memory_mib": 1},'
           ' {"uuid": "b", "index": 2, "model": "T4", "memory_mib": 1}]}')
    with pytest.raises(InventoryError, match=r"indices \[0, 2\] must be 0\.\.1"):
        decode_inventory(gap)
