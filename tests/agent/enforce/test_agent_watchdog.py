"""The watchdog, through its public interface: a fake driver that lists processes by host PID (the same port
as NVML), a temporary /proc tree, the in-memory cluster, a recording killer, and `tick(now)` driven by the
test's own clock (no waiting, no wall-clock asserts)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.agent.enforce.procs import ProcRef, ProcTable
from gpupool.agent.enforce.watchdog import COMPUTE, MEMORY, REFRESH_S, Limit, WatchdogCollector
from tests.agent.watchdog_helpers import G0, G1, NODE, Container, Node, pod, pod_uid, write_proc


async def test_a_container_over_its_memory_loses_its_largest_process_and_its_neighbour_keeps_running(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    a, b = Container("main", [(G0, 10240, 30.0)]), Container("main", [(G0, 20480, 70.0)])
    pa, pb = await node.add(pod("a", [a])), await node.add(pod("b", [b]))
    node.run(pa, a, 101, G0, 4000)
    node.run(pa, a, 102, G0, 3000)
    node.run(pb, b, 201, G0, 15000)
    assert await node.watchdog.tick(0.0) == []  # 7000 of 10240 and 15000 of 20480: nothing to do
    node.run(pa, a, 103, G0, 6000)  # a static binary, unseen by the hook: 13000 MiB > 10240
    actions = await node.watchdog.tick(0.5)  # the next poll
    # largest first until the rest fits: 13000 - 6000 = 7000 <= 10240, so only PID 103
    assert [(x.reason, x.kind, x.pids, x.used, x.limit) for x in actions] == [(MEMORY, "kill", (103,), 13000, 10240)]
    assert node.killer.pids == [103]
    assert [p.pid for p in node.backend.processes(G0)] == [101, 102, 201]  # pod b untouched
    ((name, reason, message),) = node.events()
    assert (name, reason) == ("a", "GPUMemoryOverGrant")
    assert "held 13000 MiB on GPU GPU-w-0, above its grant of 10240 MiB" in message and "103 (6000 MiB)" in message
    assert node.watchdog.stats.kills == {MEMORY: 1, COMPUTE: 0}
    assert await node.watchdog.tick(1.0) == []  # 7000 of 10240 again: nothing more


async def test_the_excess_is_acted_on_at_the_first_poll_after_it_so_within_two_seconds(tmp_path: Path) -> None:
    """Default settings: polls at most 1 s apart, and the first poll that sees the excess stops it."""
    node = Node(tmp_path)
    assert node.config.watchdog_poll_s <= 1.0
    c = Container("main", [(G1, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 300, G1, 1000)
    await node.watchdog.tick(0.0)
    node.run(p, c, 300, G1, 2000)  # the same process grows past its cap
    poll = node.config.watchdog_poll_s
    assert [x.pids for x in await node.watchdog.tick(poll)] == [(300,)]


async def test_the_killed_process_is_not_counted_again_while_the_driver_still_lists_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.killer.driver_forgets = False  # the signal lands, but the driver keeps listing the process a while
    c = Container("main", [(G0, 8000, 50.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 11, G0, 5000)
    node.run(p, c, 12, G0, 4000)
    assert [x.pids for x in await node.watchdog.tick(0.0)] == [(11,)]
    assert await node.watchdog.tick(0.5) == []  # 4000 of 8000 once PID 11 is discounted: PID 12 is spared
    assert node.killer.pids == [11]


async def test_report_only_memory_writes_one_event_per_episode_and_stops_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, watchdog_memory_action="report")
    c = Container("main", [(G0, 2048, 20.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 7, G0, 3000)
    assert [(x.kind, x.pids) for x in await node.watchdog.tick(0.0)] == [("report", ())]
    assert await node.watchdog.tick(0.5) == []  # the same episode: told once
    node.run(p, c, 7, G0, 1000)
    assert await node.watchdog.tick(1.0) == []  # back within its grant: the episode ends
    node.run(p, c, 7, G0, 2500)
    assert [x.kind for x in await node.watchdog.tick(1.5)] == ["report"]  # a new episode is news again
    assert node.killer.pids == [] and [r for _, r, _ in node.events()] == ["GPUMemoryOverGrant"] * 2
    assert node.watchdog.stats.reports[MEMORY] == 2


async def test_compute_far_above_the_cap_for_long_is_reported_then_killed_when_configured(tmp_path: Path) -> None:
    node = Node(tmp_path, watchdog_compute_after_s=30.0, watchdog_compute_margin=25.0)
    c = Container("main", [(G0, 4096, 30.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 40, G0, 1000, sm=90.0)  # 90 > 30 + 25
    assert await node.watchdog.tick(0.0) == []
    assert await node.watchdog.tick(29.5) == []  # not long enough yet
    (action,) = await node.watchdog.tick(30.0)
    assert (action.reason, action.kind, action.used, action.limit) == (COMPUTE, "report", 90.0, 30.0)
    assert await node.watchdog.tick(31.0) == []  # once per episode
    assert node.killer.pids == [] and [r for _, r, _ in node.events()] == ["GPUComputeOverGrant"]

    killing = Node(tmp_path / "k", watchdog_compute_action="kill", watchdog_compute_after_s=5.0)
    c2 = Container("main", [(G1, 4096, 30.0)])
    p2 = await killing.add(pod("p", [c2]))
    killing.run(p2, c2, 50, G1, 1000, sm=45.0)
    killing.run(p2, c2, 51, G1, 1000, sm=40.0)  # 85 together
    await killing.watchdog.tick(0.0)
    assert [x.pids for x in await killing.watchdog.tick(5.0)] == [(50, 51)]
    assert killing.watchdog.stats.kills[COMPUTE] == 2


async def test_compute_that_dips_under_restarts_the_window_and_elastic_pods_may_borrow(tmp_path: Path) -> None:
    node = Node(tmp_path, watchdog_compute_action="kill", watchdog_compute_after_s=10.0)
    hard, elastic = Container("main", [(G0, 4096, 20.0)]), Container("main", [(G1, 4096, 20.0)])
    ph = await node.add(pod("hard", [hard]))
    pe = await node.add(pod("elastic", [elastic], cores_mode="elastic"))
    node.run(ph, hard, 60, G0, 100, sm=80.0)
    node.run(pe, elastic, 61, G1, 100, sm=100.0)
    await node.watchdog.tick(0.0)
    node.run(ph, hard, 60, G0, 100, sm=40.0)  # 40 <= 20 + 25: the window starts over
    await node.watchdog.tick(9.0)
    node.run(ph, hard, 60, G0, 100, sm=80.0)
    assert await node.watchdog.tick(12.0) == []  # over again only since 12
    assert [x.pids for x in await node.watchdog.tick(22.0)] == [(60,)]
    assert 61 not in node.killer.pids  # elastic: lent idle time, never held to its cores


async def test_a_mode_without_a_second_line_and_processes_outside_pods_are_never_judged(tmp_path: Path) -> None:
    node = Node(tmp_path)
    m = Container("main", [(G0, 1024, 10.0)])
    n = Container("main", [(G1, 1024, 10.0)])
    pm = await node.add(pod("mps", [m], isolation="mps"))
    pn = await node.add(pod("none", [n], isolation="none"))
    node.run(pm, m, 70, G0, 9000)
    node.run(pn, n, 71, G1, 9000)
    write_proc(node.proc, 72, "", None)  # a host process
    node.backend.run_process(G0, 72, 30000)
    node.backend.run_process(G1, 73, 30000)  # a PID the agent cannot see at all (no /proc entry)
    assert await node.watchdog.tick(0.0) == []
    assert node.killer.pids == []
    assert node.watchdog.stats.unmapped == 1


async def test_a_container_without_a_grant_may_hold_nothing_and_unknown_containers_count_pod_wide(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    train, sidecar = Container("train", [(G0, 4096, 50.0)]), Container("logs", [])
    p = await node.add(pod("p", [train, sidecar]))
    node.run(p, sidecar, 80, G0, 500)  # GPU memory from a container granted none
    node.run(p, train, 81, G0, 4000)
    actions = await node.watchdog.tick(0.0)
    assert [(x.key.container, x.pids, x.limit) for x in actions] == [("logs", (80,), 0.0)]
    # a single GPU container: a process whose container ID the status does not show yet counts against it
    solo = Container("main", [(G1, 2048, 50.0)])
    q = await node.add(pod("q", [solo]))
    write_proc(node.proc, 90, q["metadata"]["uid"], "f" * 64)
    node.backend.run_process(G1, 90, 3000)
    assert [(x.key.container, x.pids) for x in await node.watchdog.tick(0.5)] == [("main", (90,))]


async def test_two_gpu_containers_are_each_held_to_their_own_share(tmp_path: Path) -> None:
    node = Node(tmp_path)
    a, b = Container("a", [(G0, 4000, 40.0)]), Container("b", [(G0, 6000, 40.0)])
    p = await node.add(pod("p", [a, b]))
    node.run(p, a, 100, G0, 4500)  # a over (4500 > 4000) though the pod (4500 + 1000) is under 10000
    node.run(p, b, 101, G0, 1000)
    assert [(x.key.container, x.pids) for x in await node.watchdog.tick(0.0)] == [("a", (100,))]
    # where the container cannot be told (ID not in the status), the pod's total is the limit
    write_proc(node.proc, 102, p["metadata"]["uid"], "e" * 64)
    node.backend.run_process(G0, 102, 9500)
    assert await node.watchdog.tick(0.5) == []  # 9500 <= 10000
    node.backend.run_process(G0, 102, 10500)
    assert [(x.key.container, x.pids, x.limit) for x in await node.watchdog.tick(1.0)] == [("", (102,), 10000)]


async def test_a_pod_newer_than_the_last_list_is_judged_at_its_first_poll(tmp_path: Path) -> None:
    node = Node(tmp_path)
    await node.watchdog.tick(0.0)  # lists the (empty) node
    c = Container("main", [(G0, 1024, 10.0)])
    p = await node.add(pod("late", [c]))
    node.run(p, c, 110, G0, 2048)
    assert [x.pids for x in await node.watchdog.tick(0.5)] == [(110,)]  # listed again at once, not after 10 s


async def test_finished_pods_and_broken_allocations_are_not_tenants(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = Container("main", [(G0, 1024, 10.0)])
    done = pod("done", [c], phase="Succeeded")
    await node.add(done)
    broken = pod("broken", [Container("main", [(G0, 1024, 10.0)])])
    broken["metadata"]["annotations"]["gpupool.io/allocation"] = "{not json"
    await node.add(broken)
    node.run(done, c, 120, G0, 5000)
    assert await node.watchdog.tick(0.0) == []
    assert set(node.watchdog.tenants) == set()


async def test_the_metrics_count_kills_and_reports_by_reason(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = Container("main", [(G0, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 130, G0, 2000)
    await node.watchdog.tick(0.0)
    registry = CollectorRegistry()
    registry.register(WatchdogCollector(node.watchdog))
    text = generate_latest(registry).decode()
    assert 'gpupool_watchdog_kills_total{reason="memory"} 1.0' in text
    assert 'gpupool_watchdog_kills_total{reason="compute"} 0.0' in text
    assert "gpupool_watchdog_polls_total 1.0" in text


async def test_an_event_the_api_refuses_does_not_undo_or_stop_the_kill(tmp_path: Path) -> None:
    node = Node(tmp_path)

    async def refuse(event: dict[str, Any]) -> None:
        raise RuntimeError("forbidden")

    node.cluster.create_event = refuse  # type: ignore[method-assign]
    c = Container("main", [(G0, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 140, G0, 2000)
    assert [x.pids for x in await node.watchdog.tick(0.0)] == [(140,)]
    assert node.killer.pids == [140] and node.watchdog.stats.errors == 1


async def test_a_gpu_the_driver_cannot_answer_for_is_skipped_and_the_others_still_judged(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = Container("main", [(G1, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 150, G1, 2000)
    node.backend.remove(G0)  # fell off the bus: its process query fails
    assert [x.pids for x in await node.watchdog.tick(0.0)] == [(150,)]
    assert node.watchdog.stats.errors == 1


@pytest.mark.parametrize("slack", [0, 512])
async def test_the_memory_slack_is_tolerated_above_the_cap(tmp_path: Path, slack: int) -> None:
    node = Node(tmp_path, watchdog_memory_slack_mib=slack)
    c = Container("main", [(G0, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 160, G0, 1024 + 256)
    assert bool(await node.watchdog.tick(0.0)) is (slack < 256)


def test_proc_table_reads_the_pod_and_container_of_a_pid(tmp_path: Path) -> None:
    write_proc(tmp_path, 5, "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e", "a" * 64)
    table = ProcTable(tmp_path)
    assert table.ref(5) == ProcRef("6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e", "a" * 64)
    assert table.ref(6) is None and not table.exists(6)


async def test_an_agent_that_cannot_see_the_hosts_processes_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    node.backend.run_process(G0, 4242, 1000)  # no /proc entry: the agent runs in its own PID namespace
    node.backend.run_process(G1, 4343, 1000)
    await node.watchdog.tick(0.0)
    await node.watchdog.tick(0.5)
    warnings = [r.getMessage() for r in caplog.records if "hostPID" in r.getMessage()]
    assert len(warnings) == 1 and "none of the 2 GPU process(es)" in warnings[0]
    assert node.watchdog.stats.unmapped == 2


async def test_a_process_without_a_new_utilisation_sample_keeps_its_last_one(tmp_path: Path) -> None:
    """Drivers sample on their own period: a poll may get no sample newer than the last for a process;
    its compute is then its last sample, not zero (which would end every episode at once)."""
    node = Node(tmp_path, watchdog_compute_after_s=1.0)
    c = Container("main", [(G0, 4096, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 170, G0, 100, sm=70.0)
    await node.watchdog.tick(0.0)
    stale = node.backend.process_utilization

    def no_new_samples(uuid: str, since_us: int) -> tuple[()]:
        return ()

    node.backend.process_utilization = no_new_samples  # type: ignore[method-assign]
    (action,) = await node.watchdog.tick(1.0)
    assert (action.reason, action.used) == (COMPUTE, 70.0)
    assert stale(G0, 0)[0].sm_percent == 70.0  # the driver would still say so


async def test_a_slow_api_server_never_holds_up_acting_on_the_pods_already_known(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = Container("main", [(G0, 1024, 10.0)])
    p = await node.add(pod("p", [c]))
    node.run(p, c, 180, G0, 512)
    await node.watchdog.tick(0.0)  # the pods are known
    answer = asyncio.Event()
    listing = node.watchdog.cluster.list_pods_on_node

    async def stuck(name: str) -> list[dict[str, Any]]:
        await answer.wait()
        return await listing(name)

    node.watchdog.cluster.list_pods_on_node = stuck  # type: ignore[method-assign]
    node.run(p, c, 181, G0, 2048)
    # the periodic list is due, and does not come: the poll acts on the last one (the timeout only guards
    # against a hang)
    actions = await asyncio.wait_for(node.watchdog.tick(REFRESH_S), timeout=30)
    assert [x.pids for x in actions] == [(181,)]
    answer.set()
    await asyncio.wait_for(node.watchdog.tick(REFRESH_S + 0.5), timeout=30)


# --- pods served through DRA claims ------------------------------------------------------------------------


def claim_pod(name: str, claims: dict[str, str | None], generated: dict[str, str] | None = None) -> dict[str, Any]:
    """A running pod using claims (entry name -> ResourceClaim name, None: made from a template, whose name
    the status records in `generated`), without gpupool's allocation annotation."""
    return {
        "metadata": {"name": name, "namespace": "team", "uid": pod_uid()},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}, {"name": "side"}],
                 "resourceClaims": [{"name": k, **({"resourceClaimName": v} if v else
                                                   {"resourceClaimTemplateName": "t"})} for k, v in claims.items()]},
        "status": {"phase": "Running",
                   "resourceClaimStatuses": [{"name": k, "resourceClaimName": v} for k, v in (generated or {}).items()],
                   "containerStatuses": [{"name": "main", "containerID": "containerd://" + "a" * 64},
                                         {"name": "side", "containerID": "containerd://" + "b" * 64}]},
    }


async def test_a_pod_over_its_claims_share_loses_its_largest_process(tmp_path: Path) -> None:
    """The claims the agent prepared (namespace/name -> GPU -> share) hold the pods using them, all their
    containers together: two claims of 4096 and 2048 MiB on G0 hold the pod to 6144 MiB there."""
    node = Node(tmp_path)
    node.watchdog.claims = lambda: {"team/named": {G0: Limit(4096, 30.0, elastic=False)},
                                    "team/made-x7": {G0: Limit(2048, 20.0, elastic=False)}}
    p = await node.add(claim_pod("p", {"a": "named", "b": None}, generated={"b": "made-x7"}))
    main, side = Container("main", [], cid="a" * 64), Container("side", [], cid="b" * 64)
    node.run(p, main, 301, G0, 3000)
    node.run(p, side, 302, G0, 3000)
    assert await node.watchdog.tick(0.0) == []  # 6000 of 6144: within
    node.run(p, side, 303, G0, 1000)  # 7000 MiB > 6144
    actions = await node.watchdog.tick(0.5)
    assert [(x.reason, x.kind, x.used, x.limit) for x in actions] == [(MEMORY, "kill", 7000, 6144)]
    assert node.killer.pids == [302]  # the largest (the newer of two equals) until the rest fits: 4000 <= 6144


async def test_pods_whose_claims_are_not_held_by_the_second_line_are_left_alone(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.watchdog.claims = lambda: {"team/other": {G0: Limit(1024, 10.0, elastic=False)}}
    p = await node.add(claim_pod("q", {"a": "not-prepared-here"}))
    node.run(p, Container("main", [], cid="a" * 64), 401, G0, 30000)
    assert await node.watchdog.tick(0.0) == [] and node.killer.pids == []
