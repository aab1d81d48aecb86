"""A release of the Helm chart (deploy/helm/gpupool) installed on the testbed, its own pods run by the
testbed's real kubelets (`ChartRelease`), as on any cluster.

The images `scripts/image` wrote (build/image/images.json: the gpupool image of the repository's Dockerfile,
and registry.k8s.io/kube-scheduler:<the testbed's version>, the name and tag the chart uses) are imported into
each node's containerd, and `helm install` runs with `pullPolicy: Never`. The testbed must serve pods
(`Testbed(serve_pods=True)`: the `kubernetes` Service behind kube-proxy, the root CA in each namespace) and
run a default kube-scheduler (`start_default_scheduler`), which places the release's own Deployments and
DaemonSet pods as on any cluster. The nodes are labelled gpupool.io/gpu-node=true for the agent's DaemonSet;
its fake GPUs are one ConfigMap whose UUIDs name the node ({node}: GPU-<node>-<i>); its hook and MPS roots
are host directories of this testbed's nodes. The API server calls the webhook at its Service's endpoint (a
pod address on a node's bridge, which this host routes to). DRA is on (`dra.enabled`, unless
ChartRelease(dra=False)) with the chart's own paths: each agent pod mounts /var/lib/kubelet/plugins_registry,
/var/lib/kubelet/plugins/gpu.gpupool.io and /var/run/cdi, which in each real node's mount namespace are that
node's kubelet directories and the CDI directory its containerd reads (scripts/k8s/realnode.py); GPUs 0 and
1 of each node are NVLink peers (the fake file), so docs/claims.md's NVLink example is allocatable. With
ChartRelease(remote=True) each agent pod also runs its node's GPU servers (`dra.remote.enabled`) over the
fake CUDA driver of tests/native/fakes, compiled into a host directory every node sees
(`dra.remote.fakeDriverDir`), and pods dial them at the agent pods' own addresses (`dra.remote.address=
podIP`: the nodes' addresses are loopback ones, and the nodes share this host's network namespace).

What the testbed lacks and a cluster has is all this module adds beside helm: the images in each node's
containerd (a registry's job), the GPU-node label (an administrator's), and the testbed's values
(`ChartRelease.testbed_values`: fake GPUs, the nodes' own host directories, helm-made webhook certificates).
Nothing of the release runs outside its pods (`ChartRelease.processes` finds any program that does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    remote: bool = False  # the chart's dra.remote.enabled: each agent pod runs its node's GPU server

    @property
    def fullname(self) -> str:
        """The chart's own naming: the release's name, with `-gpupool` unless it contains it."""
        return self.name if "gpupool" in self.name else f"{self.name}-gpupool"

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(helm_binary()), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise tb.TestbedError(f"helm {' '.join(args[:2])}: {done.stderr.strip()}")
        return done

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
                "--set", f"dra.enabled={str(self.dra).lower()}", *self.remote_values()]

    def remote_values(self) -> list[str]:
        """Remote shares on the testbed: the GPU servers load the fake CUDA driver (fake_driver), and pods
        dial a server at its agent pod's address: the nodes' own addresses are loopback ones, which a pod
        cannot reach, and the nodes share this host's network namespace, so their hostPorts would clash."""
        if not self.remote:
            return []
        return ["--set", "dra.remote.enabled=true", "--set", "dra.remote.address=podIP",
                "--set", f"dra.remote.fakeDriverDir={self.fake_driver_dir()}"]

    def fake_driver_dir(self) -> Path:
        assert self.nodes.root is not None, "the nodes are not started"
        return self.nodes.root / "fake-cuda"

    def build_fake_driver(self) -> None:
        """The fake CUDA driver of tests/native/fakes (the probe image's build: -Bsymbolic, so that its
        internal calls do not come back through the interception library the server preloads), in a host
        directory every node sees; the image carries no driver, as a real one comes from the node."""
        out = self.fake_driver_dir()
        out.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-o",
                               str(out / "libcuda.so.1"), str(ROOT / "tests" / "native" / "fakes" / "fake_cuda.c"),
                               "-lpthread"], capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise tb.TestbedError(f"compiling the fake CUDA driver: {done.stderr.strip()}")

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
        if self.remote:
            self.build_fake_driver()
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

    def component_pods(self, component: str) -> list[Obj]:
        """The release's pods of `component` (agent, scheduler, webhook) that are not being deleted."""
        return [p for p in self.pods() if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
                == component and not p["metadata"].get("deletionTimestamp")]

    def agent_pod(self, node: str) -> Obj | None:
        return next((p for p in self.component_pods("agent") if p["spec"].get("nodeName") == node), None)

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
            role = _role(argv)
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


def _role(argv: list[str]) -> str | None:
    """The gpupool role of a command line (`gpupool agent|scheduler|webhook`, whatever interpreter runs the
    entry point), or kube-scheduler with the chart's configuration."""
    for i, arg in enumerate(argv[:-1]):
        if Path(arg).name == "gpupool" and argv[i + 1] in ROLES:
            return argv[i + 1]
    if argv and Path(argv[0]).name == "kube-scheduler" and any(
            "/etc/gpupool/scheduler-config.yaml" in a for a in argv):
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
