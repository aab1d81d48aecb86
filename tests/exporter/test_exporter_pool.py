"""Pool metrics scraped over HTTP from a real uvicorn server and parsed with prometheus_client."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.core.state import ClusterState
from gpupool.exporter import POOL_METRICS, PoolCollector, create_metrics_app
from gpupool.exporter.http import render
from gpupool.scheduler.metrics import SchedulerMetrics

MIB = 1024 * 1024


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def value(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lv, v in series[name] if all(lv.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, series.get(name))
    return hits[0]


def test_pool_metrics_over_http(cluster: ClusterState, serve_app: Any, give_pod: Any) -> None:
    give_pod(cluster, "team-a/train", "n0", 0, 300, 10240)
    give_pod(cluster, "team-b/infer", "n0", 0, 200, 8192)
    give_pod(cluster, "team-a/whole", "n1", 1, 1000, 40960)
    pending = {"team-c/wait": "no fit"}
    pool = PoolCollector(lambda: build_snapshot(cluster, pending, containers={"team-a/train": "main"}))
    with serve_app(create_metrics_app(CollectorRegistry(), pool)) as url:
        m = scrape(url)
        assert value(m, "gpupool_snapshot_up") == 1
        assert value(m, "gpupool_gpu_sharers", node="n0", gpu="0", uuid="GPU-0-0") == 2
        assert value(m, "gpupool_gpu_cores_allocated_ratio", uuid="GPU-0-0") == pytest.approx(0.5)
        assert value(m, "gpupool_gpu_memory_allocated_bytes", uuid="GPU-0-0") == 18432 * MIB
        assert value(m, "gpupool_gpu_memory_bytes", uuid="GPU-1-1") == 40960 * MIB
        assert value(m, "gpupool_gpu_info", uuid="GPU-1-1", model="A100") == 1
        assert value(m, "gpupool_gpu_healthy", uuid="GPU-1-0") == 1
        assert value(m, "gpupool_grant_cores_ratio", namespace="team-a", pod="train", container="main",
                     node="n0", gpu="0", uuid="GPU-0-0") == pytest.approx(0.3)
        assert value(m, "gpupool_grant_memory_bytes", pod="infer", container="") == 8192 * MIB
        assert len(m["gpupool_grant_cores_ratio"]) == 3
        # (300 + 200 + 1000) / 4000 milli
        assert value(m, "gpupool_pool_allocated_ratio") == pytest.approx(0.375)
        assert value(m, "gpupool_pool_fragmented_ratio") == pytest.approx(500 / 4000)
        assert value(m, "gpupool_pool_gpus") == 4
        assert value(m, "gpupool_pool_gpu_pods") == 3
        assert value(m, "gpupool_pending_gpu_pods") == 1
        assert "gpupool_pending_gpu_pod_oldest_seconds" not in m  # no wait times were given

        cluster.release("team-b/infer")
        cluster.set_gpu_health("n1", 0, False)
        m = scrape(url)
        assert value(m, "gpupool_gpu_sharers", uuid="GPU-0-0") == 1
        assert [lv["pod"] for lv, _ in m["gpupool_grant_cores_ratio"]] == ["train", "whole"]
        assert value(m, "gpupool_gpu_healthy", uuid="GPU-1-0") == 0
        assert value(m, "gpupool_pool_healthy_gpus") == 3


def test_every_documented_metric_is_produced(cluster: ClusterState, give_pod: Any) -> None:
    give_pod(cluster, "ns/a", "n0", 1, 500, 1024)
    registry = CollectorRegistry()
    PoolCollector(lambda: build_snapshot(cluster, {"ns/b": "x"}, pending_since={"ns/b": 10.0}, now=70.0), registry)
    m = samples(generate_latest(registry).decode())
    assert set(POOL_METRICS) <= set(m)
    assert value(m, "gpupool_pending_gpu_pod_oldest_seconds") == 60.0
    assert value(m, "gpupool_snapshot_errors_total") == 0


def test_a_failing_provider_does_not_break_the_endpoint(cluster: ClusterState, serve_app: Any) -> None:
    broken = {"now": True}

    def provider() -> Snapshot:
        if broken["now"]:
            raise RuntimeError("scheduler not ready")
        return build_snapshot(cluster, {})

    with serve_app(create_metrics_app(CollectorRegistry(), PoolCollector(provider))) as url:
        m = scrape(url)
        assert value(m, "gpupool_snapshot_up") == 0
        assert value(m, "gpupool_snapshot_errors_total") == 1
        assert "gpupool_gpu_info" not in m
        broken["now"] = False
        m = scrape(url)
        assert value(m, "gpupool_snapshot_up") == 1
        assert value(m, "gpupool_snapshot_errors_total") == 1  # the earlier failure stays counted
        assert len(m["gpupool_gpu_info"]) == 4


def test_fast_text_equals_the_generic_encoder(cluster: ClusterState, give_pod: Any) -> None:
    """The route's direct text writer and prometheus_client's encoder give the same samples, escaping
    included (label values with quotes, backslashes and newlines)."""
    give_pod(cluster, "team-a/train", "n0", 0, 300, 10240)
    give_pod(cluster, "team-b/infer", "n1", 1, 1000, 40960)
    snap = build_snapshot(cluster, {"ns/x": "waiting"}, containers={"team-a/train": 'we"ird\\name\nx'})
    generic = CollectorRegistry()
    PoolCollector(lambda: snap, generic)
    via_route, _ = render(CollectorRegistry(), PoolCollector(lambda: snap).take(), "")

    def sample_set(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value)
                for f in text_string_to_metric_families(text) for s in f.samples}

    fast = sample_set(via_route.decode())
    assert fast == sample_set(generate_latest(generic).decode())
    assert ("gpupool_grant_cores_ratio", (("container", 'we"ird\\name\nx'), ("gpu", "0"), ("namespace", "team-a"),
            ("node", "n0"), ("pod", "train"), ("uuid", "GPU-0-0")), 0.3) in fast


def test_openmetrics_on_request(cluster: ClusterState, serve_app: Any) -> None:
    registry = CollectorRegistry()
    SchedulerMetrics(registry).latency.labels("bind").observe(0.02)
    pool = PoolCollector(lambda: build_snapshot(cluster, {}))
    with serve_app(create_metrics_app(registry, pool)) as url:
        r = httpx.get(f"{url}/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("\n# EOF\n") and r.text.count("# EOF") == 1
        # the strict OpenMetrics parser accepts the whole document (registry + pool parts)
        fams = {f.name: f for f in openmetrics_families(r.text)}
        assert fams["gpupool_snapshot_errors"].type == "counter"
        assert fams["gpupool_extender_request_duration_seconds"].type == "histogram"
        assert len(fams["gpupool_gpu_info"].samples) == 4


def test_churn_of_10000_pods_leaves_no_stale_series(cluster_factory: Any, serve_app: Any, give_pod: Any) -> None:
    """Pods come and go in waves; after every wave the grant series are exactly the live pods."""
    state = cluster_factory(nodes=50, gpus=8)
    rng = random.Random(7)
    registry = CollectorRegistry()
    PoolCollector(lambda: build_snapshot(state, {}), registry)  # the generic path, for the in-process scrapes
    arrived = 0
    with serve_app(create_metrics_app(CollectorRegistry(), PoolCollector(lambda: build_snapshot(state, {})))) as url:
        for wave in range(20):
            for _ in range(500):
                key = f"ns{arrived % 7}/pod-{arrived}"
                arrived += 1
                node, gpu = rng.randrange(50), rng.randrange(8)
                milli = rng.choice([100, 200, 250, 500])
                if state.gpu_milli_free[node, gpu] >= milli:
                    give_pod(state, key, f"n{node}", gpu, milli, 1024)
            live = sorted(state.held)
            for key in rng.sample(live, len(live) // 2):
                state.release(key)
            m = scrape(url) if wave % 5 == 4 else samples(generate_latest(registry).decode())
            for name in ("gpupool_grant_cores_ratio", "gpupool_grant_memory_bytes"):
                exported = sorted(f"{lv['namespace']}/{lv['pod']}" for lv, _ in m[name])
                assert exported == sorted(state.held), f"wave {wave}: {name} differs from the live pods"
            assert len(m["gpupool_gpu_info"]) == 400
    assert arrived == 10_000
    assert state.held  # the last wave left pods running, so the check above was not vacuous
