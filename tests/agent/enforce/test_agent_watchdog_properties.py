"""Invariants of the watchdog's memory rule, over random nodes: pods of one or two GPU containers on two
GPUs, processes of random sizes (some outside any pod), one poll.

- no process of a share (a container on a GPU) that holds no more than its grant is ever stopped;
- after the poll, every share holds no more than its grant;
- no more processes are stopped than needed: putting back the smallest one stopped would exceed the grant.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.agent.enforce.procs import ProcRef
from gpupool.agent.enforce.watchdog import ShareKey, Use, memory_victims
from tests.agent.watchdog_helpers import G0, G1, Container, Node, pod

_grant = st.integers(min_value=1, max_value=40960)
_proc = st.tuples(st.sampled_from([G0, G1]), st.integers(min_value=0, max_value=20000))
_container = st.tuples(st.lists(st.tuples(st.sampled_from([G0, G1]), _grant), min_size=1, max_size=2,
                                unique_by=lambda g: g[0]),
                       st.lists(_proc, max_size=4))
_pod = st.lists(_container, min_size=1, max_size=2)


async def _one_poll(pods: list[list[tuple[list[tuple[str, int]], list[tuple[str, int]]]]],
                    strangers: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        node = Node(Path(directory))
        held: dict[int, tuple[str, str, str, int]] = {}  # pid -> (pod uid, container, GPU, MiB)
        grants: dict[tuple[str, str, str], int] = {}
        pid = 1000
        for i, containers in enumerate(pods):
            cs = [Container(f"c{j}", [(gpu, mib, 10.0) for gpu, mib in grant])
                  for j, (grant, _) in enumerate(containers)]
            p = await node.add(pod(f"p{i}", cs))
            uid = p["metadata"]["uid"]
            for c, (grant, procs) in zip(cs, containers, strict=True):
                grants.update({(uid, c.name, gpu): mib for gpu, mib in grant})
                for gpu, mib in procs:
                    pid += 1
                    node.run(p, c, pid, gpu, mib)
                    held[pid] = (uid, c.name, gpu, mib)
        for gpu, mib in strangers:  # processes of no pod: never judged
            pid += 1
            node.backend.run_process(gpu, pid, mib)
        await node.watchdog.tick(0.0)
        killed = set(node.killer.pids)
        totals: dict[tuple[str, str, str], int] = {}
        for uid, name, gpu, mib in held.values():
            totals[(uid, name, gpu)] = totals.get((uid, name, gpu), 0) + mib
        for share, total in totals.items():
            cap = grants.get(share, 0)
            mine = [p for p, (u, n, g, _) in held.items() if (u, n, g) == share]
            stopped = [held[p][3] for p in mine if p in killed]
            if total <= cap:
                assert not stopped, (share, total, cap)
            left = total - sum(stopped)
            assert left <= cap
            if stopped:
                assert left + min(stopped) > cap  # the last one stopped was needed
        assert killed <= set(held)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=st.lists(_pod, min_size=1, max_size=3), strangers=st.lists(_proc, max_size=3))
def test_one_poll_stops_only_what_exceeds_a_grant_and_no_more_than_needed(
    pods: list[list[tuple[list[tuple[str, int]], list[tuple[str, int]]]]], strangers: list[tuple[str, int]],
) -> None:
    asyncio.run(_one_poll(pods, strangers))


@given(sizes=st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=8),
       limit=st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_victims_are_the_largest_and_leave_the_share_within_its_limit(sizes: list[float], limit: float) -> None:
    key = ShareKey("u", "c", "g")
    uses = [Use(key, pid, ProcRef("u", None), mib, 0.0) for pid, mib in enumerate(sizes, start=1)]
    victims = memory_victims(uses, {key: limit}).get(key, [])
    chosen = [u.used_mib for u in victims]
    assert chosen == sorted(chosen, reverse=True)
    spared = [u.used_mib for u in uses if u not in victims]
    assert not chosen or min(chosen) >= max(spared, default=0.0)  # none spared was larger than one stopped
    assert math.fsum(spared) <= limit
    if victims:  # the last one stopped was needed
        assert math.fsum([*spared, victims[-1].used_mib]) > limit
    if math.fsum(sizes) <= limit:
        assert victims == []
