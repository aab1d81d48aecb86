"""A release of the Helm chart (deploy/helm/gpupool) installed on the testbed: `ChartRelease` runs the
chart's own pods on the testbed's real kubelets; `LocalRelease`, kept for the tests that still use it,
runs them here as processes.

ChartRelease: the images `scripts/image` wrote (build/image/images.json: the gpupool image of the
repository's Dockerfile, and registry.k8s.io/kube-scheduler:<the testbed's version>, the name and tag the
chart uses) are imported into each node's containerd, and `helm install` runs with `pullPolicy: Never`.
The testbed must serve pods (`Testbed(serve_pods=True)`: the `kubernetes` Service behind kube-proxy, the
root CA in each namespace) and run a default kube-scheduler (`start_default_scheduler`), which places the
release's own Deployments and DaemonSet pods as on any cluster. The nodes are labelled
gpupool.io/gpu-node=true for the agent's DaemonSet; its fake GPUs are one ConfigMap whose UUIDs name the
node ({node}: GPU-<node>-<i>); its hook and MPS roots are host directories of this testbed's nodes. The
API server calls the webhook at its Service's endpoint (a pod address on a node's bridge, which this host
routes to). DRA is on (`dra.enabled`, unless ChartRelease(dra=False)) with the chart's own paths: each agent
pod mounts /var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins/gpu.gpupool.io and /var/run/cdi,
which in each real node's mount namespace are that node's kubelet directories and the CDI directory its
containerd reads (scripts/k8s/realnode.py); GPUs 0 and 1 of each node are NVLink peers (the fake file), so
docs/claims.md's NVLink example is allocatable.

LocalRelease:

`helm install` creates every object of the release as on any cluster: ServiceAccounts and RBAC, the
ConfigMaps, the webhook's certificate Secret, the webhook configurations, the agent's
ValidatingAdmissionPolicy, the Deployments and the DaemonSet. The testbed's nodes have no gpupool image, so
the release's own pods never start (the Deployments' pods stay Pending: no node takes them; the agent's
DaemonSet selects only nodes labelled `gpupool.io/gpu-node`, which the testbed's nodes are not). In their
place each container runs here as the kubelet would run it:

- its command and arguments and its environment, read back from the installed Deployment / DaemonSet (so
  `helm upgrade` shows), `fieldRef: spec.nodeName` filled in;
- its ConfigMap and Secret volumes written to a local directory, and every path under a mount point in its
  arguments or environment moved there;
- a bound token of the release's own ServiceAccount (TokenRequest) instead of the projected one, so the
  chart's RBAC decides what it may do.

Only what is the host's changes: listen ports (free ones), host paths (each real node's directory, its
kubelet's device-plugin directory), kube-scheduler's serving port (off), and the agent's fake GPU file (one
per node, so each node's GPUs have their own UUIDs). The API server reaches the webhook through the release's
Service: an EndpointSlice of that Service names this host's address (the testbed's API server dials
endpoints, `--enable-aggregator-routing`, since no kube-proxy serves ClusterIPs here), and the webhook
serves the chart's own certificate, whose CA the chart put in the webhook configurations.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import realnode  # noqa: E402

from tests.harness import testbed as tb  # noqa: E402

CHART = ROOT / "deploy" / "helm" / "gpupool"
Obj = dict[str, Any]


def helm_binary() -> Path:
    """helm built from its pinned Go module by scripts/k8s/build.sh (never downloaded at run time)."""
    from tests.deploy.helm_tool import helm_binary as extract

    return extract(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")


host_address = tb.host_address  # an IPv4 address of this host that is not loopback


def _relocate(value: str, mounts: dict[str, Path]) -> str:
    """`value` (or the part after `=` of a `--flag=value` argument) with a leading mount point (the longest
    that matches) replaced by its local directory."""
    if value.startswith("--") and "=" in value:
        flag, _, rest = value.partition("=")
        return f"{flag}={_relocate(rest, mounts)}"
    for target in sorted(mounts, key=len, reverse=True):
        if value == target or value.startswith(target.rstrip("/") + "/"):
            return str(mounts[target]) + value[len(target.rstrip("/")):]
    return value


@dataclass
class Container:
    """What a container of the release would run with, made local."""

    argv: list[str]
    env: dict[str, str]


@dataclass
class LocalRelease:
    bed: tb.Testbed
    name: str
    namespace: str
    values: list[str] = field(default_factory=list)  # helm arguments: --set NAME=VALUE, --set-json ...
    host: str = field(default_factory=host_address)
    processes: list[tb.Process] = field(default_factory=list)
    extender_url: str = ""

    @property
    def fullname(self) -> str:
        return self.name if "gpupool" in self.name else f"{self.name}-gpupool"

    @property
    def dir(self) -> Path:
        return self.bed.dir / f"release-{self.name}"

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(helm_binary()), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise tb.TestbedError(f"helm {' '.join(args[:2])}: {done.stderr.strip()}")
        return done

    def install(self) -> None:
        self.helm("install", self.name, str(CHART), "-n", self.namespace, "--create-namespace", *self.values)

    def upgrade(self, *more: str) -> None:
        self.values = [*self.values, *more]
        self.helm("upgrade", self.name, str(CHART), "-n", self.namespace, *self.values)

    def uninstall(self) -> None:
        self.stop()
        realnode.api_request(self.bed, "DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/"
                                                 f"endpointslices/{self.fullname}-webhook-local")
        self.helm("uninstall", self.name, "-n", self.namespace)

    # --- the release's pods, run here ---------------------------------------------------------------------
    def _get(self, path: str) -> Obj:
        obj = realnode.api_request(self.bed, "GET", path)
        if obj is None:
            raise tb.TestbedError(f"{path}: not found (is the release installed?)")
        return obj

    def container(self, kind: str, workload: str, name: str, workdir: Path, node: str = "",
                  host_paths: dict[str, Path] | None = None) -> Container:
        """Container `name` of the release's `kind` ("deployments" or "daemonsets") `workload`, made local."""
        obj = self._get(f"/apis/apps/v1/namespaces/{self.namespace}/{kind}/{workload}")
        pod = obj["spec"]["template"]["spec"]
        spec = next(c for c in pod["containers"] if c["name"] == name)
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in spec.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            local = workdir / mount["name"]
            if "hostPath" in volume and host_paths and volume["hostPath"]["path"] in host_paths:
                local = host_paths[volume["hostPath"]["path"]]
            local.mkdir(parents=True, exist_ok=True)
            for key, data in self._volume_files(volume).items():
                (local / key).write_bytes(data)
            mounts[mount["mountPath"]] = local
        env: dict[str, str] = {}
        for item in spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = _relocate(str(item["value"]), mounts)
            elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "spec.nodeName":
                env[item["name"]] = node
        argv = [_relocate(a, mounts) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        return Container(argv, env)

    def _volume_files(self, volume: Obj) -> dict[str, bytes]:
        if "secret" in volume:
            secret = self._get(f"/api/v1/namespaces/{self.namespace}/secrets/{volume['secret']['secretName']}")
            return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        if "configMap" in volume:
            cm = self._get(f"/api/v1/namespaces/{self.namespace}/configmaps/{volume['configMap']['name']}")
            return {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        return {}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> tb.Process:
        proc = tb.spawn(name, argv, self.dir / f"{name}.log", env)
        self.processes.append(proc)
        return proc

    def _account(self, component: str, node: str | None = None) -> Path:
        return self.bed.service_account_kubeconfig(self.namespace, f"{self.fullname}-{component}", node)

    def start_webhook(self) -> int:
        """The webhook Deployment's container, reached by the API server through the release's Service."""
        c = self.container("deployments", f"{self.fullname}-webhook", "webhook", self.dir / "webhook")
        port = tb.free_port()
        c.env.update({"GPUPOOL_WEBHOOK_PORT": str(port), "GPUPOOL_WEBHOOK_HOST": self.host})
        # The image's entry point is `gpupool`: the container's args are its subcommand.
        self._spawn("webhook", [*tb.gpupool_argv(), *c.argv, "--kubeconfig", str(self._account("webhook"))], c.env)
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{self.fullname}-webhook-local", "namespace": self.namespace,
                         "labels": {"kubernetes.io/service-name": f"{self.fullname}-webhook",
                                    "endpointslice.kubernetes.io/managed-by": "gpupool-testbed"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
        self.bed.ensure(f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices", slice_)
        return port

    def start_scheduler(self) -> str:
        """The scheduler Deployment's two containers: the gpupool extender and kube-scheduler calling it."""
        workload, workdir = f"{self.fullname}-scheduler", self.dir / "scheduler"
        ext = self.container("deployments", workload, "extender", workdir)
        port = tb.free_port()
        ext.env["GPUPOOL_SCHEDULER_PORT"] = str(port)
        self._spawn("extender", [*tb.gpupool_argv(), *ext.argv, "--kubeconfig", str(self._account("scheduler"))],
                    ext.env)
        ks = self.container("deployments", workload, "kube-scheduler", workdir)
        config_arg = next(a for a in ks.argv if a.startswith("--config="))
        config_path = Path(config_arg.split("=", 1)[1])
        config = yaml.safe_load(config_path.read_text())
        config["clientConnection"] = {**(config.get("clientConnection") or {}),
                                      "kubeconfig": str(self._account("scheduler"))}
        # The chart's extender URL with this process's port: same scheme, host and path.
        scheme, _, rest = config["extenders"][0]["urlPrefix"].partition("://")
        host_port, _, path = rest.partition("/")
        url = f"{scheme}://{host_port.rsplit(':', 1)[0]}:{port}"
        config["extenders"][0]["urlPrefix"] = f"{url}/{path}"
        config_path.write_text(yaml.safe_dump(config))
        binary = tb.find_binaries().kube_scheduler
        self._spawn("kube-scheduler", [str(binary), *ks.argv[1:], "--secure-port=0"], ks.env)
        return url

    def start_agent(self, node: realnode.RealNode) -> tb.Process:
        """The agent DaemonSet's container on `node`: its host paths are the node's own directories (the
        kubelet's device-plugin directory that of the node's kubelet)."""
        c = self.container("daemonsets", f"{self.fullname}-agent", "agent", node.dir / f"release-{self.name}",
                           node=node.name, host_paths={"/var/lib/kubelet/device-plugins": node.device_plugin_dir})
        c.env.update({"GPUPOOL_AGENT_FAKE_FILE": str(realnode.fake_gpus_file(node)), "GPUPOOL_AGENT_METRICS_PORT": "0"})
        return self._spawn(f"agent@{node.name}", [*tb.gpupool_argv(), *c.argv,
                                                  "--kubeconfig", str(self._account("agent", node.name))], c.env)

    def start(self, nodes: list[realnode.RealNode]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.start_webhook()
        self.extender_url = self.start_scheduler()
        for node in nodes:
            self.start_agent(node)

    def dead(self) -> Iterator[tb.Process]:
        return (p for p in self.processes if not p.alive())

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()
        self.processes.clear()


GPUPOOL_REPOSITORY = "docker.io/gpupool/gpupool"
KUBE_SCHEDULER_REPOSITORY = "registry.k8s.io/kube-scheduler"
GPU_NODE_LABEL = "gpupool.io/gpu-node"  # the agent DaemonSet's default nodeSelector
# Three L40S per node, UUIDs GPU-<node>-<i>; GPUs 0 and 1 joined by NVLink.
FAKE_GPUS = {"driver_version": "570.86", "cuda_version": "12.8",
             "gpus": [{"uuid": f"GPU-{{node}}-{i}", "model": "L40S", "memory_mib": 46068, "numa_node": 0,
                       "nvlink_peers": peers} for i, peers in enumerate(([1], [0], []))]}
FAKE_GPU_COUNT = len(FAKE_GPUS["gpus"])
DRA_DRIVER = "gpu.gpupool.io"
ROLES = ("agent", "scheduler", "webhook")


def image_names(kube_version: str) -> list[str]:
    """The gpupool image and the chart's kube-scheduler image (for `kube_version`) among those scripts/image
    built (build/image/images.json); images.project_archives checks their archives."""
    try:
        known = json.loads(realnode.images.PROJECT_MANIFEST.read_text())
    except (OSError, ValueError):
        known = {}
    gpupool = sorted(n for n in known if n.startswith(GPUPOOL_REPOSITORY + ":"))
    if not gpupool:
        raise tb.TestbedError(f"no gpupool image in {realnode.images.PROJECT_MANIFEST}: run scripts/image build")
    return [gpupool[-1], f"{KUBE_SCHEDULER_REPOSITORY}:{kube_version}"]


@dataclass
class ChartRelease:
    """The chart installed with helm, its pods run by the nodes' kubelets (module doc)."""

    bed: tb.Testbed
    name: str
    namespace: str
    nodes: realnode.RealNodes
    values: list[str] = field(default_factory=list)  # more helm arguments, after the testbed's own
    images: dict[str, Path] = field(default_factory=dict)
    dra: bool = True  # the chart's dra.enabled: the agents serve claims beside the device plugin

    fullname = LocalRelease.fullname
    helm = LocalRelease.helm

    @property
    def image(self) -> str:
        return next(n for n in self.images if n.startswith(GPUPOOL_REPOSITORY + ":"))

    def testbed_values(self) -> list[str]:
        """What this testbed needs beside the chart's defaults: the imported image, never pulled; fake GPUs
        named after each node; the hook and MPS roots in the testbed's directory that each node sees as its
        own (RealNode.local: per node, as on separate machines); the webhook's certificate from helm (no
        cert-manager here)."""
        local = self.nodes.local
        assert local is not None, "the nodes are not started"
        tag = self.image.rsplit(":", 1)[1]
        return ["--set", f"image.repository={GPUPOOL_REPOSITORY}", "--set", f"image.tag={tag}",
                "--set", "image.pullPolicy=Never", "--set", "webhook.certs.mode=helm",
                "--set", "agent.backend=fake", "--set-json", f"agent.fakeGpus={json.dumps(FAKE_GPUS)}",
                "--set", f"agent.hookRoot={local / 'hook'}", "--set", f"agent.mpsRoot={local / 'mps'}",
                "--set", f"dra.enabled={str(self.dra).lower()}"]

    def import_images(self) -> None:
        """The images into each node's containerd (`ctr -n k8s.io images import`), as a registry would serve them."""
        try:
            self.images = realnode.images.import_project_images(
                [n.containerd_socket for n in self.nodes.nodes], image_names(self.bed.server_version()),
                str(realnode.bin_path("ctr")))
        except realnode.images.ImageError as e:
            raise tb.TestbedError(str(e)) from None

    def retag(self, tag: str) -> str:
        """The release's gpupool image under a new tag on every node, as a registry would serve a new
        release's image (the same build: what an upgrade to it must keep is the tenants, not the bytes);
        returns the new name."""
        name = f"{GPUPOOL_REPOSITORY}:{tag}"
        try:
            for node in self.nodes.nodes:
                realnode.images.tag_image(node.containerd_socket, self.image, name, str(realnode.bin_path("ctr")))
        except realnode.images.ImageError as e:
            raise tb.TestbedError(str(e)) from None
        return name

    def label_nodes(self) -> None:
        for node in self.nodes.nodes:
            realnode.api_request(self.bed, "PATCH", f"/api/v1/nodes/{node.name}",
                                 {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}})

    def install(self) -> None:
        self.import_images()
        self.label_nodes()
        self.helm("install", self.name, str(CHART), "-n", self.namespace, "--create-namespace",
                  *self.testbed_values(), *self.values)

    def upgrade(self, *more: str) -> None:
        self.values = [*self.values, *more]
        self.helm("upgrade", self.name, str(CHART), "-n", self.namespace, *self.testbed_values(), *self.values)

    def uninstall(self, timeout_s: float = 120.0) -> None:
        """`helm uninstall`, then wait until the release's pods are gone (their containers stopped)."""
        self.helm("uninstall", self.name, "-n", self.namespace)
        deadline = time.monotonic() + timeout_s
        while self.pods():
            if time.monotonic() > deadline:
                raise tb.TestbedError(f"the release's pods outlived helm uninstall by {timeout_s:.0f}s: "
                                      + ", ".join(p["metadata"]["name"] for p in self.pods()))
            time.sleep(0.5)

    # --- what runs -----------------------------------------------------------------------------------------
    def _get(self, path: str) -> Obj:
        return realnode.api_request(self.bed, "GET", path) or {}

    def extender_port(self) -> int:
        """The extender's port in the scheduler's pod (its dashboard: /ui), from the installed Deployment."""
        d = self._get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.fullname}-scheduler")
        spec = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
        return int(next(e["value"] for e in spec["env"] if e["name"] == "GPUPOOL_SCHEDULER_PORT"))

    def pods(self) -> list[Obj]:
        selector = f"app.kubernetes.io/instance={self.name}"
        return list(self._get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}").get("items") or [])

    def not_ready(self) -> list[str]:
        """What keeps the release from serving, one line each (empty: it serves)."""
        apps = f"/apis/apps/v1/namespaces/{self.namespace}"
        out = []
        for component in ("webhook", "scheduler"):
            d = self._get(f"{apps}/deployments/{self.fullname}-{component}")
            want, ready = (d.get("spec") or {}).get("replicas", 1), (d.get("status") or {}).get("readyReplicas", 0)
            if not d or ready != want:
                out.append(f"deployment {component}: {ready}/{want} ready")
        ds, nodes = (self._get(f"{apps}/daemonsets/{self.fullname}-agent").get("status") or {}), len(self.nodes.nodes)
        if ds.get("numberReady", 0) != nodes or ds.get("desiredNumberScheduled") != nodes:
            out.append(f"daemonset agent: {ds.get('numberReady', 0)}/{ds.get('desiredNumberScheduled', 0)} ready, "
                       f"want {nodes}")
        slices = self._get(f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices?labelSelector="
                           f"kubernetes.io/service-name={self.fullname}-webhook").get("items") or []
        if not any((e.get("conditions") or {}).get("ready") for s in slices for e in s.get("endpoints") or []):
            out.append("service webhook: no ready endpoint")
        for node in self.nodes.nodes:
            slots = gpu_slots(self.bed, node.name)
            if slots <= 0:
                out.append(f"node {node.name}: allocatable gpupool.io/gpu {slots}")
        if self.dra:
            published = {s["spec"].get("nodeName") for s in self._get(
                f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver={DRA_DRIVER}").get("items") or []}
            out += [f"node {n.name}: no ResourceSlice of {DRA_DRIVER}" for n in self.nodes.nodes
                    if n.name not in published]
        return out

    def describe_pods(self) -> str:
        """Each pod of the release: phase, node, and why a container waits (for failure messages)."""
        lines = []
        for pod in self.pods():
            status = pod.get("status") or {}
            why = [f"{c['name']}: {next(iter(c.get('state') or {}), '?')} "
                   f"{((c.get('state') or {}).get('waiting') or {}).get('message') or ''}".strip()
                   for c in status.get("containerStatuses") or [] if not c.get("ready")]
            lines.append(f"{pod['metadata']['name']} {status.get('phase')} on {pod['spec'].get('nodeName')}: "
                         + ("; ".join(why) or "ready"))
        return "\n".join(lines) or "no pods"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until the webhook's pods serve behind its Service, the scheduler's pod (kube-scheduler and the
        extender) is Ready, and each node's agent pod is Ready with its GPUs allocatable."""
        deadline = time.monotonic() + timeout_s
        while problems := self.not_ready():
            if time.monotonic() > deadline:
                raise tb.TestbedError(f"the release's pods not ready after {timeout_s:.0f}s: {'; '.join(problems)}\n"
                                      f"{self.describe_pods()}")
            time.sleep(1)

    def agent_ready_seconds(self) -> dict[str, float]:
        """Per agent pod: from its creation to its Ready condition (the API's second resolution)."""
        from datetime import datetime

        def at(stamp: str) -> float:
            return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").timestamp()

        out = {}
        for pod in self.pods():
            if (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "agent":
                continue
            ready = next((c for c in (pod.get("status") or {}).get("conditions") or []
                          if c["type"] == "Ready" and c["status"] == "True"), None)
            if ready:
                created = pod["metadata"]["creationTimestamp"]
                out[pod["metadata"]["name"]] = at(ready["lastTransitionTime"]) - at(created)
        return out

    def processes(self) -> list[ReleaseProcess]:
        """This release's programs among this host's processes, each with the pod it runs in (if any)."""
        local = self.nodes.local
        assert local is not None
        markers = (f"={self.namespace}", f":{self.namespace}:", f"={local / 'hook'}")
        roots = [n.cgroup_root.strip("/") + "/" for n in self.nodes.nodes]
        out = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                env = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                cgroups = (proc / "cgroup").read_text().splitlines()
            except OSError:
                continue  # gone meanwhile
            role = _role(argv, self.name)
            if role is None or (role != "kube-scheduler" and not any(m in v for v in env for m in markers)):
                continue
            pod = ""
            for line in cgroups:
                path = line.split(":", 2)[-1].lstrip("/")
                if any(path.startswith(r) for r in roots) and "/pod" in path:
                    pod = path.split("/pod", 1)[1].split("/", 1)[0]
                    break
            out.append(ReleaseProcess(int(proc.name), role, pod))
        return out


@dataclass(frozen=True)
class ReleaseProcess:
    pid: int
    role: str  # agent, scheduler (the extender), webhook, kube-scheduler
    pod_uid: str  # from its cgroup under a node's kubepods (the cgroupfs driver's pod<uid>); "" outside any


def _role(argv: list[str], release: str) -> str | None:
    """The gpupool role of a command line (`gpupool agent|scheduler|webhook`, whatever interpreter runs the
    entry point), or kube-scheduler with the chart's configuration (in a pod, or a LocalRelease's copy)."""
    for i, arg in enumerate(argv[:-1]):
        if Path(arg).name == "gpupool" and argv[i + 1] in ROLES:
            return argv[i + 1]
    if argv and Path(argv[0]).name == "kube-scheduler" and any(
            "/etc/gpupool/scheduler-config.yaml" in a or f"release-{release}/" in a for a in argv):
        return "kube-scheduler"
    return None


def gpu_slots(bed: tb.Testbed, node: str) -> int:
    obj = realnode.api_request(bed, "GET", f"/api/v1/nodes/{node}") or {}
    return int(((obj.get("status") or {}).get("allocatable") or {}).get("gpupool.io/gpu", "0"))


def example_pod(name: str, namespace: str, memory_mib: int = 10240, cores: int = 30,
                node_selector: dict[str, str] | None = None, testbed_taint: bool = True) -> Obj:
    """A share pod as a tenant writes it: no schedulerName (the release's webhook sets it), the testbed's
    busybox image (never pulled) and, with `testbed_taint`, a toleration for the real-node taint of a test's
    nodes (RealNodes(taint=True))."""
    pod: Obj = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": realnode.images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "/gpupool/grant; exec sleep 1000000"],
                            "resources": {"limits": {"gpupool.io/gpu": "1",
                                                     "gpupool.io/gpu-memory": str(memory_mib),
                                                     "gpupool.io/gpu-cores": str(cores)}}}],
        },
    }
    if testbed_taint:
        pod["spec"]["tolerations"] = [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    if node_selector:
        pod["spec"]["nodeSelector"] = node_selector
    return pod


def dump(obj: Obj) -> str:
    return json.dumps(obj, indent=1)
