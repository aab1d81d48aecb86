"""The simulator's vendor mix (gpupool.sim.vendor_mix): parsing, the mixed nodes and pods, the islands, the
misrouted count and the combined unallocated %."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.core.vendors import AMD, ASCEND, NVIDIA
from gpupool.sim.parallel import Job, run_all
from gpupool.sim.replay import ReplayLog, replay, setup
from gpupool.sim.vendor_mix import (
    VendorMix,
    VendorMixError,
    compare,
    island_of,
    misrouted,
    mix_nodes,
    mix_pods,
    node_counts,
    parse_mix,
    replay_islands,
    unallocated_pct,
)


def trace_nodes(n: int, gpus: int = 4) -> list[Node]:
    return [Node(f"n{i:03d}", 32_000, 128_000, tuple(GPU(f"n{i:03d}-{j}", j, "V100M16", 16_384)
                                                     for j in range(gpus))) for i in range(n)]


def trace_pods(n: int) -> list[PodRequest]:
    return [PodRequest(f"p{k:04d}", 2000, 1000, GPURequest(1 if k % 5 else 2, 500 if k % 3 == 1 else 1000))
            for k in range(n)]


# --- parsing ----------------------------------------------------------------------------------------------------


def test_the_rest_is_nvidia() -> None:
    mix = parse_mix("amd=0.3,ascend=0.1")
    assert [v for v, _ in mix.shares] == [NVIDIA, AMD, ASCEND] and mix.any_share == 0
    assert [s for _, s in mix.shares] == pytest.approx([0.6, 0.3, 0.1])
    assert parse_mix(" AMD = 0.5 , any=0.2").any_share == 0.2
    assert parse_mix("nvidia=0.5,amd=0.5").shares == ((NVIDIA, 0.5), (AMD, 0.5), (ASCEND, 0.0))
    assert parse_mix("amd=1").shares == ((NVIDIA, 0.0), (AMD, 1.0), (ASCEND, 0.0))


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty; expected vendor=fraction entries"),
    ("amd", "entry 'amd': expected vendor=fraction"),
    ("intel=0.2", "unknown vendor 'intel' (use nvidia, amd, ascend, any)"),
    ("amd=0.2,amd=0.1", "amd is given twice"),
    ("amd=lots", "'lots' is not a fraction from 0 to 1"),
    ("amd=nan", "'nan' is not a fraction from 0 to 1"),
    ("amd=-0.1", "'-0.1' is not a fraction from 0 to 1"),
    ("amd=1.5", "'1.5' is not a fraction from 0 to 1"),
    ("amd=0.7,ascend=0.4", "the vendors' shares add up to 1.1, more than 1"),
    ("nvidia=0.5,amd=0.3", "add up to 0.8; with nvidia named they must add up to 1"),
    (",".join(["amd=0.1"] * 9), "9 entries"),
])
def test_bad_mixes_are_named(text: str, problem: str) -> None:
    with pytest.raises(VendorMixError) as err:
        parse_mix(text)
    assert problem in str(err.value)


def test_node_counts_round_by_largest_remainder() -> None:
    # 1,213 nodes: 0.3 -> 363.9, 0.1 -> 121.3, 0.6 -> 727.8; floors 363 + 121 + 727 = 1,211, two left: to the
    # largest remainders, amd (0.9) and nvidia (0.8).
    assert node_counts(parse_mix("amd=0.3,ascend=0.1"), 1213) == {NVIDIA: 728, AMD: 364, ASCEND: 121}
    assert node_counts(parse_mix("amd=0.5"), 3) == {NVIDIA: 2, AMD: 1, ASCEND: 0}  # a 0.5/0.5 tie: nvidia first
    with pytest.raises(VendorMixError, match="ascend=0.01 of 10 GPU nodes gives ascend no node"):
        node_counts(parse_mix("ascend=0.01"), 10)


# --- nodes and pods ------------------------------------------------------------------------------------------


def test_mixed_nodes_keep_everything_but_their_cards() -> None:
    nodes = trace_nodes(10, gpus=3) + [Node("cpu", 8000, 8000)]
    mixed = mix_nodes(nodes, parse_mix("amd=0.3,ascend=0.2"))
    assert [n.name for n in mixed] == [n.name for n in nodes] and mixed[-1] == nodes[-1]
    vendors = Counter(n.gpus[0].vendor for n in mixed if n.gpus)
    assert vendors == {NVIDIA: 5, AMD: 3, ASCEND: 2}
    for before, after in zip(nodes, mixed, strict=True):
        assert (after.cpu_milli, after.memory_mib, len(after.gpus)) == (before.cpu_milli, before.memory_mib,
                                                                        len(before.gpus))
        assert [g.uuid for g in after.gpus] == [g.uuid for g in before.gpus]
    amd = next(n for n in mixed if n.gpus and n.gpus[0].vendor == AMD).gpus[0]
    ascend = next(n for n in mixed if n.gpus and n.gpus[0].vendor == ASCEND).gpus[0]
    # The catalogue's cards: MI300X 192 GiB and 304 CUs; Ascend 910B 64 GiB and 30 AI cores.
    assert (amd.model, amd.memory_mib, amd.sm_count) == ("MI300X", 196_608, 304)
    assert (ascend.model, ascend.memory_mib, ascend.sm_count) == ("Ascend910B", 65_536, 30)
    assert mix_nodes(nodes, parse_mix("amd=0.3,ascend=0.2")) == mixed  # seeded
    assert mix_nodes(nodes, parse_mix("amd=0.3,ascend=0.2"), seed=1) != mixed


def test_pod_runtimes_are_drawn_with_the_shares() -> None:
    pods = trace_pods(6000) + [PodRequest("cpu-only", 1000, 1000)]
    mixed = mix_pods(pods, parse_mix("amd=0.3,ascend=0.1,any=0.2"))
    assert mixed[-1].gpu.runtime is None  # no GPUs: nothing to route
    counts = Counter(p.gpu.runtime for p in mixed[:-1])
    # any: 0.2 of 6,000 = 1,200; of the other 4,800: cuda 0.6 (2,880), rocm 0.3 (1,440), cann 0.1 (480). Within
    # 4.5 standard deviations of each binomial draw.
    for runtime, expected, p in (("any", 1200, 0.2), ("cuda", 2880, 0.48), ("rocm", 1440, 0.24), ("cann", 480, 0.08)):
        assert abs(counts[runtime] - expected) < 4.5 * (6000 * p * (1 - p)) ** 0.5, (runtime, counts)
    # Shapes are kept, but for a share drawn cann: Ascend cards hold no share, so it asks for the whole card.
    pairs = list(zip(pods, mixed, strict=True))
    assert [(p.key, p.gpu.count, 1000 if q.gpu.runtime == "cann" else p.gpu.milli) for p, q in pairs] == [
        (q.key, q.gpu.count, q.gpu.milli) for q in mixed]
    assert sum(1 for p, q in pairs if q.gpu.runtime == "cann" and p.gpu.milli < 1000) > 0
    assert {q.gpu.isolation for q in mixed[:-1]} == {"hook"} and mixed[-1].gpu.isolation is None
    assert mix_pods(pods, parse_mix("amd=0.3,ascend=0.1,any=0.2")) == mixed


def test_only_cuda_pods_keep_their_nvidia_models() -> None:
    named = [PodRequest(f"p{k}", 0, 0, GPURequest(1, models=frozenset({"V100M16"}))) for k in range(200)]
    for pod in mix_pods(named, parse_mix("amd=0.5")):
        assert pod.gpu.models == (frozenset({"V100M16"}) if pod.gpu.runtime == "cuda" else frozenset())


def test_each_pod_goes_to_the_island_of_its_runtime() -> None:
    mix = parse_mix("amd=0.3,ascend=0.2,any=0.3")
    pods = [PodRequest(r, 0, 0, GPURequest(1, runtime=r)) for r in ("cuda", "rocm", "cann")]
    anywhere = [PodRequest(f"any{k}", 0, 0, GPURequest(1, runtime="any")) for k in range(400)]
    cpu_only = [PodRequest(f"cpu{k}", 1000, 0) for k in range(400)]
    where = island_of(pods + anywhere + cpu_only, [NVIDIA, AMD, ASCEND], mix, 0)
    assert where[:3] == [NVIDIA, AMD, ASCEND]
    # Pods that run anywhere (and CPU-only ones) are drawn with the node shares 0.5 / 0.3 / 0.2.
    for drawn in (Counter(where[3:403]), Counter(where[403:])):
        assert set(drawn) == {NVIDIA, AMD, ASCEND} and drawn[NVIDIA] > drawn[AMD] > drawn[ASCEND]
    # A runtime no island's cards run fits nowhere: no island.
    assert island_of(pods, [NVIDIA, AMD], mix, 0) == [NVIDIA, AMD, None]


def test_islands_place_each_pod_only_in_its_vendors_cluster() -> None:
    mix = parse_mix("amd=0.3,ascend=0.2,any=0.3")
    nodes, pods = mix_nodes(trace_nodes(10), mix), mix_pods(trace_pods(300), mix)
    log = replay_islands(nodes, pods, "gpupool", 42, mix=mix)
    submitted = setup(nodes, pods, 42).submitted
    where = island_of(submitted, [NVIDIA, AMD, ASCEND], mix, 0)
    assert log.capacity_milli == 40_000 and log.node is not None and len(log.node) == len(submitted)
    for k, i in enumerate(log.node):
        if i >= 0:
            assert {g.vendor for g in nodes[int(i)].gpus} == {where[k]}
    assert misrouted(nodes, submitted, log) == 0
    with pytest.raises(ValueError, match="needs the vendor mix"):
        replay_islands(nodes, pods, "gpupool", 42)


def test_islands_strand_what_one_pool_uses() -> None:
    """One NVIDIA and one AMD card, pods of one whole GPU that run anywhere: one pool places the first two pods
    (0 % unallocated at arrived = 100 %); islands leave a card idle whenever both went to the same island."""
    mix = parse_mix("amd=0.5,any=1")
    nodes = mix_nodes(trace_nodes(2, gpus=1), mix)
    pods = mix_pods([PodRequest(f"p{k}", 0, 0, GPURequest(1)) for k in range(6)], mix)
    stranded = 0
    for seed in range(20):
        submitted = setup(nodes, pods, seed).submitted  # 130 % of two GPUs: two whole-GPU pods (2,000 <= 2,600)
        assert len(submitted) == 2
        first_two = island_of(submitted, [NVIDIA, AMD], mix, 0)
        expected = 0.0 if first_two[0] != first_two[1] else 50.0
        assert unallocated_pct([replay(nodes, pods, "bestfit", seed)]) == 0.0
        assert unallocated_pct([replay_islands(nodes, pods, "bestfit", seed, mix=mix)]) == expected
        stranded += expected > 0
    assert stranded > 0  # the draw sends both pods to one island on some seeds


# --- measures ------------------------------------------------------------------------------------------------


def log_of(nodes: Sequence[int], gpus: Sequence[int], allocated: Sequence[float], arrived: Sequence[float],
           capacity: int) -> ReplayLog:
    return ReplayLog(np.array(allocated, dtype=float), np.array(arrived, dtype=float), np.zeros(len(allocated)),
                     capacity, 0, 0.0, np.array(nodes, dtype=np.int64), np.array(gpus, dtype=np.int64))


def test_misrouted_counts_pods_on_a_card_of_another_runtime() -> None:
    mixed = Node("m", 1000, 1000, (GPU("m-0", 0, "A100-80GB", 81920), GPU("m-1", 1, "MI300X", 196608, vendor=AMD)))
    submitted = [PodRequest("rocm-ok", 0, 0, GPURequest(1, runtime="rocm")),
                 PodRequest("rocm-wrong", 0, 0, GPURequest(1, runtime="rocm")),
                 PodRequest("cuda-half-wrong", 0, 0, GPURequest(2, runtime="cuda")),
                 PodRequest("any", 0, 0, GPURequest(2, runtime="any")),
                 PodRequest("failed", 0, 0, GPURequest(1, runtime="cann")),
                 PodRequest("unsaid", 0, 0, GPURequest(1))]
    log = log_of([0, 0, 0, 0, -1, 0], [0b10, 0b01, 0b11, 0b11, 0, 0b10], [0] * 6, [0] * 6, 2000)
    assert misrouted([mixed], submitted, log) == 2


def test_combined_unallocated_is_over_the_summed_capacity() -> None:
    # Island A: 8 GPUs, 7.5 allocated at arrived 100 % -> 6.25 % unallocated. Island B: 2 GPUs, 1 allocated ->
    # 50 %. Together: 8.5 of 10 allocated -> 15 %, not the 28.125 % mean of the two.
    a = log_of([0], [1], [7500], [8000], 8000)
    b = log_of([0], [1], [1000], [2000], 2000)
    assert unallocated_pct([a]) == pytest.approx(6.25) and unallocated_pct([b]) == pytest.approx(50.0)
    assert unallocated_pct([a, b]) == pytest.approx(15.0)


def test_compare_on_a_small_cluster_routes_every_pod_and_reports_both() -> None:
    mix = parse_mix("amd=0.3,ascend=0.2,any=0.2")

    def run(fn: Callable[..., ReplayLog], nodes: Sequence[Node], pods: Sequence[PodRequest], jobs: Sequence[Job],
            **options: Any) -> list[ReplayLog]:
        return list(run_all(fn, nodes, pods, jobs, 1, **options))

    out = compare(trace_nodes(20), trace_pods(200), mix, ["gpupool", "bestfit"], [42, 43], run)
    assert out["mix"] == "nvidia=0.5,amd=0.3,ascend=0.2,any=0.2" and out["pods"] == 200
    assert {v: (d["nodes"], d["gpus"]) for v, d in out["vendors"].items()} == {NVIDIA: (10, 40), AMD: (6, 24),
                                                                               ASCEND: (4, 16)}
    for policy in ("gpupool", "bestfit"):
        r = out["policies"][policy]
        assert r["misrouted"] == 0
        assert 0 <= r["unallocated_pct_one_pool"] <= 100 and 0 <= r["unallocated_pct_islands"] <= 100
        assert len(r["one_pool_per_seed"]) == 2 and set(r["unallocated_pct_per_island"]) == {NVIDIA, AMD, ASCEND}


def test_vendor_mix_text_round_trips() -> None:
    mix = VendorMix(((NVIDIA, 0.6), (AMD, 0.4), (ASCEND, 0.0)), 0.1)
    assert parse_mix(mix.text()) == mix


def test_misrouted_counts_a_share_on_a_card_that_cannot_hold_it() -> None:
    node = Node("m", 1000, 1000, (GPU("m-0", 0, "MI300X", 196608, vendor=AMD),
                                  GPU("m-1", 1, "Ascend910B", 65536, vendor=ASCEND)))
    submitted = [PodRequest("any-share-amd", 0, 0, GPURequest(1, 300, runtime="any", isolation="hook")),
                 PodRequest("any-share-ascend", 0, 0, GPURequest(1, 300, runtime="any", isolation="hook")),
                 PodRequest("unsaid-share-ascend", 0, 0, GPURequest(1, 300)),  # the simulator's shares are hook
                 PodRequest("mps-share-amd", 0, 0, GPURequest(1, 300, runtime="any", isolation="mps")),
                 PodRequest("any-whole-ascend", 0, 0, GPURequest(1, runtime="any", isolation="hook")),
                 PodRequest("none-share-ascend", 0, 0, GPURequest(1, 300, isolation="none")),  # nothing to hold
                 PodRequest("cann-share-ascend", 0, 0, GPURequest(1, 300, runtime="cann", isolation="hook"))]
    log = log_of([0] * 7, [0b01, 0b10, 0b10, 0b01, 0b10, 0b10, 0b10], [0] * 7, [0] * 7, 2000)
    # any-share-ascend, unsaid-share-ascend, mps-share-amd and cann-share-ascend
    assert misrouted([node], submitted, log) == 4


def test_shares_that_run_anywhere_never_go_to_the_ascend_island() -> None:
    mix = parse_mix("amd=0.3,ascend=0.2,any=1")
    shares = [PodRequest(f"s{k}", 0, 0, GPURequest(1, 300, runtime="any", isolation="hook")) for k in range(600)]
    wholes = [PodRequest(f"w{k}", 0, 0, GPURequest(1, runtime="any", isolation="hook")) for k in range(600)]
    where = island_of(shares + wholes, [NVIDIA, AMD, ASCEND], mix, 0)
    drawn_shares, drawn_wholes = Counter(where[:600]), Counter(where[600:])
    assert set(drawn_shares) == {NVIDIA, AMD} and drawn_shares[NVIDIA] > drawn_shares[AMD]
    assert set(drawn_wholes) == {NVIDIA, AMD, ASCEND}
    # an mps share: NVIDIA only; with no NVIDIA island it fits nowhere
    mps = [PodRequest(f"m{k}", 0, 0, GPURequest(1, 300, runtime="any", isolation="mps")) for k in range(50)]
    assert set(island_of(mps, [NVIDIA, AMD, ASCEND], mix, 0)) == {NVIDIA}
    assert set(island_of(mps, [AMD, ASCEND], mix, 0)) == {None}


def test_one_pool_keeps_any_shares_off_ascend_cards() -> None:
    mix = parse_mix("amd=0.3,ascend=0.3,any=0.6")
    nodes, pods = mix_nodes(trace_nodes(10), mix), mix_pods(trace_pods(300), mix)
    log = replay(nodes, pods, "gpupool", 42)
    submitted = setup(nodes, pods, 42).submitted
    assert log.node is not None and log.gpus is not None
    on_ascend = [p for k, p in enumerate(submitted) if log.node[k] >= 0
                 and nodes[int(log.node[k])].gpus[0].vendor == ASCEND]
    assert on_ascend and all(p.gpu.whole for p in on_ascend)  # Ascend cards took whole-card pods only
    assert misrouted(nodes, submitted, log) == 0
