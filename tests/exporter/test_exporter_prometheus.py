"""A real Prometheus server scrapes the exporter, evaluates gpupool's alert rules, and answers PromQL.

Needs the `prometheus` and `promtool` binaries (Debian package `prometheus`; .ci/run installs it). When
they are missing these tests fail rather than skip, so CI cannot pass without having run them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.snapshot import build_snapshot
from gpupool.core.state import ClusterState
from gpupool.exporter import (
    POOL_METRICS,
    DeviceCollector,
    DeviceSample,
    PoolCollector,
    create_metrics_app,
)
from gpupool.scheduler.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts-test.yaml"
GRAFANA = ROOT / "deploy" / "grafana" / "gpupool-dashboard.json"


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the Grafana dashboard, with Grafana's variables filled in."""
    doc = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    subst = {"$namespace": ".*", "$node": ".*", "$__rate_interval": "1m"}
    out = []
    for e in exprs:
        for k, v in subst.items():
            e = e.replace(k, v)
        out.append(e)
    return out


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` not found: install the Debian package `prometheus` (.ci/run does)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus scraping a given target every second; yields a function target -> base URL."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []

    def start(target: str) -> str:
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "gpupool", "static_configs": [{"targets": [target]}]}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed after the process ends)
        logs.append(log)
        proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    for log in logs:
        log.close()  # an unclosed file is a ResourceWarning, an error under filterwarnings = error


def query(prom: str, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=10)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def eventually(fn: Any, what: str, timeout: float = 90.0) -> Any:
    """Poll `fn` until it returns something truthy (generous timeout: only guards against hangs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = fn()
        except (httpx.TransportError, httpx.HTTPStatusError):
            got = None  # not listening yet, or 503 while Prometheus starts up
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_prometheus_scrapes_pool_and_evaluates_alerts(
    cluster: ClusterState, serve_app: Any, give_pod: Any, shared_pool: Any, prometheus: Any
) -> None:
    give_pod(cluster, "team-a/train", "n0", 0, 1000, 40960)
    give_pod(cluster, "team-a/tune", "n0", 1, 900, 20480)
    give_pod(cluster, "team-b/infer", "n1", 0, 1000, 40960)
    give_pod(cluster, "team-b/batch", "n1", 1, 900, 20480)
    cluster.set_gpu_health("n1", 1, False)
    pool = shared_pool(cluster)
    with serve_app(create_metrics_app(CollectorRegistry(), PoolCollector(pool.snapshot))) as url:
        prom = prometheus(url.removeprefix("http://"))
        # (1000 + 900 + 1000 + 900) / 4000 = 0.95
        got = eventually(lambda: query(prom, "gpupool_pool_allocated_ratio"), "the first scrape")
        assert float(got[0]["value"][1]) == pytest.approx(0.95)
        by_ns = {r["metric"]["namespace"]: float(r["value"][1])
                 for r in query(prom, "sum by (namespace) (gpupool_grant_cores_ratio)")}
        assert by_ns == pytest.approx({"team-a": 1.9, "team-b": 1.9})

        # the rules are loaded and evaluated against the live series (both need a while to fire)
        def alert_states() -> dict[str, str]:
            r = httpx.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            return {a["labels"]["alertname"]: a["state"] for a in r}

        states = eventually(lambda: (s := alert_states()).keys() >= {"GPUPoolNearlyFull", "GPUPoolGPUUnhealthy"}
                            and s, "alerts to become pending")
        assert states["GPUPoolNearlyFull"] == "pending"
        assert "GPUPoolPodsPendingTooLong" not in states

        # every query of the Grafana dashboard is valid PromQL for this Prometheus
        for expr in dashboard_queries():
            r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
            assert r.status_code == 200 and r.json()["status"] == "success", (expr, r.text)
        assert query(prom, 'gpupool_gpu_cores_allocated_ratio{node=~".*"}')  # the node variable's label exists

        # a change in the pool shows up in the next scrapes: 3100 / 4000
        with pool.lock:
            cluster.release("team-b/batch")
        eventually(lambda: float(query(prom, "gpupool_pool_allocated_ratio")[0]["value"][1]) == pytest.approx(0.725),
                   "the release to be scraped")
        assert query(prom, 'gpupool_grant_cores_ratio{pod="batch"}') == []


def test_alert_rules_parse_and_pass_their_unit_tests() -> None:
    check = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([binary("promtool"), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True,
                          cwd=ALERT_TESTS.parent)
    assert unit.returncode == 0, unit.stdout + unit.stderr


IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {"sum", "by", "max", "min", "avg", "count", "rate", "irate", "increase", "without", "on", "ignoring",
                "group_left", "group_right", "and", "or", "unless", "bool", "histogram_quantile", "topk", "bottomk",
                "clamp_max", "clamp_min", "le", "offset", "label_replace", "time", "vector", "scalar", "abs",
                "max_over_time", "avg_over_time", "sort_desc", "e"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, label lists, strings and
    durations, that are not PromQL functions or keywords."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for m in IDENT.finditer(expr):
        word = m.group(0)
        if word in PROMQL_WORDS or expr[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def produced_names(state: ClusterState) -> set[str]:
    """Every sample name gpupool exposes: the scheduler's registry (its own metrics plus the pool series)
    for a pool with a grant and a pending pod, and an agent's device registry."""
    registry = CollectorRegistry()
    PoolCollector(lambda: build_snapshot(state, {"ns/a": "x"}, pending_since={"ns/a": 0.0}, now=1.0), registry)
    SchedulerMetrics(registry).latency.labels("filter").observe(0.01)
    sample = DeviceSample(index=0, uuid="GPU-x", model="A100", hostname="h", gpu_util=1.0, fb_used_mib=1.0,
                          fb_total_mib=2.0, temperature_c=30.0, power_w=50.0)
    DeviceCollector(lambda: [sample], registry=registry)
    return {s.name for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_metric_name_extraction() -> None:
    expr = 'sum by (namespace, pod) (rate(gpupool_x_total{pod=~"a.*"}[5m])) / on(node) group_left(model) gpupool_y'
    assert metric_names(expr) == {"gpupool_x_total", "gpupool_y"}


def test_every_metric_in_the_alerts_is_exported(cluster: ClusterState, give_pod: Any) -> None:
    give_pod(cluster, "ns/b", "n0", 0, 500, 1024)
    exported = produced_names(cluster)
    assert set(POOL_METRICS) <= exported
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert len(rules) == 4
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used, rule["alert"]
        assert used <= exported, (rule["alert"], used - exported)


def test_grafana_dashboard_uses_only_exported_metrics(cluster: ClusterState, give_pod: Any) -> None:
    give_pod(cluster, "ns/b", "n0", 0, 500, 1024)
    exported = produced_names(cluster)
    doc = json.loads(GRAFANA.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    queries = dashboard_queries()
    assert len(queries) >= 15
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, expr
        used |= names
    assert used <= exported, used - exported
    # the dashboard covers the pool, the grants, the scheduler, the devices and each vendor's cards
    assert {"gpupool_pool_allocated_ratio", "gpupool_grant_cores_ratio",
            "gpupool_extender_request_duration_seconds_bucket", "DCGM_FI_DEV_GPU_UTIL",
            "gpupool_pending_gpu_pods"} <= used
    assert {n for n in exported if n.startswith("gpupool_vendor_")} <= used
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            metric = re.match(r"label_values\((\w+), (\w+)\)", var["definition"])
            assert metric is not None and metric.group(1) in exported, var["definition"]
