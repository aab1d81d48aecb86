"""Autoscaling on a pod's GPU share, end to end (docs/autoscaling.md): a Deployment of share pods whose
containers run a CUDA program under gpupool's interception library (against the fake libcuda and fake
NVML, so the library's own accounting measures their busy time), the gpupool agent serving the per-pod
share series, a real Prometheus scraping it, KEDA (operator + metrics apiserver, built from its Go module)
turning deploy/autoscaling/keda-scaledobject.yaml into an HPA and serving external.metrics.k8s.io through
the API server's aggregation layer, and the 1.37 kube-controller-manager's HPA controller scaling the
Deployment up under load and back down when idle.

The stack is its own control plane (`AggregatingTestbed`: the session's testbed has no aggregation layer),
with the chart's extender + kube-scheduler, one real node (containerd + kubelet) and its agent as in the
real-node tests. The load: each pod's shell loop asks a switch served by this test (over the pod network)
whether there is work, and if so has its CUDA program launch kernels for a second; the library caps the
pod at its 20 % compute share. The replica count is sampled every second and asserted as a sequence.
Missing KEDA, Prometheus or Kubernetes binaries fail the test (never skip). benchmarks/hpa.py reuses
`HpaStack`.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpupool.api.names import RESOURCE_GPU
from tests.e2e import real_node_fixtures as rn
from tests.e2e.conftest import (
    NAMESPACE as SYSTEM_NAMESPACE,
)
from tests.e2e.conftest import (
    RBAC_PATHS,
    RBAC_TEMPLATES,
    Extender,
    Identities,
    chart_scheduler_config,
    helm_template,
)
from tests.e2e.kubectl_tool import kubectl_binary
from tests.harness import testbed as tb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "k8s"))

import images  # noqa: E402
import realnode  # noqa: E402
import testbed as ktb  # noqa: E402  (scripts/k8s/testbed.py: the aggregation layer and KEDA)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
AUTOSCALING = ROOT / "deploy" / "autoscaling"
NAMESPACE = "e2e-hpa"
APP = "gpu-worker"
LOAD_IMAGE = "gpupool.local/cuda-load:1"
MIN_REPLICAS, MAX_REPLICAS = 1, 4
CORES, MEMORY_MIB = 20, 1024  # each pod's share of one GPU
HELD_MIB = 256  # what each pod's program allocates and keeps: memory used / cap = 0.25
Obj = dict[str, Any]


# --- pieces of the stack ---------------------------------------------------------------------------------
def load_image(work: Path) -> dict[str, Path]:
    """The real-node tests' cuda-probe image plus the fake NVML as libnvidia-ml.so.1 beside the fake
    libcuda, as the NVIDIA container toolkit mounts the driver's NVML into a GPU container: the library's
    poller measures the pod's busy time through it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "a C compiler is needed for the load image (apt-get install gcc)"
    work.mkdir(parents=True, exist_ok=True)
    nvml = work / "libnvidia-ml.so.1"
    subprocess.run([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-o", str(nvml),
                    str(images.FAKES / "fake_nvml.c"), "-lpthread"], check=True, capture_output=True)
    base = images.probe_layer(work)
    files = {**base.files, f"{images.PROBE_LIB_DIR}/libnvidia-ml.so.1": (nvml.read_bytes(), 0o755)}
    archive = work / "cuda-load.oci.tar"
    images.write_archive(archive, LOAD_IMAGE, images.Layer(files, base.links, base.dirs),
                         {"Cmd": ["sh"], "Env": ["PATH=/bin:/usr/local/bin"]})
    return {LOAD_IMAGE: archive}


class LoadSwitch:
    """What the pods ask each second: is there work? (GET /load -> "on" or "off"). Listens on every address
    of this machine, so the pods reach it at their network's gateway, as they would reach a work queue."""

    def __init__(self) -> None:
        self.on = False
        switch = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                body = b"on" if switch.on else b"off"
                # a pod stopped by the scale-down may hang up first: nothing to tell it then
                with contextlib.suppress(ConnectionError):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# The container: allocate HELD_MIB and keep it; then every second, if the switch says so, one second of 2 ms
# kernels (the library paces them to the pod's 20 %). The program reads commands on stdin (probe.c). No
# `wget -T`: Debian's static busybox 1.35 crashes with it.
LOAD_SCRIPT = """
{ echo "alloc mem %(held)d"
  while true; do
    if [ "$(wget -q -O - "%(url)s" 2>/dev/null)" = on ]; then echo "launch kernel 2000 1 8"; fi
    sleep 1
  done; } | probe direct
"""


def switch_url(node: realnode.RealNode, port: int) -> str:
    """The switch as the node's pods reach it: at the node's bridge, the gateway address host-local gives the
    bridge (the first of the pod range; the pods have no default route, only their /24)."""
    network = ipaddress.ip_network(node.pod_cidr)
    return f"http://{network.network_address + 1}:{port}/load"


def deployment(node: realnode.RealNode, switch_port: int) -> Obj:
    """A Deployment of share pods as the webhook leaves them (20 % and 1 GiB of one GPU each), pinned to the
    real node."""
    script = LOAD_SCRIPT % {"held": HELD_MIB << 20, "url": switch_url(node, switch_port)}
    pod = rn.share_pod(APP, node.name, MEMORY_MIB, CORES, image=LOAD_IMAGE, command=["sh", "-c", script])
    spec = pod["spec"]
    # The fake NVML beside the fake libcuda (the library dlopens libnvidia-ml.so.1).
    spec["containers"][0]["env"] = [{"name": "LD_LIBRARY_PATH", "value": "/" + images.PROBE_LIB_DIR}]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {"replicas": MIN_REPLICAS, "selector": {"matchLabels": {"app": APP}},
                 "template": {"metadata": {"labels": {"app": APP}}, "spec": spec}},
    }


def scaled_object(prometheus_url: str) -> Obj:
    """deploy/autoscaling/keda-scaledobject.yaml with this test's namespace and Prometheus, and the timings
    its comments mark `test:` (seconds where a cluster would use minutes)."""
    doc: Obj = yaml.safe_load((AUTOSCALING / "keda-scaledobject.yaml").read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    doc["spec"]["pollingInterval"] = 2
    behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    behavior["scaleUp"]["policies"][0]["periodSeconds"] = 2
    behavior["scaleDown"]["stabilizationWindowSeconds"] = 6
    behavior["scaleDown"]["policies"][0]["periodSeconds"] = 2
    meta = doc["spec"]["triggers"][0]["metadata"]
    meta["serverAddress"] = prometheus_url
    meta["query"] = meta["query"].replace('namespace="team-a"', f'namespace="{NAMESPACE}"').replace("[1m]", "[6s]")
    assert doc["spec"]["scaleTargetRef"]["name"] == APP and f'pod=~"{APP}-.+"' in meta["query"]
    return doc


@dataclass
class Prometheus:
    """Debian's prometheus scraping the agent every second (fails, not skips, when it is missing)."""

    directory: Path
    target: str
    port: int = 0
    proc: tb.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("`prometheus` not found: install the Debian package `prometheus` (.ci/run does)", pytrace=False)
        self.directory.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "gpupool-agent", "static_configs": [{"targets": [self.target]}]}]}
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = tb.free_port()
        self.proc = tb.spawn("prometheus", [
            binary, f"--config.file={self.directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
        ], self.directory / "prometheus.log")
        rn.wait_for(self._ready, 60, "Prometheus ready", lambda: self.proc.tail() if self.proc else "")
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, promql: str) -> list[Obj]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        result: list[Obj] = r.json()["data"]["result"]
        return result

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def _keda_or_build() -> None:
    """KEDA's binaries, built when missing (once per machine; docs/autoscaling.md gives the cold time), unless
    GPUPOOL_K8S_BUILD=0, which fails at once as the other e2e tests do."""
    try:
        ktb.find_keda()
        return
    except tb.TestbedError as e:
        if os.environ.get("GPUPOOL_K8S_BUILD", "1") == "0":
            pytest.fail(str(e), pytrace=False)
    log = ktb.keda_dir() / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        done = subprocess.run(["bash", str(ktb.KEDA_BUILD_SCRIPT)], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "GPUPOOL_KEDA_NOWAIT": "1"}, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        pytest.fail(f"building KEDA failed (log {log}):\n{tail}", pytrace=False)


def apply_chart_rbac(bed: tb.Testbed) -> Identities:
    """The chart's ServiceAccounts and RBAC on this control plane, and a token of each (as conftest's
    chart_rbac and identities fixtures do for the session's testbed)."""
    rendered = helm_template(*(a for t in RBAC_TEMPLATES for a in ("--show-only", t)))
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    bed.ensure("/api/v1/namespaces", {"metadata": {"name": SYSTEM_NAMESPACE}})
    for crd in sorted((ROOT / "deploy" / "helm" / "gpupool" / "crds").glob("*.yaml")):
        bed.ensure("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(crd.read_text()))
    for doc in docs:
        bed.ensure(RBAC_PATHS[doc["kind"]].format(ns=doc["metadata"].get("namespace", SYSTEM_NAMESPACE)), doc)
    accounts = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d["metadata"]["name"]
                for d in docs if d["kind"] == "ServiceAccount"}
    return Identities(**{c: bed.service_account_kubeconfig(SYSTEM_NAMESPACE, n) for c, n in accounts.items()})


@dataclass
class Sample:
    t: float  # seconds since the phase began
    replicas: int  # the Deployment's spec.replicas: what the HPA controller last set
    ready: int
    metric: str  # the HPA's current value of the external metric ("" before it has one)


@dataclass
class HpaStack:
    """Everything the autoscaling test and benchmark run on; `start()` returns when a Deployment could be
    applied, `stop()` removes it all."""

    keep: bool = False
    bed: ktb.AggregatingTestbed | None = None
    nodes: realnode.RealNodes | None = None
    agent: rn.NodeAgent | None = None
    extender: Extender | None = None
    keda: ktb.Keda | None = None
    prometheus: Prometheus | None = None
    switch: LoadSwitch | None = None
    kubectl_path: Path = Path("kubectl")
    stops: list[Callable[[], None]] = field(default_factory=list)

    def start(self) -> HpaStack:
        rn._ensure_tools()
        _keda_or_build()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.bed = bed = ktb.AggregatingTestbed(keep=self.keep).start()
        self.stops.append(bed.stop)
        self.kubectl_path = kubectl_binary()
        ids = apply_chart_rbac(bed)
        self.extender = ext = Extender(bed, tb.free_port(), bed.dir / "gpupool-scheduler.log", ids.scheduler)
        ext.start()
        self.stops.append(ext.stop)
        ext.wait_ready()
        bed.start_scheduler(tb.scheduler_config(ext.url, chart_scheduler_config(), leader_election=True),
                            kubeconfig=ids.scheduler)
        self.nodes = nodes = realnode.RealNodes(bed, 1, keep=self.keep, taint=True).start()
        self.stops.append(nodes.stop)
        node = nodes.nodes[0]
        images.import_images(load_image(bed.dir / "load-image"), node.containerd_socket,
                             str(realnode.bin_path("ctr")))
        self.agent = agent = rn.NodeAgent(node, ids.agent, tb.free_port())
        agent.start()
        self.stops.append(agent.quit_mps_daemons)
        self.stops.append(agent.stop)
        rn.wait_for(lambda: self._slots() == rn.GPUS_PER_NODE * rn.SPLIT, 90, "the node advertising its slots",
                    agent.tail)
        self.keda = keda = ktb.Keda(bed, tb.host_address())
        self.stops.append(keda.stop)
        keda.start()
        self.prometheus = prom = Prometheus(bed.dir / "prometheus", f"127.0.0.1:{agent.metrics_port}").start()
        self.stops.append(prom.stop)
        self.switch = switch = LoadSwitch()
        self.stops.append(switch.close)
        bed.tenant_namespace(NAMESPACE)

    def stop(self) -> None:
        while self.stops:
            try:
                self.stops.pop()()
            except Exception as e:  # the rest must still stop
                print(f"stopping the autoscaling stack: {e}")

    # --- the cluster as a user sees it ---------------------------------------------------------------------
    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        assert self.bed is not None
        done = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              input=stdin, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def apply(self, *objects: Obj) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def get(self, path: str) -> Obj | None:
        assert self.bed is not None
        got: Obj | None = realnode.api_request(self.bed, "GET", path)
        return got

    def _slots(self) -> int:
        assert self.nodes is not None
        node = self.get(f"/api/v1/nodes/{self.nodes.nodes[0].name}") or {}
        return int(((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE_GPU, "0"))

    def deploy(self) -> None:
        """The Deployment at its minimum and the ScaledObject, once every piece answers: the HPA that KEDA
        made has read the metric through the API server."""
        assert self.nodes is not None and self.switch is not None and self.prometheus is not None
        self.switch.on = False
        self.apply(deployment(self.nodes.nodes[0], self.switch.port), scaled_object(self.prometheus.url))
        rn.wait_for(lambda: self.hpa_metric() != "", 180, "KEDA's HPA reading the metric", self.describe)
        rn.wait_for(lambda: self.sample(0).ready == MIN_REPLICAS, 180, "the first pod running", self.describe)

    def undeploy(self) -> None:
        self.kubectl("delete", "-n", NAMESPACE, f"scaledobject/{APP}", f"deployment/{APP}", "--ignore-not-found",
                     "--wait=false")
        rn.wait_for(lambda: not self.pods(), 180, "the Deployment's pods gone", self.describe)

    def hpa(self) -> Obj:
        return self.get(f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/keda-hpa-{APP}") or {}

    def hpa_metric(self) -> str:
        for m in (self.hpa().get("status") or {}).get("currentMetrics") or []:
            value = ((m.get("external") or {}).get("current") or {}).get("averageValue")
            if value is not None:
                return str(value)
        return ""

    def pods(self) -> list[Obj]:
        doc = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{APP}") or {}
        return list(doc.get("items") or [])

    def sample(self, t0: float) -> Sample:
        dep = self.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{APP}") or {}
        return Sample(round(time.monotonic() - t0, 1), int((dep.get("spec") or {}).get("replicas") or 0),
                      int((dep.get("status") or {}).get("readyReplicas") or 0), self.hpa_metric())

    def follow(self, until: Callable[[Sample], bool], timeout_s: float, what: str) -> list[Sample]:
        """Sample every second from now until `until` holds (bounded: the limit only prevents a hang)."""
        t0 = time.monotonic()
        samples: list[Sample] = []
        while True:
            samples.append(s := self.sample(t0))
            if until(s):
                return samples
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"{what} not within {timeout_s:.0f}s; samples {samples[-20:]}; {self.describe()}")
            time.sleep(1)

    def hpa_events(self) -> list[str]:
        doc = self.get(f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3Dkeda-hpa-{APP}")
        return [f"{e.get('reason')}: {e.get('message')}" for e in (doc or {}).get("items") or []]

    def describe(self) -> str:
        hpa = self.hpa()
        keda_logs = ""
        if self.keda is not None:
            keda_logs = " | ".join(p.tail(5).replace("\n", " / ") for p in self.keda.processes.values())
        return (f"HPA status {json.dumps(hpa.get('status'))}; events {self.hpa_events()[-5:]}; pods "
                f"{[rn.describe_pod(p) for p in self.pods()]}; KEDA: {keda_logs}")


# --- the test ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack() -> Iterator[HpaStack]:
    try:
        s = HpaStack(keep=os.environ.get("GPUPOOL_E2E_KEEP") == "1").start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield s
    finally:
        s.stop()


def _per_pod(prom: Prometheus, promql: str) -> dict[str, float]:
    return {r["metric"].get("pod", ""): float(r["value"][1]) for r in prom.query(promql)}


def adapter_query(rule: Obj, matchers: str) -> str:
    """A prometheus-adapter rule's metricsQuery as the adapter fills it for a Pods metric of one namespace."""
    name = str(rule["seriesQuery"]).split("{")[0].strip("'")
    return (str(rule["metricsQuery"]).replace("<<.Series>>", name).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod"))


def test_keda_scales_share_pods_up_under_gpu_load_and_down_when_idle(stack: HpaStack) -> None:
    assert stack.prometheus is not None and stack.switch is not None
    stack.deploy()
    # Idle: the HPA has a reading and keeps the minimum.
    hpa = stack.hpa()
    assert hpa["spec"]["minReplicas"] == MIN_REPLICAS and hpa["spec"]["maxReplicas"] == MAX_REPLICAS
    assert (hpa.get("status") or {}).get("desiredReplicas") == MIN_REPLICAS, stack.describe()

    # Load: every pod keeps its 20 % busy; each reads ~1.0 of its share against a 0.6 target, so the HPA
    # grows the Deployment until it reaches the maximum (the average stays above the target).
    stack.switch.on = True
    up = stack.follow(lambda s: s.replicas == MAX_REPLICAS and s.ready == MAX_REPLICAS, 420, "scale-up to the maximum")
    replicas = [s.replicas for s in up]
    assert replicas[0] == MIN_REPLICAS and replicas[-1] == MAX_REPLICAS, up
    assert all(a <= b for a, b in zip(replicas, replicas[1:], strict=False)), f"scaled down under load: {up}"

    # What the HPA scaled on, read from Prometheus: every running pod at about its whole share (the library
    # caps it at 20 %; the rate over 6 s of 1 s scrapes), and at HELD_MIB / MEMORY_MIB of its memory cap.
    prom = stack.prometheus
    matchers = f'namespace="{NAMESPACE}",pod=~"{APP}-.+"'
    running = {p["metadata"]["name"] for p in stack.pods() if rn.phase(p) == "Running"}

    def shares() -> dict[str, float] | None:
        got = _per_pod(prom, f"rate(gpupool_pod_share_compute_seconds_total{{{matchers}}}[6s])")
        return got if set(got) >= running and all(0.6 < v < 1.3 for k, v in got.items() if k in running) else None

    rn.wait_for(shares, 120, "each loaded pod near its whole compute share",
                lambda: str(_per_pod(prom, f"rate(gpupool_pod_share_compute_seconds_total{{{matchers}}}[6s])")))
    memory = _per_pod(prom, f"gpupool_pod_share_memory_used_ratio{{{matchers}}}")
    assert {k: round(v, 3) for k, v in memory.items() if k in running} == {k: HELD_MIB / MEMORY_MIB for k in running}
    # The shipped prometheus-adapter rules' queries, filled as the adapter fills them, give the same per pod.
    rules = yaml.safe_load((AUTOSCALING / "prometheus-adapter-rules.yaml").read_text())["rules"]
    compute_rule, memory_rule = rules
    adapter_compute = _per_pod(prom, adapter_query(compute_rule, matchers).replace("[1m]", "[6s]"))
    assert set(adapter_compute) >= running and all(v > 0.5 for k, v in adapter_compute.items() if k in running)
    assert _per_pod(prom, adapter_query(memory_rule, matchers)) == pytest.approx(memory)

    # Idle: the same pods, no kernels; the share falls to 0 and the HPA returns to the minimum.
    stack.switch.on = False
    down = stack.follow(lambda s: s.replicas == MIN_REPLICAS, 420, "scale-down to the minimum")
    replicas = [s.replicas for s in down]
    assert replicas[0] == MAX_REPLICAS and replicas[-1] == MIN_REPLICAS, down
    assert all(a >= b for a, b in zip(replicas, replicas[1:], strict=False)), f"scaled up while idle: {down}"
    events = stack.hpa_events()
    assert any("SuccessfulRescale" in e and "above target" in e for e in events), events
    assert any("SuccessfulRescale" in e and "below target" in e for e in events), events
    print(f"replicas under load (t, replicas, ready, metric): {[(s.t, s.replicas, s.ready, s.metric) for s in up]}")
    print(f"replicas when idle: {[(s.t, s.replicas, s.ready, s.metric) for s in down]}")
    stack.undeploy()
