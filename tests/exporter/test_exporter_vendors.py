"""Pool and device metrics of a mixed pool (tests/dashboard/mixed_pool.py): `vendor` and `model` on every
per-GPU series, the per-vendor series, one series per hardware partition; parsed with prometheus_client's
parser from the route's own text and from the generic encoder."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.snapshot import build_snapshot
from gpupool.exporter import PARTITION_METRICS, POOL_METRICS, DeviceCollector, DeviceSample, PoolCollector
from gpupool.exporter.http import create_metrics_app, render
from tests.dashboard.mixed_pool import EVIL_POD, REPORTED, mixed_state
from tests.exporter.test_exporter_pool import MIB, samples, scrape, value

PER_GPU = ("gpupool_gpu_info", "gpupool_gpu_healthy", "gpupool_gpu_memory_bytes",
           "gpupool_gpu_memory_allocated_bytes", "gpupool_gpu_cores_allocated_ratio", "gpupool_gpu_sharers")
VENDOR_OF = {"GPU-nv-0": "nvidia", "GPU-nv-1": "nvidia", "AMD-0": "amd", "AMD-1": "amd", "NPU-0": "ascend"}
MODEL_OF = {"GPU-nv-0": "A100-40GB", "GPU-nv-1": "A100-40GB", "AMD-0": "MI300X", "AMD-1": "MI300X",
            "NPU-0": "Ascend910B"}


def test_per_gpu_series_carry_vendor_and_model(serve_app: Any) -> None:
    pool = PoolCollector(lambda: build_snapshot(mixed_state(), {}, partitions=REPORTED))
    with serve_app(create_metrics_app(CollectorRegistry(), pool)) as url:
        m = scrape(url)
    for name in PER_GPU:
        # one series per card still: vendor and model are the card's, they add no series
        assert {lv["uuid"]: (lv["vendor"], lv["model"]) for lv, _ in m[name]} == {
            u: (VENDOR_OF[u], MODEL_OF[u]) for u in VENDOR_OF}, name
        assert len(m[name]) == 5, name
    assert {lv["uuid"]: lv["runtime"] for lv, _ in m["gpupool_gpu_info"]} == {
        "GPU-nv-0": "cuda", "GPU-nv-1": "cuda", "AMD-0": "rocm", "AMD-1": "rocm", "NPU-0": "cann"}
    assert value(m, "gpupool_gpu_memory_bytes", uuid="AMD-0", vendor="amd") == 196608 * MIB
    # what dashboards built before vendors select by still selects one series
    assert value(m, "gpupool_gpu_cores_allocated_ratio", node="amd-0", gpu="0", uuid="AMD-0") == 0.125


def test_vendor_series_hand_computed(serve_app: Any) -> None:
    pool = PoolCollector(lambda: build_snapshot(mixed_state(), {}, partitions=REPORTED))
    with serve_app(create_metrics_app(CollectorRegistry(), pool)) as url:
        m = scrape(url)
    assert {(lv["vendor"], lv["runtime"]): v for lv, v in m["gpupool_vendor_gpus"]} == {
        ("amd", "rocm"): 2, ("ascend", "cann"): 1, ("nvidia", "cuda"): 2}
    assert value(m, "gpupool_vendor_healthy_gpus", vendor="ascend") == 1
    assert value(m, "gpupool_vendor_memory_bytes", vendor="amd") == 2 * 196608 * MIB
    assert value(m, "gpupool_vendor_allocated_ratio", vendor="amd") == 0.5625  # 1,125 of 2,000 milli
    assert value(m, "gpupool_vendor_allocated_ratio", vendor="nvidia") == 0.3645  # 729 of 2,000
    assert value(m, "gpupool_vendor_memory_allocated_ratio", vendor="nvidia") == 0.36875  # 30,208 / 81,920 MiB
    # the vendors' GPUs add up to the pool's
    assert sum(v for _, v in m["gpupool_vendor_gpus"]) == value(m, "gpupool_pool_gpus") == 5


def test_one_series_per_partition(serve_app: Any) -> None:
    pool = PoolCollector(lambda: build_snapshot(mixed_state(), {}, partitions=REPORTED))
    with serve_app(create_metrics_app(CollectorRegistry(), pool)) as url:
        m = scrape(url)
    parts = {(lv["uuid"], lv["vendor"], lv["profile"], lv["start"]): v for lv, v in m["gpupool_gpu_partition_used"]}
    assert parts == {
        ("GPU-nv-1", "nvidia", "3g.20gb", "0"): 1, ("GPU-nv-1", "nvidia", "3g.20gb", "4"): 0,
        **{("AMD-0", "amd", "CPX/NPS4", str(k)): (1 if k == 2 else 0) for k in range(8)},
        ("NPU-0", "ascend", "vir08", "0"): 1, ("NPU-0", "ascend", "vir04", "1"): 0,
    }


def test_every_listed_metric_is_produced_for_a_mixed_pool() -> None:
    registry = CollectorRegistry()
    PoolCollector(lambda: build_snapshot(mixed_state(), {"ns/w": "x"}, pending_since={"ns/w": 1.0}, now=2.0,
                                         partitions=REPORTED), registry)
    assert set(POOL_METRICS) | set(PARTITION_METRICS) <= set(samples(generate_latest(registry).decode()))


def test_fast_text_equals_the_generic_encoder_with_hostile_names() -> None:
    hostile = {**REPORTED, "NPU-0": [('vir"04\\\n', 1, False)]}
    snap = build_snapshot(mixed_state(), {}, partitions=hostile)
    generic = CollectorRegistry()
    PoolCollector(lambda: snap, generic)
    via_route, _ = render(CollectorRegistry(), PoolCollector(lambda: snap).take(), "")

    def sample_set(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value)
                for f in text_string_to_metric_families(text) for s in f.samples}

    fast = sample_set(via_route.decode())
    assert fast == sample_set(generate_latest(generic).decode())
    profiles = {dict(labels)["profile"] for name, labels, _ in fast if name == "gpupool_gpu_partition_used"}
    assert 'vir"04\\\n' in profiles
    pods = {dict(labels)["pod"] for name, labels, _ in fast if name == "gpupool_grant_cores_ratio"}
    assert EVIL_POD in pods


@pytest.mark.parametrize(("model", "vendor", "expected"), [
    ("MI300X", "", "amd"),  # from the catalogue
    ("Ascend 910B", "", "ascend"),
    ("NVIDIA A100-SXM4-40GB", "", "nvidia"),  # not catalogued under that name: a card without vendor is NVIDIA
    ("card-x", "amd", "amd"),  # what the agent says wins
])
def test_device_series_carry_the_vendor(model: str, vendor: str, expected: str) -> None:
    sample = DeviceSample(index=0, uuid="U-0", model=model, hostname="h", gpu_util=1.0, fb_used_mib=1.0,
                          fb_total_mib=2.0, temperature_c=30.0, power_w=50.0, vendor=vendor)
    registry = CollectorRegistry()
    DeviceCollector(lambda: [sample], registry=registry)
    m = samples(generate_latest(registry).decode())
    assert {lv["vendor"] for name, series in m.items() if name.startswith("DCGM_") for lv, _ in series} == {expected}
