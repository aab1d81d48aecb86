"""The views over the real scheduler: the embedded cluster and extender of `gpupool demo`, driven over
HTTP by its fake kube-scheduler, with the dashboard and the pool metrics served on the same event loop
(as the scheduler will mount them) and read back over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.dashboard import create_dashboard
from gpupool.demo.embedded import NodeGroup, PodShape, Scenario, Workload, start_embedded, workload_pods
from gpupool.demo.kube_scheduler import KubeSchedulerDriver, Outcome
from gpupool.exporter import PoolCollector, metrics_route
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.server import serve_in_background


def scenario() -> Scenario:
    # 2 nodes x 2 GPUs; the mix overflows them so that some pods stay pending with a reason
    return Scenario(
        name="observe", seed=3,
        nodes=[NodeGroup(prefix="gpu", count=2, model="A100-80GB", gpus=2, gpu_memory_mib=81920, cpu=64)],
        workload=Workload(pods=14, namespace="obs", mix=[PodShape(weight=3, cores=30), PodShape(weight=1)]),
    )


async def watch_confirmed(ledger: Any, placed: set[str], timeout_s: float = 30.0) -> None:
    """Wait until the scheduler's pod watch has confirmed exactly the pods the driver saw bound (no bind
    still only assumed): the state the views are then checked against. Fails, saying what is missing, if
    that does not happen within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        confirmed = {e.key for e in ledger.confirmed().values()}
        assumed = {e.key for e in ledger.assumed().values()}
        if confirmed == placed and not assumed:
            return
        if loop.time() > deadline:
            raise AssertionError(f"the watch did not confirm the binds within {timeout_s:g} s: not confirmed "
                                 f"{sorted(placed - confirmed)}, unexpected {sorted(confirmed - placed)}, "
                                 f"still assumed {sorted(assumed)}")
        await asyncio.sleep(0.01)


async def test_views_follow_the_real_scheduler() -> None:
    emb = await start_embedded(scenario(), SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0))
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=3)
    pending: dict[str, str] = {}
    placed: dict[str, str] = {}

    def on_outcome(o: Outcome) -> None:
        if o.node is None:
            pending[o.pod] = o.reason
        else:
            placed[o.pod] = o.node

    ledger = emb.service.ledger

    def provider() -> Snapshot:
        names = {uid: e.key for uid, e in ledger.entries.items()}
        return build_snapshot(ledger.state, pending, names=names)

    views = Starlette(routes=[metrics_route(CollectorRegistry(), pool=PoolCollector(provider))])
    views.mount("/ui", create_dashboard(provider, cache_s=0))  # the test reads right after changes
    handle = await serve_in_background(views)
    try:
        await driver.run(workload_pods(emb.scenario), on_outcome)
        assert placed and pending, "the scenario should both place and refuse pods"
        await watch_confirmed(ledger, set(placed))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{handle.port}", timeout=30) as client:
            snap = Snapshot.model_validate_json((await client.get("/ui/api/snapshot")).content)
            shown = {f"{g.namespace}/{g.pod}": g.node for g in snap.grants()}
            assert shown == placed  # every bound pod, by name, on the node the scheduler chose
            assert {f"{p.namespace}/{p.pod}" for p in snap.pending} == set(pending)
            state = ledger.state
            assert snap.totals.allocated_share == state.allocated_milli() / (1000 * state.total_gpus)
            assert snap.gpu_count() == 4

            page = (await client.get("/ui/")).text
            some_pod = next(iter(placed))
            assert f'data-pod="{some_pod}"' in page

            def grant_pods(text: str) -> set[str]:
                return {f"{s.labels['namespace']}/{s.labels['pod']}" for f in text_string_to_metric_families(text)
                        for s in f.samples if s.name == "gpupool_grant_cores_ratio"}

            assert grant_pods((await client.get("/metrics")).text) == set(placed)

            # a deleted pod leaves the views once the scheduler's watch sees it go
            namespace, name = some_pod.split("/")
            await emb.cluster.delete_pod(namespace, name)
            for _ in range(200):
                if some_pod not in grant_pods((await client.get("/metrics")).text):
                    break
                await asyncio.sleep(0.05)
            assert grant_pods((await client.get("/metrics")).text) == set(placed) - {some_pod}
            assert f'data-pod="{some_pod}"' not in (await client.get("/ui/fragment")).text
    finally:
        await handle.stop()
        await driver.close()
        await emb.stop()
