"""The pool snapshot: what the views are told about GPUs, grants, pending pods and totals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpupool.api.snapshot import Snapshot, build_snapshot, split_key
from gpupool.core.policy import TaskShape
from tests.pool_helpers import MEM, give
from tests.pool_helpers import make_cluster as cluster


def test_grants_sharers_and_totals() -> None:
    state = cluster()
    give(state, "team-a/train", "n0", 0, 300, 10240)
    give(state, "team-b/infer", "n0", 0, 200, 8192)
    give(state, "team-a/whole", "n1", 1, 1000, MEM)
    snap = build_snapshot(state, {"team-c/big": "needs 2 GPUs", "team-c/a": "no A100"}, containers={
        "team-a/train": "trainer"})

    gpu0 = snap.nodes[0].gpus[0]
    assert [(g.namespace, g.pod, g.container) for g in gpu0.grants] == [
        ("team-a", "train", "trainer"), ("team-b", "infer", "")]
    assert gpu0.sharers == 2
    assert gpu0.allocated_cores_percent == 50.0  # 30 % + 20 %
    assert gpu0.allocated_memory_mib == 18432  # 10240 + 8192
    assert snap.nodes[1].gpus[1].grants[0].cores_percent == 100.0
    assert snap.nodes[1].gpus[0].grants == []

    t = snap.totals
    assert (t.nodes, t.gpus, t.healthy_gpus, t.grants, t.gpu_pods, t.pending) == (2, 4, 4, 3, 3, 2)
    # compute handed out: 300 + 200 + 1000 = 1500 of 4000 milli
    assert t.allocated_share == pytest.approx(0.375)
    # memory: 10240 + 8192 + 40960 = 59392 of 4 * 40960 = 163840
    assert t.allocated_memory_share == pytest.approx(59392 / 163840)
    # default workload (one whole GPU): only GPU n0/0 is partly used, stranding its free 500 milli
    assert t.fragmented_share == pytest.approx(500 / 4000)
    assert [(p.namespace, p.pod, p.reason) for p in snap.pending] == [
        ("team-c", "a", "no A100"), ("team-c", "big", "needs 2 GPUs")]


def test_state_keys_are_translated_to_pod_names() -> None:
    state = cluster()
    give(state, "3f1c-uid", "n0", 1, 250, 1024)  # the scheduler's ledger keys pods by UID
    snap = build_snapshot(state, {}, names={"3f1c-uid": "team-a/train"}, containers={"3f1c-uid": "main"})
    (grant,) = snap.grants()
    assert (grant.namespace, grant.pod, grant.container, grant.gpu_index) == ("team-a", "train", "main", 1)


def test_released_pod_disappears() -> None:
    state = cluster()
    give(state, "ns/a", "n0", 0, 500, 1024)
    state.release("ns/a")
    snap = build_snapshot(state, {})
    assert snap.grants() == []
    assert snap.totals.allocated_share == 0.0
    assert snap.nodes[0].gpus[0].sharers == 0


def test_unhealthy_gpu_is_reported_and_not_counted_as_fragment() -> None:
    state = cluster(nodes=1, gpus=2)
    give(state, "ns/a", "n0", 0, 400, 1024)
    state.set_gpu_health("n0", 0, False)
    snap = build_snapshot(state, {})
    assert [g.healthy for g in snap.nodes[0].gpus] == [False, True]
    assert snap.totals.healthy_gpus == 1
    assert snap.totals.fragmented_share == 0.0  # the only partly used GPU cannot host anything anyway


def test_workload_changes_the_fragmentation_measure() -> None:
    state = cluster(nodes=1, gpus=2)
    give(state, "ns/a", "n0", 0, 300, 1024)  # GPU 0 has 700 milli free
    half = TaskShape(cpu_milli=0, gpu_milli=500, gpu_count=1)
    big = TaskShape(cpu_milli=0, gpu_milli=800, gpu_count=1)
    assert build_snapshot(state, {}, workload=[half]).totals.fragmented_share == 0.0  # 700 >= 500 usable
    # for 0.8-GPU tasks the 700 free are stranded: 700 / 2000
    assert build_snapshot(state, {}, workload=[big]).totals.fragmented_share == pytest.approx(0.35)
    # popularity-weighted: 3/4 * 0 + 1/4 * 700 = 175 of 2000
    mixed = [TaskShape(0, 500, 1, weight=3.0), TaskShape(0, 800, 1, weight=1.0)]
    assert build_snapshot(state, {}, workload=mixed).totals.fragmented_share == pytest.approx(175 / 2000)


def test_pending_age_uses_the_time_passed_in() -> None:
    snap = build_snapshot(cluster(), {"ns/a": "x", "ns/b": "y", "ns/c": "z"},
                          pending_since={"ns/a": 1000.0, "ns/b": 1200.0}, now=1300.0)
    assert snap.taken_at == 1300.0
    assert snap.totals.oldest_pending_seconds == 300.0
    assert [p.since for p in snap.pending] == [1000.0, 1200.0, None]
    assert build_snapshot(cluster(), {"ns/a": "x"}).totals.oldest_pending_seconds is None


def test_json_round_trip_and_validation() -> None:
    state = cluster()
    give(state, "ns/a", "n1", 1, 250, 2048)
    snap = build_snapshot(state, {"ns/b": "waiting"}, now=5.0)
    assert Snapshot.model_validate_json(snap.model_dump_json()) == snap
    doc = snap.model_dump()
    doc["nodes"][1]["gpus"][1]["allocated_cores_percent"] = 150
    with pytest.raises(ValidationError, match="allocated_cores_percent"):
        Snapshot.model_validate(doc)
    doc = snap.model_dump()
    doc["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        Snapshot.model_validate(doc)


def test_split_key() -> None:
    assert split_key("ns/pod") == ("ns", "pod")
    assert split_key("trace-pod-7") == ("", "trace-pod-7")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 10), st.booleans()), max_size=40))
def test_views_agree_with_the_state(ops: list[tuple[int, int, bool]]) -> None:
    """Whatever the history of allocations and releases, per-GPU figures equal the sum of the grants."""
    state = cluster(nodes=2, gpus=3)
    for n, (slot, tenths, release) in enumerate(ops):
        key = f"ns/p{n % 12}"
        if release or key in state.held:
            state.release(key)
            continue
        node, gpu = f"n{slot % 2}", slot % 3
        milli = tenths * 100
        i = state.index[node]
        if state.gpu_milli_free[i, gpu] >= milli:
            give(state, key, node, gpu, milli, MEM * milli // 1000)
    snap = build_snapshot(state, {})
    total_cores = 0.0
    for node in snap.nodes:
        for gpu in node.gpus:
            assert gpu.sharers == len(gpu.grants)
            assert gpu.allocated_cores_percent == pytest.approx(sum(g.cores_percent for g in gpu.grants))
            assert gpu.allocated_memory_mib == sum(g.memory_mib for g in gpu.grants)
            assert all(g.node == node.name and g.gpu_uuid == gpu.uuid for g in gpu.grants)
            total_cores += gpu.allocated_cores_percent
    assert snap.totals.grants == len(state.held) == len(snap.grants())
    assert snap.totals.allocated_share == pytest.approx(total_cores / 100 / snap.totals.gpus)
    assert 0.0 <= snap.totals.fragmented_share <= 1.0 - snap.totals.allocated_share + 1e-9
