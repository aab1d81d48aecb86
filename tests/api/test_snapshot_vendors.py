"""The pool snapshot of a mixed pool: vendor, runtime and partitions per GPU, and each vendor's totals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.snapshot import GPUView, Snapshot, VendorTotals, build_snapshot
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, MigSlot, Node, PodRequest
from gpupool.core.state import ClusterState
from tests.dashboard.mixed_pool import EVIL_NS, EVIL_POD, REPORTED, mixed_state


def gpus_by_uuid(snap: Snapshot) -> dict[str, GPUView]:
    return {gpu.uuid: gpu for node in snap.nodes for gpu in node.gpus}


def test_each_gpu_carries_its_vendor_and_runtime() -> None:
    gpus = gpus_by_uuid(build_snapshot(mixed_state(), {}, partitions=REPORTED))
    assert {u: (g.vendor, g.runtime) for u, g in gpus.items()} == {
        "GPU-nv-0": ("nvidia", "cuda"), "GPU-nv-1": ("nvidia", "cuda"),
        "AMD-0": ("amd", "rocm"), "AMD-1": ("amd", "rocm"), "NPU-0": ("ascend", "cann"),
    }


def test_partitions_with_their_size_and_holder() -> None:
    gpus = gpus_by_uuid(build_snapshot(mixed_state(), {}, partitions=REPORTED))
    mig = [(p.profile, p.start, p.memory_mib, p.compute_units, p.used, p.pod) for p in gpus["GPU-nv-1"].partitions]
    # A100-40GB 3g.20gb: 19,968 MiB and 42 SMs (the MIG table)
    assert mig == [("3g.20gb", 0, 19968, 42, True, "team-a/mig"), ("3g.20gb", 4, 19968, 42, False, "")]
    amd = gpus["AMD-0"].partitions
    # CPX/NPS4 on an MI300X: 304 / 8 = 38 CUs, 196,608 / 8 = 24,576 MiB each
    assert [(p.start, p.memory_mib, p.compute_units) for p in amd] == [(k, 24576, 38) for k in range(8)]
    assert [(p.start, p.pod) for p in amd if p.used] == [(2, "team-b/rocm")]
    # The vNPU the pod holds is listed from its grant before the agent reports it; vir08 on the 30-core 910B:
    # 65,536 x 8 // 30 = 17,476 MiB, vir04 8,738 MiB.
    npu = [(p.profile, p.start, p.memory_mib, p.compute_units, p.used, p.pod) for p in gpus["NPU-0"].partitions]
    assert npu == [("vir08", 0, 17476, 8, True, f"{EVIL_NS}/{EVIL_POD}"), ("vir04", 1, 8738, 4, False, "")]
    assert gpus["GPU-nv-0"].partitions == [] and gpus["AMD-1"].partitions == []


def test_grants_name_the_partition_serving_them() -> None:
    snap = build_snapshot(mixed_state(), {}, partitions=REPORTED)
    assert {f"{g.namespace}/{g.pod}": g.partition for g in snap.grants()} == {
        "team-a/train": "", "team-a/mig": "3g.20gb", "team-b/rocm": "CPX/NPS4", "team-b/whole": "",
        f"{EVIL_NS}/{EVIL_POD}": "vir08",
    }


def test_a_profile_without_geometry_is_shown_with_size_unknown() -> None:
    snap = build_snapshot(mixed_state(), {}, partitions={"AMD-1": [("weird/NPS9", 0, False)]})
    (part,) = gpus_by_uuid(snap)["AMD-1"].partitions
    assert (part.profile, part.memory_mib, part.compute_units, part.used) == ("weird/NPS9", 0, 0, False)


def test_vendor_totals_hand_computed() -> None:
    totals = build_snapshot(mixed_state(), {}, partitions=REPORTED).totals
    assert totals.vendors == [
        # 1,125 of 2,000 milli; 24,576 + 196,608 = 221,184 of 393,216 MiB
        VendorTotals(vendor="amd", runtime="rocm", gpus=2, healthy_gpus=2, memory_mib=393216,
                     allocated_memory_mib=221184, allocated_share=0.5625, allocated_memory_share=0.5625),
        VendorTotals(vendor="ascend", runtime="cann", gpus=1, healthy_gpus=1, memory_mib=65536,
                     allocated_memory_mib=17476, allocated_share=0.266,
                     allocated_memory_share=17476 / 65536),
        # 300 + 429 = 729 of 2,000 milli; 10,240 + 19,968 = 30,208 of 81,920 MiB
        VendorTotals(vendor="nvidia", runtime="cuda", gpus=2, healthy_gpus=2, memory_mib=81920,
                     allocated_memory_mib=30208, allocated_share=0.3645, allocated_memory_share=0.36875),
    ]


def test_an_unknown_vendor_has_no_runtime() -> None:
    state = ClusterState([Node("x", 1000, 1000, (GPU("X-0", 0, "Gaudi3", 131072, vendor="intel"),))])
    snap = build_snapshot(state, {})
    (gpu,) = snap.nodes[0].gpus
    assert (gpu.vendor, gpu.runtime) == ("intel", "")
    assert [(v.vendor, v.runtime, v.gpus) for v in snap.totals.vendors] == [("intel", "", 1)]


def test_old_snapshots_still_parse() -> None:
    """A snapshot from a scheduler before vendors (no vendor, runtime, partitions or vendor totals) reads with
    the defaults: every card NVIDIA, as gpupool's cards were then."""
    doc = build_snapshot(mixed_state(), {}).model_dump(mode="json")
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            for key in ("vendor", "runtime", "partitions"):
                del gpu[key]
            for g in gpu["grants"]:
                del g["partition"]
    del doc["totals"]["vendors"]
    snap = Snapshot.model_validate(doc)
    assert {g.vendor for n in snap.nodes for g in n.gpus} == {"nvidia"} and snap.totals.vendors == []


VENDORS = ("nvidia", "amd", "ascend")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(VENDORS), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 10), st.booleans()), max_size=20))
def test_vendor_totals_add_up_to_the_pool(vendors: list[str], ops: list[tuple[int, int, bool]]) -> None:
    """Whatever the vendor mix and allocations, the vendors' cards, memory and compute sum to the pool's."""
    gpus = tuple(GPU(f"G-{j}", j, "card", 1000 * (j + 1), vendor=v) for j, v in enumerate(vendors))
    state = ClusterState([Node("n", 64000, 64000, gpus)])
    for n, (slot, tenths, unhealthy) in enumerate(ops):
        j = slot % len(gpus)
        if unhealthy:
            state.set_gpu_health("n", j, False)
            continue
        if state.gpu_milli_free[0, j] >= tenths * 100 and state.gpu_healthy[0, j]:
            grant = GPUGrant(gpus[j].uuid, j, tenths * 100, gpus[j].memory_mib * tenths // 10)
            key = f"ns/p{n}"
            pod = PodRequest(key, gpu=GPURequest(1, tenths * 100))
            assert state.allocate(pod, Allocation(key, "n", (grant,))) is None
    t = build_snapshot(state, {}).totals
    assert [v.vendor for v in t.vendors] == sorted(set(vendors))
    assert sum(v.gpus for v in t.vendors) == t.gpus
    assert sum(v.healthy_gpus for v in t.vendors) == t.healthy_gpus
    assert sum(v.memory_mib for v in t.vendors) == t.memory_mib
    assert sum(v.allocated_memory_mib for v in t.vendors) == t.allocated_memory_mib
    assert sum(v.allocated_share * v.gpus for v in t.vendors) == pytest.approx(t.allocated_share * t.gpus)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["CPX/NPS4", "QPX/NPS4"]), st.integers(0, 7), st.booleans()),
                max_size=10, unique_by=lambda t: (t[0], t[1])),
       st.lists(st.tuples(st.sampled_from(["CPX/NPS4", "QPX/NPS4"]), st.integers(0, 7)), max_size=4,
                unique=True))
def test_partitions_are_the_report_with_the_grants_laid_over_it(
        reported: list[tuple[str, int, bool]], claimed: list[tuple[str, int]]) -> None:
    """Every reported partition is listed once, every granted one too, as used and with its pod; nothing else,
    in start order; a partition is used exactly when the agent says so or a pod holds it."""
    state = ClusterState([Node("amd", 64000, 64000, (GPU("AMD-0", 0, "MI300X", 196608, vendor="amd"),))])
    for n, (profile, start) in enumerate(claimed):
        grant = GPUGrant("AMD-0", 0, 1, 1, MigSlot(profile, start))
        pod = PodRequest(f"ns/p{n}", gpu=GPURequest(1, 1, 1))
        assert state.allocate(pod, Allocation(f"ns/p{n}", "amd", (grant,))) is None
    (gpu,) = build_snapshot(state, {}, partitions={"AMD-0": reported}).nodes[0].gpus
    listed = [(p.profile, p.start) for p in gpu.partitions]
    assert len(listed) == len(set(listed))
    assert set(listed) == {(p, s) for p, s, _ in reported} | set(claimed)
    assert [s for _, s in listed] == sorted(s for _, s in listed)
    holder = {c: f"ns/p{n}" for n, c in enumerate(claimed)}
    said = {(p, s): u for p, s, u in reported}
    for p in gpu.partitions:
        key = (p.profile, p.start)
        assert p.pod == holder.get(key, "")
        assert p.used == (said.get(key, False) or key in holder)
