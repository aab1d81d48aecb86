"""The one reader of pod resources: Kubernetes quantities, the effective-request rule with init containers
and sidecars, several GPU containers, and the per-container part of the allocation annotation."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.allocation import AllocationError, decode_allocation, encode_allocation, split_by_container
from gpupool.api.pod import APP, INIT, SIDECAR, effective, parse_pod, wants_gpu
from gpupool.api.quantity import (
    QuantityError,
    cpu_milli,
    format_quantity,
    gpu_memory_mib,
    memory_mib,
    parse_quantity,
)
from gpupool.core.model import Allocation, GPUGrant, MigSlot

GPU, CORES, MEM = "gpupool.io/gpu", "gpupool.io/gpu-cores", "gpupool.io/gpu-memory"


def c(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
      sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "busybox", "resources": {}}
    if requests:
        out["resources"]["requests"] = requests
    if limits:
        out["resources"]["limits"] = limits
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


# --- quantities -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("10240", 10240),  # unitless gpu-memory is MiB
        ("10240Mi", 10240),
        ("10Gi", 10240),  # 10 * 1024
        ("16G", 15258),  # 16e9 / 2**20 = 15258.789..., rounded down
        ("1e3", 1000),  # an exponent scales the unitless MiB
        ("1.5Gi", 1536),
        ("0.5Ti", 524288),
        ("1048576Ki", 1024),
        # The API server stores 20000 as "20k" and 8000 as "8k": counts of MiB, not 20 kB (which would be 0).
        ("20k", 20000),
        ("8k", 8000),
        ("1.5k", 1500),
        ("80G", 76293),  # 80e9 B / 2**20 = 76293.9: bytes, as 80 G MiB no GPU has
    ],
)
def test_gpu_memory_quantities(text: str, mib: int) -> None:
    assert gpu_memory_mib(text) == mib


@pytest.mark.parametrize(
    ("text", "milli"),
    [("2", 2000), ("500m", 500), ("0.5", 500), ("1e-3", 1), ("0.0001", 1), ("1k", 1_000_000)],
)
def test_cpu_quantities_round_up_to_milli(text: str, milli: int) -> None:
    # 0.0001 cores = 0.1m, rounded up to 1m as the API server does.
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "mib"),
    [("1Gi", 1024), ("1073741824", 1024), ("1G", 954), ("1500Ki", 2), ("128974848", 123), ("129e6", 124)],
)
def test_container_memory_is_bytes_rounded_up(text: str, mib: int) -> None:
    # 1G = 1e9 B = 953.67 MiB -> 954; 1500Ki = 1.46 MiB -> 2; 129e6 B = 123.02 MiB -> 124.
    assert memory_mib(text) == mib


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "10 Gi", "1Zi", "--1", "1e999999", "9" * 80, "0x10"])
def test_bad_quantities_say_what(text: str) -> None:
    with pytest.raises(QuantityError, match="gpu-memory"):
        gpu_memory_mib(text)


_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T", "m"]


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(_SUFFIXES))
def test_quantity_round_trip(n: int, suffix: str) -> None:
    amount, _ = parse_quantity(f"{n}{suffix}")
    assert format_quantity(amount, suffix) == f"{n}{suffix}"
    assert parse_quantity(format_quantity(amount, suffix))[0] == amount


@given(st.integers(min_value=1, max_value=10**6))
def test_gi_and_mi_agree(n: int) -> None:
    assert gpu_memory_mib(f"{n}Gi") == gpu_memory_mib(f"{n * 1024}Mi") == gpu_memory_mib(str(n * 1024))
    assert parse_quantity(f"{n}Gi")[0] == Fraction(n * 2**30)


# --- the effective-request rule ---------------------------------------------------------------------------


def test_effective_cpu_and_memory_with_init_containers_and_sidecars() -> None:
    obj = pod(
        [c("app", {"cpu": "1", "memory": "1Gi"}), c("helper", {"cpu": "500m", "memory": "512Mi"})],
        init=[
            c("migrate", {"cpu": "3", "memory": "256Mi"}),
            c("proxy", {"cpu": "250m", "memory": "128Mi"}, sidecar=True),
            c("warm", {"cpu": "1", "memory": "4Gi"}),
        ],
    )
    r = parse_pod(obj).request
    assert r is not None
    # cpu: apps 1000 + 500 + sidecar 250 = 1750; init "migrate" 3000 alone; "warm" 1000 + sidecar 250.
    # max(1750, 3000, 1250) = 3000
    assert r.cpu_milli == 3000
    # memory: apps 1024 + 512 + sidecar 128 = 1664; migrate 256; warm 4096 + 128 = 4224 -> 4224
    assert r.memory_mib == 4224


def test_limits_stand_in_for_missing_requests() -> None:
    r = parse_pod(pod([c("app", limits={"cpu": "2", "memory": "1Gi"})])).request
    assert r is not None and (r.cpu_milli, r.memory_mib) == (2000, 1024)


def test_init_container_gpu_counts_and_wants_gpu_agree() -> None:
    obj = pod([c("app")], init=[c("prep", limits={GPU: "1", CORES: "30"})])
    assert wants_gpu(obj)
    parsed = parse_pod(obj)
    assert parsed.request is not None and parsed.request.gpu.count == 1 and parsed.request.gpu.milli == 300
    assert parsed.container == "prep" and parsed.containers[0].kind == INIT


_KINDS = st.sampled_from([APP, INIT, SIDECAR])


@given(st.lists(st.tuples(_KINDS, st.integers(min_value=0, max_value=10**6)), max_size=8))
def test_effective_covers_every_phase(values: list[tuple[str, int]]) -> None:
    total = effective(values)
    running = sum(v for k, v in values if k != INIT)
    assert total >= running
    sidecars = 0
    for kind, v in values:
        if kind == SIDECAR:
            sidecars += v
        if kind == INIT:
            assert total >= v + sidecars  # an init container runs beside the sidecars started before it
    # ...and it is never more than the largest phase: it is one of them.
    phases = [running] + [v + sum(w for k, w in values[:i] if k == SIDECAR) for i, (k, v) in enumerate(values)
                          if k == INIT]
    assert total == max(phases, default=0)


@given(st.lists(st.tuples(st.sampled_from(["init", "sidecar", "app"]), st.integers(0, 4000),
                          st.integers(0, 4096)), min_size=1, max_size=6))
def test_parsed_pod_request_is_the_effective_one(spec: list[tuple[str, int, int]]) -> None:
    init = [c(f"i{i}", {"cpu": f"{cpu}m", "memory": f"{mem}Mi"}, sidecar=kind == "sidecar")
            for i, (kind, cpu, mem) in enumerate(spec) if kind != "app"]
    apps = [c(f"a{i}", {"cpu": f"{cpu}m", "memory": f"{mem}Mi"}) for i, (kind, cpu, mem) in enumerate(spec)
            if kind == "app"]
    r = parse_pod(pod(apps or [c("main")], init=init)).request
    assert r is not None
    for kind, cpu, mem in spec:
        if kind == "init":
            assert r.cpu_milli >= cpu and r.memory_mib >= mem
    assert r.cpu_milli >= sum(cpu for k, cpu, _ in spec if k != "init")
    assert r.memory_mib >= sum(mem for k, _, mem in spec if k != "init")


# --- several GPU containers -------------------------------------------------------------------------------


def test_whole_gpu_containers_add_up_and_get_their_own_gpus() -> None:
    obj = pod(
        [c("a", limits={GPU: "2"}), c("b", limits={GPU: "1"})],
        init=[c("log", limits={GPU: "1"}, sidecar=True), c("prep", limits={GPU: "3"})],
    )
    parsed = parse_pod(obj)
    assert parsed.errors == [] and parsed.request is not None
    # running together: a 2 + b 1 + sidecar log 1 = 4; prep 3 + log 1 = 4 -> 4 GPUs
    assert parsed.request.gpu.count == 4 and parsed.request.gpu.whole
    grants = tuple(GPUGrant(f"GPU-{i}", i, 1000, 81920) for i in range(4))
    parts = {d.name: [g.index for g in d.gpus] for d in split_by_container(parsed.containers, grants)}
    # sidecar first (0), prep after the sidecar (1-3), apps after the sidecar (a: 1-2, b: 3)
    assert parts == {"log": [0], "prep": [1, 2, 3], "a": [1, 2], "b": [3]}


def test_share_containers_split_one_gpu() -> None:
    obj = pod([c("a", limits={GPU: "1", CORES: "20", MEM: "4Gi"}), c("b", limits={GPU: "1", CORES: "30", MEM: "2Gi"})])
    parsed = parse_pod(obj)
    assert parsed.request is not None
    g = parsed.request.gpu
    # 20 % + 30 % = 50 % = 500 milli; 4096 + 2048 MiB = 6144 MiB on one GPU
    assert (g.count, g.milli, g.memory_mib) == (1, 500, 6144)
    alloc = Allocation("ns/p", "node-a", (GPUGrant("GPU-0", 0, 500, 6144),))
    doc = decode_allocation(encode_allocation(alloc, "uid-1", "mps", "t", parsed.containers))
    assert doc.version == 2
    parts = [(p.name, p.gpus[0].cores, p.gpus[0].memory_mib) for p in doc.containers]
    assert parts == [("a", 20, 4096), ("b", 30, 2048)]
    assert doc.container_gpus("b")[0].memory_mib == 2048 and doc.container_gpus("zzz") == []


def test_share_without_memory_gets_the_fraction_of_the_pods_memory() -> None:
    obj = pod([c("a", limits={GPU: "1", CORES: "10"}), c("b", limits={GPU: "1", CORES: "30"})])
    parsed = parse_pod(obj)
    assert parsed.request is not None and parsed.request.gpu.milli == 400 and parsed.request.gpu.memory_mib is None
    # 40 % of a 40960 MiB card = 16384 MiB; a holds 10/40 of it = 4096, b 30/40 = 12288
    parts = split_by_container(parsed.containers, (GPUGrant("GPU-0", 0, 400, 16384),))
    assert [p.gpus[0].memory_mib for p in parts] == [4096, 12288]


@pytest.mark.parametrize(
    ("containers", "fragment"),
    [
        ([c("a", limits={GPU: "1"}), c("b", limits={GPU: "1", CORES: "20"})], "mix whole GPUs and shares"),
        ([c("a", limits={GPU: "1", CORES: "20", MEM: "1Gi"}), c("b", limits={GPU: "1", CORES: "20"})],
         "give gpupool.io/gpu-memory in all of them or in none"),
        ([c("a", limits={GPU: "1", CORES: "60"}), c("b", limits={GPU: "1", CORES: "50"})],
         "110 % of one GPU's compute, more than 100 %"),
    ],
)
def test_unsupported_gpu_container_mixes_are_refused(containers: list[dict[str, Any]], fragment: str) -> None:
    parsed = parse_pod(pod(containers))
    assert parsed.request is None and any(fragment in e for e in parsed.errors), parsed.errors


def test_single_container_allocation_stays_version_1() -> None:
    parsed = parse_pod(pod([c("main", limits={GPU: "1", CORES: "50"})]))
    alloc = Allocation("ns/p", "n", (GPUGrant("GPU-0", 0, 500, 20480),))
    text = encode_allocation(alloc, "u", "hook", "t", parsed.containers)
    assert '"version":1' in text and "containers" not in text
    assert decode_allocation(text).container_gpus("main")[0].cores == 50


def test_decoder_refuses_containers_holding_gpus_the_pod_lacks() -> None:
    text = ('{"version": 2, "pod_uid": "u", "node": "n", "gpus": [{"uuid": "G0", "index": 0, "memory_mib": 1, '
            '"cores": 50}], "containers": [{"name": "a", "gpus": [{"uuid": "G9", "index": 9, "memory_mib": 1, '
            '"cores": 50}]}]}')
    with pytest.raises(AllocationError, match="not granted to the pod"):
        decode_allocation(text)
    v1_with_containers = text.replace('"version": 2', '"version": 1')
    with pytest.raises(AllocationError, match="version 2 field"):
        decode_allocation(v1_with_containers)


def test_mig_isolation_gives_one_instance_to_one_container() -> None:
    def mig(containers: list[dict[str, Any]], annotations: dict[str, str]) -> list[str]:
        p = pod(containers)
        p["metadata"]["annotations"] = annotations
        return parse_pod(p).errors

    one = {"gpupool.io/isolation": "mig"}
    assert mig([c("a", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30"})], one) == []
    assert mig([c("a", limits={"gpupool.io/gpu": "2"})], one) == [
        "container a: gpupool.io/gpu=2 with gpupool.io/isolation=mig: a pod gets one MIG instance; ask for "
        "gpupool.io/gpu: 1 (or use whole GPUs without mig)"]
    two = [c("a", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30"}),
           c("b", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30"})]
    assert mig(two, one) == ["gpupool.io/isolation=mig gives a pod one MIG instance for one container, but "
                             "container a, container b ask for GPUs"]
    assert mig([c("a", limits={"gpupool.io/gpu": "1"})], {"gpupool.io/mig-profile": "3g.20gb"}) == [
        "annotation gpupool.io/mig-profile='3g.20gb' needs gpupool.io/isolation: mig (it is 'hook')"]


def test_mig_grant_round_trips_through_the_annotation() -> None:
    grant = GPUGrant("GPU-1", 0, 285, 9850, MigSlot("2g.10gb", 4))
    text = encode_allocation(Allocation("p", "n1", (grant,)), "uid-1", "mig", "")
    doc = decode_allocation(text)
    assert doc.gpus[0].mig is not None and doc.gpus[0].mig.model_dump() == {"profile": "2g.10gb", "start": 4}
    assert doc.allocation("p").grants == (grant,)
    plain = encode_allocation(Allocation("p", "n1", (GPUGrant("GPU-1", 0, 500, 100),)), "uid-1", "hook", "")
    assert '"mig"' not in plain  # left out of the JSON for other isolations
