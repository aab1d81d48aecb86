"""Team queues in the timeline replay: admission and reclaim with the scheduler's rules, by hand."""

from pathlib import Path

import pytest

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.core.queues import QueueTree
from gpupool.sim.team_queues import QueueFileError, TeamPending, TeamQueues, even_queues, queue_of, queues_from_file
from gpupool.sim.timeline import TimedPod, run_timeline

NODE = Node("n0", 64000, 512000, tuple(GPU(f"g{j}", j, "A100", 81920) for j in range(2)))


def whole(key: str, created: int, runs: int) -> TimedPod:
    return TimedPod(PodRequest(key, 1000, 1024, GPURequest(1)), created, runs, created + runs)


def replay(pods: list[TimedPod], queues: list[str], order: str = "fifo") -> tuple[TeamQueues, object]:
    tree = QueueTree.build(even_queues(2, [NODE]))  # q0 and q1, one GPU guaranteed each
    hooks = TeamQueues(tree, pods, [NODE], assignment=queues)
    log = run_timeline([NODE], pods, "bestfit", 0, queue=TeamPending(hooks, order), hooks=hooks)
    return hooks, log


def test_a_borrower_gives_back_the_owners_guarantee() -> None:
    # q0 runs a1 and a2 from t=0 (a2 borrows q1's idle GPU); b1 of q1 arrives at t=10, within its guarantee:
    # one of q0's pods is evicted (equal priority and run time: the lower index, a1), b1 runs 10-60, then a1
    # starts again at 60 (to run in full). Lost: a1's 10 s on one GPU.
    pods = [whole("a1", 0, 100), whole("a2", 0, 100), whole("b1", 10, 50)]
    hooks, log = replay(pods, ["q0", "q0", "q1"])
    assert log.start.tolist() == [0, 0, 10]  # first starts: nobody waited
    assert log.evicted is not None and log.evicted.tolist() == [1, 0, 0]
    assert log.lost_gpu_s == 10
    s = hooks.summary(log.start, log.created, log.end, log.lost_gpu_s)
    # The replay ends at the trace's last deletion (t=100), a1's second run counting until then:
    # q0 served a1 10 s + a2 100 s + a1 40 s = 150 GPU-s; q1 b1's 50 GPU-s.
    assert hooks.served_milli_s == {"q0": 150_000, "q1": 50_000}
    assert s["q0"]["preemptions"] == 1 and s["q1"]["preemptions"] == 0
    assert s["_lost_gpu_hours"] == round(10 / 3600, 1)


def test_a_pod_beyond_its_guarantee_does_not_reclaim() -> None:
    # b1 and b2 of q1 fill the node from t=0 (b2 borrowing); q1's third pod at t=5 is past q1's guarantee and
    # the cohort is full: it waits for b1 to end at t=50 without evicting anyone.
    pods = [whole("b1", 0, 50), whole("b2", 0, 200), whole("b3", 5, 10)]
    _, log = replay(pods, ["q1", "q1", "q1"])
    assert log.start.tolist() == [0, 0, 50]
    assert log.evicted is not None and log.evicted.tolist() == [0, 0, 0]


def test_fair_order_serves_the_queue_below_its_share_first() -> None:
    # q0 holds one GPU from t=0 to 100; at t=1 a q0 pod and then a q1 pod wait for the other GPU, which frees
    # at t=20. FIFO would start q0's pod first; fair starts q1's (its share 0 < q0's 1).
    pods = [whole("hold", 0, 100), whole("other", 0, 20), whole("a", 1, 5), whole("b", 2, 5)]
    _, log = replay(pods, ["q0", "q1", "q0", "q1"], order="fair")
    # q1's `other` leaves at 20: q1 is below its guarantee, so `b` (q1) goes before `a` (q0).
    assert log.start.tolist()[2:] == [25, 20]


def test_queue_files_and_hashing() -> None:
    assert queue_of("pod-7", ["q0", "q1", "q2"]) == queue_of("pod-7", ["q0", "q1", "q2"])
    assert {queue_of(f"p{i}", ["x", "y"]) for i in range(20)} == {"x", "y"}


def test_bad_queue_file_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "q.yaml"
    bad.write_text("queues:\n  - {name: a, guaranteed: {gpus: lots}}\n")
    with pytest.raises(QueueFileError, match=r"queues\[0\]: GPUQueue a: invalid spec at guaranteed.gpus"):
        queues_from_file(bad)
    bad.write_text("nothing: here\n")
    with pytest.raises(QueueFileError, match="non-empty list `queues`"):
        queues_from_file(bad)
    good = tmp_path / "ok.yaml"
    good.write_text("queues:\n  - {name: a, guaranteed: {gpus: '3'}}\n  - {name: b, weight: 2}\n")
    assert [q.name for q in queues_from_file(good)] == ["a", "b"]


def test_a_share_is_charged_its_memory_fraction_from_the_first_admission() -> None:
    from gpupool.core.queues import QueueSpec, Quota

    # q0 may hold at most one GPU. Each pod asks 10 % of the compute but 61440 of the card's 81920 MiB:
    # charged max(100, 750) = 750 milli. Two of them (1500) pass q0's maximum, so the second waits for the
    # first to end at t=50 even though the node has room.
    gpu = frozenset({"gpu_milli"})
    tree = QueueTree.build([QueueSpec("q0", Quota(1000, 0, 0), Quota(1000, 1 << 62, 1 << 62), dims=gpu),
                            QueueSpec("q1", Quota(1000, 0, 0), dims=gpu)])
    share = GPURequest(1, 100, 61440)
    pods = [TimedPod(PodRequest(k, 1000, 1024, share), 0, runs, runs) for k, runs in (("s1", 50), ("s2", 10))]
    hooks = TeamQueues(tree, pods, [NODE], assignment=["q0", "q0"])
    log = run_timeline([NODE], pods, "bestfit", 0, queue=TeamPending(hooks, "fifo"), hooks=hooks)
    assert log.start.tolist() == [0, 50]
