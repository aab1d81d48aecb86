"""AMD partitions and Ascend vNPUs in the DRA contract (gpupool.api.dra): the devices a card in partition mode is
published as, their counters against core.partitions' layouts, their names read back, the profile selector
gpupool places, and what a claim of one counts in the ledger."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.dra import (
    DRIVER,
    SliceDevice,
    claim_asks,
    claim_shares,
    counted_claim,
    mig_device,
    mig_device_name,
    resource_slices,
)
from gpupool.core.mig import PlacedInstance
from gpupool.core.model import GPU, MigSlot, Node
from gpupool.core.partitions import MODELS, layout_problems
from gpupool.core.state import ClusterState

MI300X_MIB = 196_592  # what AMD SMI reports for a 192 GiB card
CARD_MIB = {"MI300X": MI300X_MIB, "MI325X": 262_128, "Ascend910B": 65_536, "Ascend310P": 24_576,
            "Ascend910B2": 65_536, "Ascend910B3": 65_536, "Ascend910B4": 32_768}
MIG_CLASS = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "mig"}}}]


def _slices(model: str, index: int = 0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    d = SliceDevice(index, f"{model}-uuid", model, CARD_MIB[model], mig_mode=True)
    devices_slices = resource_slices("n1", "uid", [d], "", 0)
    devices = [x for s in devices_slices for x in s["spec"].get("devices", [])]
    (counter_set,) = [c for s in devices_slices for c in s["spec"].get("sharedCounters", [])]
    return devices, {k: int(v["value"]) for k, v in counter_set["counters"].items()}


def test_an_mi300x_in_partition_mode_is_its_27_placements_with_one_counter_per_xcc() -> None:
    devices, counters = _slices("MI300X", index=2)
    assert counters == {f"xcc-{k}": 1 for k in range(8)}
    assert len(devices) == 8 + 8 + 4 + 4 + 2 + 1 and all(d["name"] != "gpu-2" for d in devices)
    qpx = next(d for d in devices if d["name"] == "gpu-2-qpx-nps4-4")
    assert qpx["attributes"]["type"] == {"string": "mig"}
    assert (qpx["attributes"]["profile"], qpx["attributes"]["migStart"], qpx["attributes"]["vendor"]) == (
        {"string": "QPX/NPS4"}, {"int": 4}, {"string": "amd"})
    # 76 of 304 CUs = 25 %; 196,592 MiB x 49,152 / 196,608 = 49,148 MiB
    assert qpx["capacity"] == {"memory": {"value": "49148Mi"}, "cores": {"value": "25"}}
    assert qpx["consumesCounters"] == [{"counterSet": "gpu-2-mig", "counters": {
        "xcc-4": {"value": "1"}, "xcc-5": {"value": "1"}}}]
    assert "allowMultipleAllocations" not in qpx  # one claim per partition


def test_an_amd_card_with_a_partition_held_publishes_only_its_mode() -> None:
    held = SliceDevice(0, "A-0", "MI300X", MI300X_MIB, mig_mode=True, mode_in_use="CPX/NPS4")
    (devices_slice, _) = resource_slices("n1", "uid", [held], "", 0)
    assert [d["name"] for d in devices_slice["spec"]["devices"]] == [f"gpu-0-cpx-nps4-{k}" for k in range(8)]


def test_ascend_cards_publish_every_template_at_every_vnpu_index() -> None:
    devices, counters = _slices("Ascend910B")
    assert counters == {"aicore": 30, **{f"vnpu-{k}": 1 for k in range(15)}}
    assert len(devices) == 4 * 15
    vir08 = next(d for d in devices if d["name"] == "gpu-0-vir08-3")
    assert vir08["consumesCounters"][0]["counters"] == {"aicore": {"value": "8"}, "vnpu-3": {"value": "1"}}
    # 8 of 30 AI Cores: 266 milli -> 26 %; 65,536 MiB x 17,476 / 65,536 = 17,476 MiB
    assert vir08["capacity"] == {"memory": {"value": "17476Mi"}, "cores": {"value": "26"}}
    small, counters310 = _slices("Ascend310P")
    assert counters310 == {"aicore": 8, "aicpu": 7, "vgroup-halves": 8, **{f"vnpu-{k}": 1 for k in range(7)}}
    vir01 = next(d for d in small if d["name"] == "gpu-0-vir01-6")
    assert vir01["consumesCounters"][0]["counters"] == {"aicore": {"value": "1"}, "vnpu-6": {"value": "1"},
                                                        "aicpu": {"value": "1"}, "vgroup-halves": {"value": "1"}}
    assert "gpu-0-vir02-1c-0" in {d["name"] for d in small}


def _fits(counters: dict[str, int], chosen: list[dict[str, Any]]) -> bool:
    left = dict(counters)
    for d in chosen:
        for k, v in d["consumesCounters"][0]["counters"].items():
            left[k] -= int(v["value"])
    return all(v >= 0 for v in left.values())


@pytest.mark.parametrize("model", sorted(MODELS))
@settings(max_examples=300)
@given(data=st.data())
def test_partitions_whose_counters_fit_are_the_valid_layouts(model: str, data: st.DataObject) -> None:
    """Any set of devices whose counters fit is one kube-scheduler's allocator may hand out. On Ascend that is
    exactly a valid vNPU layout of core.partitions. On AMD the counters hold the XCC geometry only: a set that
    fits is valid but for mixing modes (which the agent refuses at prepare while another mode is in use)."""
    devices, counters = _slices(model)
    chosen = data.draw(st.lists(st.sampled_from(devices), min_size=1, max_size=16, unique_by=lambda d: d["name"]))
    layout = [PlacedInstance(d["attributes"]["profile"]["string"], d["attributes"]["migStart"]["int"])
              for d in chosen]
    problems = layout_problems(MODELS[model], layout)
    if MODELS[model].kind == "xcp":
        problems = [p for p in problems if "one partition mode at a time" not in p]
    assert _fits(counters, chosen) == (not problems), (layout, problems)


@pytest.mark.parametrize("model", ["Ascend910B", "Ascend310P"])
def test_every_maximal_vnpu_layout_fits_the_counters(model: str) -> None:
    from gpupool.core.partitions import maximal_layouts

    devices, counters = _slices(model)
    by_name = {d["name"]: d for d in devices}
    for lay in maximal_layouts(model):
        chosen = [by_name[mig_device_name(0, i.profile, i.start)] for i in lay]
        assert _fits(counters, chosen), lay


@pytest.mark.parametrize(("profile", "name"), [("CPX/NPS4", "gpu-3-cpx-nps4-5"), ("SPX/NPS1", "gpu-3-spx-nps1-5"),
                                               ("vir08", "gpu-3-vir08-5"), ("vir04_3c", "gpu-3-vir04-3c-5")])
def test_partition_names_read_back(profile: str, name: str) -> None:
    assert mig_device_name(3, profile, 5) == name
    assert mig_device(name) == (3, MigSlot(profile, 5))


def test_every_vendor_profile_has_a_name_that_reads_back() -> None:
    for m in MODELS.values():
        for p in m.profiles:
            assert mig_device(mig_device_name(12, p.name, 14)) == (12, MigSlot(p.name, 14))
    with pytest.raises(ValueError, match="has no device name"):
        mig_device_name(0, "XPX/NPS1", 0)


@pytest.mark.parametrize("profile", ["CPX/NPS4", "vir08", "vir02_1c"])
def test_a_claim_naming_a_vendor_profile_is_placed_by_gpupool(profile: str) -> None:
    selector = {"cel": {"expression": f'device.attributes["gpu.gpupool.io"].profile == "{profile}"'}}
    request = {"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.gpupool.io", "selectors": [selector]}}
    claim = {"metadata": {"namespace": "ns", "name": "c"}, "spec": {"devices": {"requests": [request]}}}
    (ask,) = claim_asks(claim, {"mig.gpu.gpupool.io": "mig"})
    assert ask.mig_profile == profile


def test_a_vendor_partition_claim_counts_its_share_of_the_card() -> None:
    claim = {"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1-cpx-nps4-3"}],
        "config": MIG_CLASS}}}}
    assert claim_shares(claim).devices[0].mig == MigSlot("CPX/NPS4", 3)
    gpus = tuple(GPU(f"A-{i}", i, "MI300X", MI300X_MIB) for i in range(2))
    (counted,) = counted_claim(claim, ClusterState([Node("n1", 64_000, 256_000, gpus)]))
    (grant,) = counted.allocation.grants
    # 38 of 304 CUs: 1000 x 38 // 304 = 125 milli; 196,592 MiB // 8 = 24,574 MiB (not the whole card)
    assert (grant.uuid, grant.milli, grant.memory_mib, grant.mig) == ("A-1", 125, 24_574, MigSlot("CPX/NPS4", 3))
