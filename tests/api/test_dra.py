"""The DRA contract's pure parts: the ResourceSlice a node publishes and how an allocated claim reads back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.dra import (
    DRIVER,
    ClaimError,
    SliceDevice,
    claim_shares,
    device_index,
    device_name,
    resource_slice,
)


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
     "isolation 'mig'"),
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
    s = resource_slice("n1", "node-uid", [SliceDevice(0, "GPU-x", "H100 80GB HBM3", 81559, "9.0")], "570.124.06", 7)
    device = s["spec"]["devices"][0]
    assert s["spec"]["pool"] == {"name": "n1", "generation": 7, "resourceSliceCount": 1}
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "81559Mi"  # no memory asked: whole GPU
    assert device["capacity"]["cores"]["requestPolicy"]["default"] == "0"  # no cores asked: no compute reserved
    assert device["attributes"]["computeCapability"] == {"version": "9.0.0"}
    assert device["attributes"]["driverVersion"] == {"version": "570.124.6"}
    assert "taints" not in device


def test_a_node_with_more_gpus_than_a_slice_holds_is_refused() -> None:
    devices = [SliceDevice(i, f"GPU-{i}", "m", 1) for i in range(129)]
    with pytest.raises(ValueError, match="at most 128"):
        resource_slice("n1", "u", devices, "", 1)
