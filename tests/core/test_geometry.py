"""gpupool.core.geometry: which geometry a card follows (by the catalogue's partitioning kind), what stands in the
way of a new partition per kind, and the share a vendor partition grants; the vendor_profile_for rule of
gpupool.core.mig_request beside it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.geometry import geometry, vendor_model, vendor_share
from gpupool.core.mig import PlacedInstance
from gpupool.core.mig_request import ProfileRefusal, vendor_profile_for
from gpupool.core.model import GPURequest
from gpupool.core.partitions import MODELS, layout_problems


@pytest.mark.parametrize(("model", "kind", "name"), [
    ("NVIDIA H100 80GB HBM3", "mig", "H100-80GB"),  # NVML's long name: the MIG tables know it
    ("AMD Instinct MI300X", "xcp", "MI300X"),  # an alias of the catalogue
    ("Ascend910B", "vnpu", "Ascend910B"),
    ("310P3", "vnpu", "Ascend310P"),
])
def test_one_place_names_each_cards_geometry(model: str, kind: str, name: str) -> None:
    g = geometry(model)
    assert g is not None and (g.kind, g.name) == (kind, name)


@pytest.mark.parametrize("model", ["MI210", "L4", "no such card"])
def test_cards_without_partitions_have_no_geometry(model: str) -> None:
    assert geometry(model) is None and vendor_model(model) is None


def test_what_stands_in_the_way_per_kind() -> None:
    mig, amd, ascend = geometry("A100-40GB"), geometry("MI300X"), geometry("Ascend910B")
    assert mig is not None and amd is not None and ascend is not None
    assert mig.in_the_way("3g.20gb", 4, "1g.5gb", 5) and not mig.in_the_way("3g.20gb", 4, "1g.5gb", 3)
    # AMD: another mode always (a mode change replaces every partition), the same mode only at the same start
    assert amd.in_the_way("CPX/NPS4", 5, "CPX/NPS1", 0) and amd.in_the_way("CPX/NPS4", 5, "CPX/NPS4", 5)
    assert not amd.in_the_way("CPX/NPS4", 5, "CPX/NPS4", 4)
    assert ascend.in_the_way("vir02", 3, "vir16", 3) and not ascend.in_the_way("vir02", 3, "vir16", 0)
    assert amd.starts("QPX/NPS4") == (0, 2, 4, 6) and ascend.starts("vir16") == tuple(range(15))
    assert amd.one_mode and not ascend.one_mode and not mig.one_mode


@given(st.lists(st.tuples(st.sampled_from([p.name for p in MODELS["Ascend310P"].profiles]),
                          st.integers(min_value=0, max_value=7)), max_size=8))
def test_a_vendor_geometrys_problems_are_core_partitions(layout: list[tuple[str, int]]) -> None:
    placed = [PlacedInstance(p, s) for p, s in layout]
    g = geometry("Ascend310P")
    assert g is not None and g.problems(placed) == layout_problems("Ascend310P", placed)


def test_a_vendor_partitions_share_is_of_the_card_as_reported() -> None:
    m = MODELS["MI300X"]
    dpx = m.profile("DPX/NPS1")
    assert dpx is not None
    # 152 of 304 CUs = 500 milli; 196,592 MiB (what AMD SMI reports) x 98,304 / 196,608 = 98,296 MiB
    assert vendor_share(m, dpx, 196_592) == (500, 98_296)


def test_the_partition_a_request_gets_on_a_vendor_card() -> None:
    amd, ascend = MODELS["MI300X"], MODELS["Ascend910B"]
    # 25 % and 40,000 MiB: not CPX (12.5 %), QPX (25 %, 49,148 MiB); of its two memory modes the first listed
    got = vendor_profile_for(amd, GPURequest(count=1, milli=250, memory_mib=40_000), None, 196_592)
    assert not isinstance(got, ProfileRefusal) and got.name == "QPX/NPS1"
    more = vendor_profile_for(amd, GPURequest(count=1, milli=300, memory_mib=40_000), None, 196_592)
    assert not isinstance(more, ProfileRefusal) and more.name == "DPX/NPS1"  # 30 % > QPX's 25 %
    whole = vendor_profile_for(amd, GPURequest(count=1, milli=1000), None, 196_592)
    assert not isinstance(whole, ProfileRefusal) and whole.name == "SPX/NPS1"
    small = vendor_profile_for(ascend, GPURequest(count=1, milli=100, memory_mib=2000))
    assert not isinstance(small, ProfileRefusal) and small.name == "vir04"  # vir02 is 6.7 % of 30 AI Cores
    assert isinstance(vendor_profile_for(ascend, GPURequest(count=1, milli=1000)), ProfileRefusal)  # no whole vNPU
    short = vendor_profile_for(ascend, GPURequest(count=1, milli=1000, memory_mib=20_000), "vir08")
    assert isinstance(short, ProfileRefusal) and "vir08 has 17476 MiB, less than the 20000 MiB" in short.reason
