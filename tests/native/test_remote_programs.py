"""Remote mode: the hook tests' own programs (fakes/probe.c) give the same answers through the forwarder as
locally. The client runs the probe with libgpupool_remote.so as its libcuda.so.1; the server runs the fake
driver with gpupool's interception library preloaded and the share's limits (docs/remote.md). The memory cap
and the compute share are the same code and limits as a local `hook` pod, so the same numbers must come out:
the expectations are the hook tests' hand-computed ones."""

from __future__ import annotations

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, Probe, active_window, busy_share
from tests.native.remote_helpers import NOT_SUPPORTED, Remote, remote, remote_built, start_probe, wait_for

__all__ = ["remote", "remote_built"]  # fixtures

OOM = 2
SHARE = 10 * GIB
S = 1_000_000_000
PATHS = ["direct", "dlsym", "gpa", "gpa2"]


def memory_session(probe: Probe) -> list[list[int]]:
    """test_hook_memory's 10 GiB sequence for kind `mem`, every answer recorded (allocation ids are not:
    they are device pointers, whatever the driver hands out)."""
    answers = []
    handles = []
    for _ in range(10):
        rc, handle = probe.alloc("mem", GIB)
        answers.append([rc])
        handles.append(handle)
    answers.append([probe.alloc("mem", 1)[0]])
    answers.append([probe.alloc("mem", 16)[0]])
    answers.append(probe.ask("info"))
    answers.append(probe.ask(f"free mem {handles.pop()}"))
    answers.append(probe.ask("info"))
    answers.append([probe.alloc("mem", GIB)[0]])
    answers.append([probe.alloc("mem", 16)[0]])
    answers.append(probe.ask("total"))
    return answers


EXPECTED = [[0]] * 10 + [[OOM], [OOM], [0, 0, SHARE], [0], [0, GIB, SHARE], [0], [OOM], [0, SHARE]]


@pytest.mark.parametrize("path", PATHS)
def test_the_memory_cap_answers_the_same_through_the_forwarder(remote: Remote, pods: PodFactory, path: str) -> None:
    local = pods.start(pods.pod(memory_mib="10240", granted=True), path)
    assert memory_session(local) == EXPECTED
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    assert memory_session(remote.probe(server, token, path)) == EXPECTED


def test_three_client_processes_share_one_cap_on_the_server(remote: Remote) -> None:
    server = remote.server()
    token, pod = server.share(memory_mib="10240")
    a, b, c = (remote.probe(server, token) for _ in range(3))
    assert a.alloc("mem", 4 * GIB)[0] == 0
    assert b.alloc("mem", 4 * GIB)[0] == 0
    assert c.alloc("mem", 3 * GIB)[0] == OOM
    assert c.alloc("mem", 2 * GIB)[0] == 0
    for p in (a, b, c):
        assert p.ask("info") == [0, 0, SHARE]
    a.close()  # its connection ends: its worker exits and its 4 GiB return to the share
    assert wait_for(lambda: len(server.workers_of(pod)) == 2)
    assert c.alloc("mem", 4 * GIB)[0] == 0
    assert b.ask("info") == [0, 0, SHARE]


def test_two_shares_on_one_server_keep_their_own_caps(remote: Remote) -> None:
    server = remote.server()
    small, _ = server.share(memory_mib="10240")
    big, _ = server.share(memory_mib="20480")
    a, b = remote.probe(server, small), remote.probe(server, big)
    assert a.alloc("mem", SHARE)[0] == 0
    assert b.alloc("mem", 2 * SHARE)[0] == 0
    assert b.alloc("mem", 1)[0] == OOM
    assert a.ask("total") == [0, SHARE] and b.ask("total") == [0, 2 * SHARE]


def test_the_tenants_environment_cannot_raise_its_cap(remote: Remote) -> None:
    """The limits are the server's: the client's GPUPOOL_* variables never reach the process that enforces."""
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    greedy = start_probe(remote.rb, server.address, token, extra={"GPUPOOL_MEMORY_LIMIT_MIB": "81920"})
    remote.probes.append(greedy)
    assert greedy.alloc("mem", SHARE)[0] == 0
    assert greedy.alloc("mem", 1)[0] == OOM


@pytest.mark.parametrize("kind", ["managed", "async", "pool", "vmm", "array", "pitch", "mem1"])
def test_allocation_calls_that_are_not_forwarded_fail_cleanly(remote: Remote, kind: str) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    probe = remote.probe(server, token, "dlsym")
    assert probe.alloc(kind, GIB)[0] == NOT_SUPPORTED
    assert probe.alloc("mem", GIB)[0] == 0  # and the context carries on
    assert probe.close() == ""


# ---- compute: the share's pacing runs in the server's worker; the fake device's log names the worker ------
KERNEL_BLOCKS = 2000


def launches(probe: Probe, seconds: float, kind: str = "kernel") -> int:
    probe.send(f"launch {kind} {KERNEL_BLOCKS} {seconds} 4")
    assert probe.proc.stdout is not None
    rc, count = (int(x) for x in probe.proc.stdout.readline().split())
    assert rc == 0
    return count


@pytest.mark.parametrize(("kind", "path"), [("kernel", "direct"), ("kernel", "gpa2"), ("kernel_ptsz", "gpa"),
                                            ("ex", "dlsym")])
def test_one_share_at_30_gets_30_through_the_forwarder(remote: Remote, kind: str, path: str) -> None:
    server = remote.server()
    token, pod = server.share(cores="30")
    probe = remote.probe(server, token, path)
    assert launches(probe, 1.5, kind) > 0
    (worker,) = server.workers_of(pod)
    window = active_window(remote.device, [worker], 4 * S // 10, S // 10)
    assert busy_share(remote.device, {worker}, *window) == pytest.approx(0.30, abs=0.05)


def test_two_shares_at_30_and_70_each_get_their_cap_through_the_forwarder(remote: Remote) -> None:
    server = remote.server()
    ta, pa = server.share(cores="30")
    tb, pb = server.share(cores="70")
    a, b = remote.probe(server, ta), remote.probe(server, tb)
    for p in (a, b):
        p.send(f"launch kernel {KERNEL_BLOCKS} 2.5 4")
    for p in (a, b):
        assert p.proc.stdout is not None and p.proc.stdout.readline().split()[0] == "0"
    (wa,), (wb,) = server.workers_of(pa), server.workers_of(pb)
    window = active_window(remote.device, [wa, wb], 4 * S // 10, S // 10)
    assert busy_share(remote.device, {wa}, *window) == pytest.approx(0.30, abs=0.05)
    assert busy_share(remote.device, {wb}, *window) == pytest.approx(0.70, abs=0.05)


def test_a_remote_share_and_a_local_pod_split_the_gpu_by_their_caps(remote: Remote, pods: PodFactory) -> None:
    """One device, a local `hook` pod at 40 and a remote share at 60: the same pacing holds them both."""
    server = remote.server()
    token, pod = server.share(cores="60")
    local = pods.start(pods.pod(cores="40"))
    far = remote.probe(server, token)
    for p in (local, far):
        p.send(f"launch kernel {KERNEL_BLOCKS} 2.5 4")
    for p in (local, far):
        assert p.proc.stdout is not None and p.proc.stdout.readline().split()[0] == "0"
    (worker,) = server.workers_of(pod)
    window = active_window(remote.device, [local.pid, worker], 4 * S // 10, S // 10)
    assert busy_share(remote.device, {local.pid}, *window) == pytest.approx(0.40, abs=0.05)
    assert busy_share(remote.device, {worker}, *window) == pytest.approx(0.60, abs=0.05)
