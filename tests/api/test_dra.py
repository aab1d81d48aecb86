"""The DRA contract's pure parts: the ResourceSlice a node publishes and how an allocated claim reads back."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.dra import (
    DRIVER,
    ClaimError,
    NotOurs,
    SliceDevice,
    claim_asks,
    claim_shares,
    counted_claim,
    device_index,
    device_name,
    mig_device,
    mig_device_name,
    resource_slices,
)
from gpupool.core.mig import MODELS, PlacedInstance, layout_problems
from gpupool.core.model import GPU, MigSlot, Node
from gpupool.core.state import ClusterState


def _claim(results: list[dict[str, Any]], configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "u"},
            "status": {"allocation": {"devices": {"results": results, "config": configs or []}}}}


def _result(device: str, **consumed: str) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device, "consumedCapacity": consumed}


@given(st.integers(min_value=0, max_value=999))
def test_device_names_round_trip(index: int) -> None:
    assert device_index(device_name(index)) == index


@pytest.mark.parametrize("name", ["gpu-", "gpu-1234", "nic-0", "gpu-0-mig", "GPU-0"])
def test_other_device_names_are_not_ours(name: str) -> None:
    assert device_index(name) is None


@given(st.integers(min_value=1, max_value=200_000), st.integers(min_value=0, max_value=100))
def test_consumed_capacity_reads_back_in_mib_and_percent(mib: int, cores: int) -> None:
    shares = claim_shares(_claim([_result("gpu-3", memory=f"{mib}Mi", cores=str(cores))]))
    assert [(s.index, s.memory_mib, s.cores) for s in shares.devices] == [(3, mib, cores)]


def test_binary_and_decimal_memory_quantities() -> None:
    shares = claim_shares(_claim([_result("gpu-0", memory="8Gi"), _result("gpu-1", memory="1G")]))
    # 1G = 10^9 bytes = 953.67 MiB, rounded down: the cap never exceeds what the allocator counted (with the
    # slice's 1Mi step the allocator rounds consumption up to whole MiB anyway)
    assert [s.memory_mib for s in shares.devices] == [8192, 953]
    assert [s.cores for s in shares.devices] == [None, None]


def test_other_drivers_results_are_left_alone() -> None:
    other = {"request": "nic", "driver": "net.example.com", "pool": "n1", "device": "eth0"}
    shares = claim_shares(_claim([other, _result("gpu-1", cores="20")]))
    assert [s.device for s in shares.devices] == ["gpu-1"]


@pytest.mark.parametrize(("claim", "message"), [
    ({"metadata": {"namespace": "ns", "name": "c"}, "status": {}}, "claim ns/c is not allocated"),
    (_claim([_result("gpu-0", cores="101")]), "not a whole percent 0..100"),
    (_claim([_result("gpu-0", cores="2.5")]), "not a whole percent 0..100"),
    (_claim([_result("gpu-0", memory="lots")]), "gpu-0"),
    (_claim([_result("gpu-0")], [{"source": "FromClass", "opaque": {"driver": DRIVER,
                                                                   "parameters": {"isolation": "mig"}}}]),
     "isolation mig only by MIG partitions"),
    (_claim([_result("gpu-0-3g40gb-4")]), "MIG partitions are served only by isolation mig"),
    (_claim([_result("gpu-0")], [{"source": "FromClass", "opaque": {"driver": DRIVER,
                                                                   "parameters": {"isolation": "vgpu"}}}]),
     "isolation 'vgpu'"),
])
def test_claims_that_cannot_be_read(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message.replace(".", r"\.").replace("(", r"\(")):
        claim_shares(claim)


def test_isolation_comes_from_the_class_for_the_requests_it_names() -> None:
    configs = [
        {"source": "FromClass", "requests": ["other"],
         "opaque": {"driver": DRIVER, "parameters": {"isolation": "mps"}}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"isolation": "none"}}},
    ]
    assert claim_shares(_claim([_result("gpu-0")], configs)).isolation == "hook"  # the default, not the tenant's
    configs[0]["requests"] = ["gpu"]
    assert claim_shares(_claim([_result("gpu-0")], configs)).isolation == "mps"


def test_the_slice_tells_the_allocator_what_a_plain_claim_takes() -> None:
    (s,) = resource_slices("n1", "node-uid", [SliceDevice(0, "GPU-x", "H100 80GB HBM3", 81559, "9.0")], "570.124.06", 7)
    device = s["spec"]["devices"][0]
    assert s["spec"]["pool"] == {"name": "n1", "generation": 7, "resourceSliceCount": 1}
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "81559Mi"  # no memory asked: whole GPU
    assert device["capacity"]["cores"]["requestPolicy"]["default"] == "0"  # no cores asked: no compute reserved
    assert device["attributes"]["computeCapability"] == {"version": "9.0.0"}
    assert device["attributes"]["driverVersion"] == {"version": "570.124.6"}
    assert device["attributes"]["type"] == {"string": "gpu"}
    assert "taints" not in device


def test_a_node_with_more_gpus_than_gpupool_publishes_is_refused() -> None:
    devices = [SliceDevice(i, f"GPU-{i}", "m", 1) for i in range(129)]
    with pytest.raises(ValueError, match="at most 128"):
        resource_slices("n1", "u", devices, "", 1)


def test_many_gpus_spread_over_slices_of_one_pool() -> None:
    devices = [SliceDevice(i, f"GPU-{i}", "m", 1) for i in range(100)]
    slices = resource_slices("n1", "u", devices, "", 3)
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 36]  # 64: the API's limit with taints
    assert [s["metadata"]["name"] for s in slices] == ["n1-gpu.gpupool.io", "n1-gpu.gpupool.io-1"]
    assert all(s["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 2} for s in slices)


# --- MIG partitions -----------------------------------------------------------------------------------------

H100 = MODELS["H100-80GB"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_mig_device_names_round_trip_for_every_profile(model: str) -> None:
    for p in MODELS[model].profiles:
        for start in p.starts:
            name = mig_device_name(5, p.name, start)
            assert len(name) <= 63 and name == name.lower()
            assert mig_device(name) == (5, MigSlot(p.name, start))
            assert device_index(name) is None  # never mistaken for a shared GPU


def _mig_slices(model: str = "H100-80GB", gpus: int = 1) -> list[dict[str, Any]]:
    devices = [SliceDevice(i, f"GPU-{i}", model, MODELS[model].memory_mib, mig_mode=True) for i in range(gpus)]
    return resource_slices("n1", "u", devices, "", 1)


def test_a_mig_gpu_is_published_as_partitions_with_a_counter_set_in_its_own_slice() -> None:
    devices_slice, counters_slice = _mig_slices()
    names = [d["name"] for d in devices_slice["spec"]["devices"]]
    # every placement of every profile: 1g 7 + 1g+me 7 + 1g.20gb 4 + 2g 3 + 3g 2 + 4g 1 + 7g 1
    assert len(names) == 25
    assert "gpu-0" not in names
    assert "sharedCounters" not in devices_slice["spec"] and "devices" not in counters_slice["spec"]
    (counter_set,) = counters_slice["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0-mig"
    assert counter_set["counters"]["compute-slices"] == {"value": "7"}
    assert sorted(counter_set["counters"]) == sorted([f"memory-slice-{k}" for k in range(8)]
                                                     + ["compute-slices", "media"])
    three_g = next(d for d in devices_slice["spec"]["devices"] if d["name"] == "gpu-0-3g40gb-4")
    assert three_g["attributes"]["type"] == {"string": "mig"}
    assert three_g["attributes"]["profile"] == {"string": "3g.40gb"}
    assert "allowMultipleAllocations" not in three_g  # one claim per partition
    # 3 of 7 compute slices = 428 milli (rounded down), shown as 42 %; 39.5 GiB (the H100 row of core.mig) = 40448 MiB
    assert three_g["capacity"] == {"memory": {"value": "40448Mi"}, "cores": {"value": "42"}}
    (consumes,) = three_g["consumesCounters"]
    assert consumes["counterSet"] == "gpu-0-mig"
    assert consumes["counters"] == {"memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"},
                                    "memory-slice-6": {"value": "1"}, "memory-slice-7": {"value": "1"},
                                    "compute-slices": {"value": "3"}}


def test_partitions_of_a_profile_are_listed_from_the_highest_start() -> None:
    devices = _mig_slices()[0]["spec"]["devices"]
    ones = [d["attributes"]["migStart"]["int"] for d in devices if d["attributes"]["profile"]["string"] == "1g.10gb"]
    assert ones == [6, 5, 4, 3, 2, 1, 0]


def test_counter_sets_and_devices_respect_the_api_limits_on_a_big_mig_node() -> None:
    slices = _mig_slices(gpus=9)  # 9 x 25 partitions, 9 counter sets
    device_slices = [s for s in slices if "devices" in s["spec"]]
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["devices"]) for s in device_slices] == [64, 64, 64, 33]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 1]
    assert all(len(s["metadata"]["name"]) <= 253 for s in slices)
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 6 for s in slices)
    assert max(len(d["attributes"]) + len(d["capacity"]) for s in device_slices for d in s["spec"]["devices"]) <= 32


def _fits(counters: dict[str, int], chosen: list[dict[str, Any]]) -> bool:
    left = dict(counters)
    for d in chosen:
        for k, v in d["consumesCounters"][0]["counters"].items():
            left[k] -= int(v["value"])
    return all(v >= 0 for v in left.values())


@pytest.mark.parametrize("model", sorted(MODELS))
@given(data=st.data())
def test_partitions_whose_counters_fit_are_exactly_the_valid_mig_layouts(model: str, data: st.DataObject) -> None:
    """The allocator (kube-scheduler's, which knows nothing of MIG) may hand out any set of partitions whose
    counters fit: that must be a layout the GPU can really carve, and every layout core.mig allows must fit."""
    devices_slice, counters_slice = _mig_slices(model)
    counters = {k: int(v["value"]) for k, v in counters_slice["spec"]["sharedCounters"][0]["counters"].items()}
    devices = devices_slice["spec"]["devices"]
    chosen = data.draw(st.lists(st.sampled_from(devices), max_size=8, unique_by=lambda d: d["name"]))
    layout = [PlacedInstance(d["attributes"]["profile"]["string"], d["attributes"]["migStart"]["int"])
              for d in chosen]
    assert _fits(counters, chosen) == (not layout_problems(MODELS[model], layout))


def test_mig_partitions_read_back_with_their_profile_and_count_as_the_profile() -> None:
    config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "mig"}}}]
    claim = _claim([{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1-3g40gb-4"}], config)
    shares = claim_shares(claim)
    assert shares.isolation == "mig"
    assert [(s.index, s.mig, s.memory_mib, s.cores) for s in shares.devices] == [(1, MigSlot("3g.40gb", 4), None, None)]
    gpus = tuple(GPU(f"GPU-{i}", i, "NVIDIA H100 80GB HBM3", 81559) for i in range(2))
    (counted,) = counted_claim(claim, ClusterState([Node("n1", 64_000, 256_000, gpus)]))
    (grant,) = counted.allocation.grants
    # 3 of 7 compute slices: 1000 * 3 // 7 = 428 milli; the profile's 39.5 GiB (the H100 row of core.mig) = 40448 MiB
    assert (grant.uuid, grant.milli, grant.memory_mib, grant.mig) == ("GPU-1", 428, 40448, MigSlot("3g.40gb", 4))



# --- memory oversubscription ---------------------------------------------------------------------------------


def _oversub_claim(factor: Any, source: str = "FromClass", isolation: str = "hook") -> dict[str, Any]:
    config = [{"source": source, "opaque": {"driver": DRIVER, "parameters": {
        "isolation": isolation, "memoryOversubscription": factor}}}]
    return _claim([_result("gpu-0", memory="8Gi", cores="25")], config)


@pytest.mark.parametrize(("factor", "expected"), [("1.5", Fraction(3, 2)), ("1", Fraction(1)), ("4", Fraction(4)),
                                                   ("2.25", Fraction(9, 4))])
def test_the_class_oversubscription_factor_reads_back(factor: str, expected: Fraction) -> None:
    assert claim_shares(_oversub_claim(factor)).oversubscription == expected


@pytest.mark.parametrize("factor", ["0.5", "4.5", "lots", "", True, None, "1/0"])
def test_an_oversubscription_factor_out_of_range_is_an_error(factor: Any) -> None:
    with pytest.raises(ClaimError, match="memoryOversubscription"):
        claim_shares(_oversub_claim(factor))


def test_oversubscription_from_the_claims_own_config_is_ignored() -> None:
    claim = _oversub_claim("4", source="FromClaim")
    claim["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "hook"}}})
    assert claim_shares(claim).oversubscription == 1


@pytest.mark.parametrize("isolation", ["mps", "none"])
def test_oversubscription_needs_the_interception_library(isolation: str) -> None:
    with pytest.raises(ClaimError, match=f"isolations hook and remote only \\(its class gives {isolation}\\)"):
        claim_shares(_oversub_claim("1.5", isolation=isolation))


def test_a_remote_share_may_be_oversubscribed_in_its_gpu_server() -> None:
    assert claim_shares(_oversub_claim("1.5", isolation="remote")).oversubscription == Fraction(3, 2)


def test_an_oversubscribed_claim_counts_its_spill_against_the_nodes_memory() -> None:
    """8 GiB at 1.5x: 8192 MiB on the GPU (guaranteed), 4096 MiB more from the node's memory."""
    gpus = (GPU("GPU-0", 0, "L40S", 46068),)
    (counted,) = counted_claim(_oversub_claim("1.5"), ClusterState([Node("n1", 64_000, 256_000, gpus)]))
    assert counted.request.memory_mib == 4096
    assert [g.memory_mib for g in counted.allocation.grants] == [8192]


# --- gpupool's allocator and MIG claims --------------------------------------------------------------------


def _mig_request(expression: str | None, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "mig.gpu.gpupool.io", **extra}
    if expression is not None:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"metadata": {"namespace": "ns", "name": "c"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


CLASSES = {"mig.gpu.gpupool.io": "mig", "gpu.gpupool.io": "hook"}


@pytest.mark.parametrize(("expression", "profile"), [
    ('device.attributes["gpu.gpupool.io"].profile == "3g.40gb"', "3g.40gb"),
    (' device.attributes["gpu.gpupool.io"].profile=="1g.10gb+me" ', "1g.10gb+me"),
])
def test_a_mig_claim_naming_its_profile_is_gpupools_to_place(expression: str, profile: str) -> None:
    (ask,) = claim_asks(_mig_request(expression), CLASSES)
    assert (ask.mig_profile, ask.count, ask.memory_mib) == (profile, 1, None)


@pytest.mark.parametrize(("expression", "extra"), [
    (None, {}),  # no profile named: any partition, kube-scheduler's first fit
    ('device.attributes["gpu.gpupool.io"].profile == "3g.40gb" || true', {}),
    ('device.attributes["gpu.gpupool.io"].profile != "3g.40gb"', {}),
    ('device.attributes["other.io"].profile == "3g.40gb"', {}),
    ('device.attributes["gpu.gpupool.io"].profile == "3g.40gb"', {"count": 2}),
    ('device.attributes["gpu.gpupool.io"].profile == "3g.40gb"', {"allocationMode": "All"}),
    ('device.attributes["gpu.gpupool.io"].profile == "3g.40gb"', {"adminAccess": True}),
])
def test_any_other_mig_claim_is_left_to_kube_scheduler(expression: str | None, extra: dict[str, Any]) -> None:
    with pytest.raises(NotOurs, match="MIG class"):
        claim_asks(_mig_request(expression, **extra), CLASSES)
