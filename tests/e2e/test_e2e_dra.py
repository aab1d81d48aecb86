"""gpupool's DRA driver on real nodes: claims created with kubectl are allocated by a plain kube-scheduler (its
default profile's DynamicResources plugin, no gpupool extender), the real kubelet 1.37 calls the agent's DRA
service (NodePrepareResources), containerd starts the container from the CDI spec the agent wrote, and what
the container sees from inside is exactly what the claim's allocation says.

The agents run as the chart's agent with `dra.enabled=true`: its ServiceAccount, ClusterRole and own-node
admission policies rendered by helm as release `gpd` (the session's release `gp` has DRA off, and its rules
are what test_e2e_rbac.py compares the `gp` accounts with), each with a token bound to its Node. The
DeviceClasses are the chart's too. Two real nodes, two fake L40S GPUs each.

gpupool's own allocator (gpupool.scheduler.claims) is tested here too: `gpupool scheduler` as a process of
its own under release `gpd`'s scheduler ServiceAccount (the chart's rules with dra.enabled: pods `patch`
on top of system:kube-scheduler, and the chart's admission policy for its pod patches), pods carrying the
scheduling gate gpu.gpupool.io/allocate as the webhook puts it (created with the gate here). gpupool
writes the claim's allocation and removes the gate; the same plain kube-scheduler then reserves the claim
and binds the pod, and kubelet prepares it through the agent as for any claim.

The agents serve the device plugin beside the DRA driver (`--device-plugin-with-dra`, the chart's
`dra.devicePlugin`, on by default): each node also offers `gpupool.io/gpu` slots. One test runs a pod that
asks for `gpupool.io/gpu*`, scheduled through gpupool's extender (the same `gpupool scheduler` process, a
kube-scheduler profile of its own with the chart's extender entry), beside a claim on the same GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.proto import dra_v1beta1_pb2 as v1beta1
from gpupool.agent.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from gpupool.api.dra import CDI_KIND, DRIVER, SCHEDULING_GATE, TAINT_UNHEALTHY
from gpupool.api.inventory import read_node
from gpupool.api.moves import MOVES_CONFIGMAP, Move, read_moves
from gpupool.api.names import ANN_ALLOCATION, ANN_UUID, RESOURCE_GPU
from gpupool.core.model import GPURequest, PodRequest
from gpupool.core.placement import Unschedulable, place
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext, TaskShape
from gpupool.core.state import ClusterState
from tests.e2e.conftest import Extender, chart_scheduler_config
from tests.e2e.kubectl_tool import kubectl_binary
from tests.e2e.real_node_fixtures import (
    GRANT_COMMAND,
    _ensure_tools,
    describe_pod,
    images,
    parse_grant,
    phase,
    realnode,
    share_pod,
    wait_for,
)
from tests.e2e.real_node_fixtures import expected_grant as device_plugin_grant
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]

NAMESPACE = "e2e-dra"
RELEASE, RELEASE_NAMESPACE = "gpd", "gpupool-system"
AGENT_ACCOUNT = f"{RELEASE}-gpupool-agent"
SCHEDULER_ACCOUNT = f"{RELEASE}-gpupool-scheduler"
# The chart's templates that make the agent and the scheduler who they are with DRA on, and the classes
# claims name.
CHART_TEMPLATES = ("templates/agent/serviceaccount.yaml", "templates/agent/rbac.yaml",
                   "templates/agent/admissionpolicy.yaml", "templates/scheduler/serviceaccount.yaml",
                   "templates/scheduler/rbac.yaml", "templates/scheduler/admissionpolicy.yaml",
                   "templates/dra/deviceclasses.yaml")
SCHEDULER = "gpupool-dra-e2e"  # a plain kube-scheduler profile of its own: no other scheduler takes these pods
GPUS = 2
GPU_MIB = 46068
HOOK_MOUNTS = {"/usr/local/lib/gpupool/libgpupool_hook.so", "/etc/ld.so.preload", "/run/gpupool/hook",
               "/run/gpupool/limits"}
_REGISTERED = "kubelet registered DRA driver"


# --- the chart's objects ------------------------------------------------------------------------------------


def chart_objects(kube_version: str) -> list[Obj]:
    """The chart's agent identity, rules and policies and its DeviceClasses, `dra.enabled=true` with remote
    serving (`dra.remote.enabled=true`), as release `gpd` (rendered by the helm built from its Go module)."""
    from tests.deploy.helm_tool import helm_binary

    helm = helm_binary(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")
    out = subprocess.run(
        [str(helm), "template", RELEASE, str(ROOT / "deploy" / "helm" / "gpupool"), "--namespace", RELEASE_NAMESPACE,
         "--kube-version", kube_version.lstrip("v"), "--set", "dra.enabled=true", "--set", "dra.remote.enabled=true",
         *(a for t in CHART_TEMPLATES for a in ("--show-only", t))],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# --- claims and pods ----------------------------------------------------------------------------------------


def claim_spec(memory: str | None = None, cores: str | None = None, device_class: str = DRIVER,
               selector: str | None = None, config: list[Obj] | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": device_class}
    requests = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if requests:
        exactly["capacity"] = {"requests": requests}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config:
        devices["config"] = config
    return {"devices": devices}


def claim_template(name: str, **kw: Any) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"spec": claim_spec(**kw)}}


def claim(name: str, **kw: Any) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": claim_spec(**kw)}


def claim_pod(name: str, node: str | None, *, template: str | None = None, claim_name: str | None = None,
              image: str = images.BUSYBOX_IMAGE, command: list[str] | None = None) -> Obj:
    """A pod whose one container uses one claim (from `template`, or the ResourceClaim `claim_name`), pinned
    to `node` (None: any real node), printing its grant."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim_name}
    spec: Obj = {
        "schedulerName": SCHEDULER,
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": False,
        "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "resourceClaims": [{"name": "gpu", **source}],
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                        "command": command or GRANT_COMMAND, "resources": {"claims": [{"name": "gpu"}]}}],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti)?$")


def mib(quantity: str) -> int:
    """A memory quantity as the API server writes it back (binary suffixes or bytes) in MiB."""
    m = _QUANTITY.match(quantity)
    assert m is not None, f"unexpected quantity {quantity!r}"
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]
    return int(m.group(1)) * scale // (1 << 20)


# --- the CDI spec format ------------------------------------------------------------------------------------

# From the CDI specification (github.com/cncf-tags/container-device-interface, SPEC.md, version 0.6.0):
# kind = <vendor: a DNS subdomain>/<class: 63 characters at most, alphanumeric at both ends, - _ . between>;
# a device's name alphanumeric at both ends with - _ . (and : since 0.5) between; env entries VAR=value;
# mounts need hostPath and containerPath (absolute paths), options a list of strings.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_CDI_VENDOR = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_CDI_CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_CDI_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def cdi_problems(spec: Any) -> list[str]:
    """What in `spec` breaks the CDI format (empty: it is a valid spec of the fields gpupool uses)."""
    if not isinstance(spec, dict):
        return ["not an object"]
    out = []
    if not (isinstance(spec.get("cdiVersion"), str) and _CDI_VERSION.match(spec["cdiVersion"])):
        out.append(f"cdiVersion {spec.get('cdiVersion')!r} is not a semantic version")
    vendor, _, cls = str(spec.get("kind", "")).partition("/")
    if not (_CDI_VENDOR.match(vendor) and len(vendor) <= 253 and _CDI_CLASS.match(cls)):
        out.append(f"kind {spec.get('kind')!r} is not vendor/class")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        return [*out, "devices: a non-empty list is required"]
    for i, d in enumerate(devices):
        if not (isinstance(d.get("name"), str) and _CDI_NAME.match(d["name"])):
            out.append(f"devices[{i}].name {d.get('name')!r} is not a device name")
        edits = d.get("containerEdits")
        if not isinstance(edits, dict):
            out.append(f"devices[{i}].containerEdits: an object is required")
            continue
        for e in edits.get("env", []):
            if not (isinstance(e, str) and _ENV.match(e)):
                out.append(f"devices[{i}].containerEdits.env: {e!r} is not VAR=value")
        for m in edits.get("mounts", []):
            for key in ("hostPath", "containerPath"):
                if not (isinstance(m.get(key), str) and m[key].startswith("/")):
                    out.append(f"devices[{i}].containerEdits.mounts: {key} {m.get(key)!r} is not an absolute path")
            if not (isinstance(m.get("options", []), list) and all(isinstance(o, str) for o in m.get("options", []))):
                out.append(f"devices[{i}].containerEdits.mounts: options {m.get('options')!r} is not a list of strings")
        unknown = set(edits) - {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids"}
        if unknown:
            out.append(f"devices[{i}].containerEdits: unknown fields {sorted(unknown)}")
    return out


def test_the_cdi_checker_finds_what_breaks_the_format() -> None:
    """The checker below holds the agent's specs to the format only if it can fail: broken specs fail it."""
    good = {"cdiVersion": "0.6.0", "kind": "gpu.gpupool.io/claim", "devices": [{"name": "0b6f-11", "containerEdits": {
        "env": ["A=1"], "mounts": [{"hostPath": "/a", "containerPath": "/b", "options": ["ro"]}]}}]}
    assert cdi_problems(good) == []
    broken: list[Obj] = [
        {**good, "cdiVersion": "6"},
        {**good, "kind": "claim"},
        {**good, "kind": "gpu.gpupool.io/claim/x"},
        {**good, "devices": []},
        {**good, "devices": [{"name": "-x", "containerEdits": {}}]},
        {**good, "devices": [{"name": "x", "containerEdits": {"env": ["=1"]}}]},
        {**good, "devices": [{"name": "x", "containerEdits": {"mounts": [{"hostPath": "a", "containerPath": "/b"}]}}]},
        {**good, "devices": [{"name": "x", "containerEdits": {"mounts": [
            {"hostPath": "/a", "containerPath": "/b", "options": "ro"}]}}]},
    ]
    for spec in broken:
        assert cdi_problems(spec), spec


# --- the nodes' agents ------------------------------------------------------------------------------------


@dataclass
class DraAgent:
    """`gpupool agent --dra` for one real node, as the chart's DaemonSet runs it with dra.enabled (the node's
    kubelet root and CDI directory), with fake GPUs; restartable, killable."""

    node: realnode.RealNode
    kubeconfig: Path
    proc: subprocess.Popen[bytes] | None = None
    gpus: int = GPUS
    broken: tuple[int, ...] = ()  # GPU indices the fake file declares unhealthy (they fail every probe)
    remote_key: Path | None = None  # the cluster's remote key (the chart's Secret): every agent has it
    fake_cuda_dir: Path | None = None  # the fake driver a GPU server loads (remote serving only)
    # The device plugin beside the DRA driver (--device-plugin-with-dra), as the chart's dra.devicePlugin
    # (on by default): the node offers gpupool.io/gpu slots of the same GPUs.
    device_plugin: bool = True

    @property
    def log(self) -> Path:
        return self.node.dir / "agent.log"

    @property
    def fake_file(self) -> Path:
        return self.node.dir / "gpus.json"

    @property
    def cdi_dir(self) -> Path:
        return self.node.dir / "cdi"  # where this node's containerd reads CDI specs (realnode.py)

    @property
    def hook_root(self) -> Path:
        return self.node.dir / "hook"

    @property
    def checkpoint_file(self) -> Path:
        return self.node.dir / "agent-state" / "dra-claims.json"

    @property
    def service_socket(self) -> Path:
        return self.node.kubelet_root / "plugins" / DRIVER / "dra.sock"

    @property
    def gpu_uuids(self) -> list[str]:
        return [f"GPU-{self.node.name.replace('.', '-')}-{i}" for i in range(self.gpus)]

    def start(self, broken: tuple[int, ...] = (), mig: tuple[int, ...] = (), serve: str | None = None) -> None:
        """With `mig`, those GPUs are H100s in MIG mode (the fake MIG driver carves their instances). With
        `serve` (tcp:HOST:PORT, HOST an address of this machine that pods reach), the agent runs its GPU
        servers over the fake driver, listening on every address at PORT and advertising `serve`."""
        self.broken = broken
        gpus = [{"uuid": u, "model": "L40S", "memory_mib": GPU_MIB, "numa_node": 0, "compute_capability": "8.9",
                 **({"healthy": False} if i in broken else {}),
                 **({"model": "H100-80GB", "memory_mib": 81920, "compute_capability": "9.0", "mig": True}
                    if i in mig else {})}
                for i, u in enumerate(self.gpu_uuids)]
        self.fake_file.write_text(json.dumps({"driver_version": "570.86", "cuda_version": "12.8", "gpus": gpus}))
        argv = [*tb.gpupool_argv(), "agent", "--node-name", self.node.name, "--backend", "fake",
                "--fake-file", str(self.fake_file), "--dra", "--kubelet-root", str(self.node.kubelet_root),
                "--cdi-dir", str(self.cdi_dir), "--device-plugin-dir", str(self.node.device_plugin_dir),
                "--device-plugin-with-dra" if self.device_plugin else "--no-device-plugin-with-dra",
                "--kubeconfig", str(self.kubeconfig), "--inventory-interval-s", "2", "--log-level", "info"]
        env = {"GPUPOOL_AGENT_HOOK_ROOT": str(self.hook_root),  # each node has its own /run
               "GPUPOOL_AGENT_CHECKPOINT_DIR": str(self.checkpoint_file.parent)}
        if self.remote_key is not None:  # remote shares: prepared here, moves followed in the release's namespace
            argv += ["--remote-key", str(self.remote_key), "--moves-namespace", RELEASE_NAMESPACE]
        if serve is not None:
            assert self.fake_cuda_dir is not None
            argv += ["--remote-listen", f"tcp:0.0.0.0:{serve.rsplit(':', 1)[1]}", "--remote-address", serve]
            # the servers' workers inherit the agent's environment: the fake driver and its device state
            env.update(LD_LIBRARY_PATH=str(self.fake_cuda_dir), FAKE_GPU_STATE=str(self.node.dir / "remote-gpu"))
        self.proc = tb.spawn(f"agent@{self.node.name}", argv, self.log, env).popen

    def kill(self) -> None:
        tb.kill_process(self.proc)

    def restart(self, kill: bool = False, broken: tuple[int, ...] = (), mig: tuple[int, ...] = (),
                serve: str | None = None) -> None:
        """Stop (or kill: no clean-up of any kind) and start again with these GPUs; returns once kubelet
        registered the new run."""
        registrations = self.registrations()
        if kill:
            self.kill()
        else:
            self.stop()
        self.start(broken=broken, mig=mig, serve=serve)
        wait_for(lambda: self.registrations() > registrations, 90, "the restarted agent registered", self.tail)

    def stop(self) -> None:
        tb.stop_process(self.proc, 15)

    def registrations(self) -> int:
        """Registrations kubelet confirmed, over every run of this agent (the log is appended)."""
        try:
            return self.log.read_text(errors="replace").count(_REGISTERED)
        except OSError:
            return 0

    def prepared(self) -> dict[str, Obj]:
        """The agent's DRA checkpoint: claim UID -> what prepare answered."""
        try:
            doc = json.loads(self.checkpoint_file.read_text())
        except FileNotFoundError:
            return {}
        return {c["uid"]: c for c in doc["claims"]}

    def cdi_spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"{DRIVER}-claim_{uid}.json"

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class DraCluster:
    bed: tb.Testbed
    nodes: realnode.RealNodes
    objects: list[Obj]  # the chart's, as applied
    agents: list[DraAgent] = field(default_factory=list)
    kubectl_path: Path = Path("kubectl")

    def node(self, i: int) -> realnode.RealNode:
        return self.nodes.nodes[i]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(kubeconfig or self.bed.kubeconfig()),
                               *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def apply(self, objects: list[Obj]) -> None:
        """Create objects as a user would: one `kubectl apply` of a List."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def get(self, path: str) -> Obj | None:
        return realnode.api_request(self.bed, "GET", path)

    def pod(self, name: str) -> Obj | None:
        return self.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def pods(self) -> list[Obj]:
        return list((self.get(f"/api/v1/namespaces/{NAMESPACE}/pods") or {}).get("items") or [])

    def claims(self) -> list[Obj]:
        return list((self.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims") or {})
                    .get("items") or [])

    def pod_claim(self, pod: Obj) -> Obj:
        """The ResourceClaim a pod's `gpu` entry uses (generated from its template, or named)."""
        entry = pod["spec"]["resourceClaims"][0]
        name = entry.get("resourceClaimName") or next(
            s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"] if s["name"] == entry["name"])
        got = self.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}")
        assert got is not None, f"claim {name} of pod {pod['metadata']['name']}"
        return got

    def slice(self, i: int) -> Obj | None:
        return self.get(f"/apis/resource.k8s.io/v1/resourceslices/{self.node(i).name}-{DRIVER}")

    def wait_running(self, names: list[str], timeout_s: float = 150.0) -> list[Obj]:
        def check() -> list[Obj] | None:
            pods = [self.pod(n) for n in names]
            if all(p is not None and phase(p) == "Running" for p in pods):
                return pods  # type: ignore[return-value]
            bad = [p for p in pods if p is not None and phase(p) == "Failed"]
            if bad:
                raise AssertionError(f"pods failed: {[describe_pod(p) for p in bad]}")
            return None

        def stuck() -> str:
            pods = {n: self.pod(n) for n in names}
            events = "\n".join(f"events of {n}: {self.events_of(n)}" for n, p in pods.items()
                               if p is None or phase(p) != "Running")
            return "; ".join(map(describe_pod, pods.values())) + "\n" + events + "\n" + self.agent_tails()

        return wait_for(check, timeout_s, f"pods {names} Running", stuck)  # type: ignore[no-any-return]

    def events(self) -> list[Obj]:
        """Every Event of the test namespace, oldest first."""
        return list((self.get(f"/api/v1/namespaces/{NAMESPACE}/events") or {}).get("items") or [])

    def events_of(self, name: str) -> list[str]:
        """Every Event on the pod `name` (kubelet's FailedPrepareDynamicResources among them), as lines."""
        return [f"{e.get('reason')} x{e.get('count', 1)} from {(e.get('source') or {}).get('component')}: "
                f"{e.get('message')}" for e in self.events() if e["involvedObject"].get("name") == name]

    def delete_pods(self, names: list[str], force: bool = False) -> None:
        extra = ["--grace-period=0", "--force"] if force else []
        self.kubectl("delete", "pod", "-n", NAMESPACE, "--wait=false", "--ignore-not-found", *extra, *names)

    def grant(self, name: str) -> tuple[dict[str, str], set[str]]:
        """What the pod's container says it received: its gpupool/NVIDIA variables and gpupool mounts."""
        return parse_grant(self.kubectl("logs", "-n", NAMESPACE, name).stdout)

    def exec(self, pod: str, *argv: str) -> str:
        return self.kubectl("exec", "-n", NAMESPACE, pod, "-c", "main", "--", *argv).stdout

    def agent_of(self, pod: Obj) -> DraAgent:
        return next(a for a in self.agents if a.node.name == pod["spec"]["nodeName"])

    def agent_tails(self) -> str:
        return "\n".join(f"--- agent {a.node.name}:\n{a.tail(12)}" for a in self.agents)

    def clear(self) -> None:
        """No pod and no claim left, and every claim unprepared by its node's agent: the next test starts on
        empty GPUs."""
        names = [p["metadata"]["name"] for p in self.pods()]
        if names:
            self.delete_pods(names, force=True)
        wait_for(lambda: not self.pods(), 90, "pods deleted")
        self.kubectl("delete", "resourceclaims,resourceclaimtemplates", "--all", "-n", NAMESPACE, "--wait=false")
        wait_for(lambda: not self.claims(), 90, "claims deleted",
                 lambda: str([(c["metadata"]["name"], c["metadata"].get("finalizers")) for c in self.claims()]))
        wait_for(lambda: not any(a.prepared() for a in self.agents), 90, "every claim unprepared",
                 lambda: str({a.node.name: list(a.prepared()) for a in self.agents}))


def scheduler_config() -> str:
    """kube-scheduler's own defaults (DynamicResources allocates the claims), one profile, no extender."""
    return json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": "__KUBECONFIG__"}, "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER}],
    })


def slice_ready(c: DraCluster, i: int) -> bool:
    s = c.slice(i)
    return s is not None and len(s["spec"].get("devices") or []) == c.agents[i].gpus


def fake_cuda_driver(out: Path) -> Path:
    """The fake CUDA driver as a GPU server loads it (built as the probe image's, -Bsymbolic: its internal
    calls must not come back through the interception library); returns its directory."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-o", str(out / "libcuda.so.1"),
                    str(ROOT / "tests" / "native" / "fakes" / "fake_cuda.c"), "-lpthread"], check=True, timeout=120)
    return out


def start_dra_cluster(bed: tb.Testbed, count: int = 2, gpus: int = GPUS, keep: bool = False) -> DraCluster:
    """`count` real nodes with `gpus` fake GPUs and a DRA agent each (chart identity `gpd`, node-bound
    tokens), the chart's DeviceClasses, a plain kube-scheduler (process `kube-scheduler-dra`); returns once
    every node's slice is published and every agent registered with its kubelet. Stop: `stop_dra_cluster`."""
    objects = chart_objects(bed.server_version())
    bed.ensure("/api/v1/namespaces", {"metadata": {"name": RELEASE_NAMESPACE}})
    nodes = realnode.RealNodes(bed, count, keep=keep, taint=True)
    c = DraCluster(bed, nodes, objects, kubectl_path=kubectl_binary())
    remote_key = bed.dir / "gpd-remote-key"  # the chart's Secret, as the agents mount it
    remote_key.write_text(os.urandom(32).hex())
    remote_key.chmod(0o600)
    fake_cuda = fake_cuda_driver(bed.dir / "fake-cuda")
    try:
        c.apply(objects)
        nodes.start()
        bed.tenant_namespace(NAMESPACE)  # Pod Security baseline, as a tenant's namespace has it
        for node in nodes.nodes:
            # bound to the Node: the chart's own-node policies read the node from the token, as from a pod's
            kubeconfig = bed.service_account_kubeconfig(RELEASE_NAMESPACE, AGENT_ACCOUNT, node=node.name)
            agent = DraAgent(node, kubeconfig, gpus=gpus, remote_key=remote_key, fake_cuda_dir=fake_cuda)
            c.agents.append(agent)
            agent.start()
        bed.start_scheduler(scheduler_config(), name="kube-scheduler-dra")
        for i, agent in enumerate(c.agents):
            wait_for(lambda a=agent: a.registrations() >= 1, 90,  # type: ignore[misc]
                     f"agent {agent.node.name} registered", agent.tail)
            wait_for(lambda i=i: slice_ready(c, i), 90, f"slice of {agent.node.name}", agent.tail)  # type: ignore[misc]
    except BaseException:
        stop_dra_cluster(c)
        raise
    return c


def stop_dra_cluster(c: DraCluster) -> None:
    names = [p["metadata"]["name"] for p in c.pods()]
    if names:
        c.delete_pods(names, force=True)
    for agent in c.agents:
        agent.stop()
    c.bed.stop_scheduler("kube-scheduler-dra")
    c.nodes.stop()  # the slices go with their Nodes (owner references)
    c.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", check=False,
              stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": c.objects}))


@contextlib.contextmanager
def dra_cluster(testbed: tb.Testbed, start: Callable[..., DraCluster] = start_dra_cluster) -> Iterator[DraCluster]:
    """A module's cluster from `start(testbed, keep=...)`, stopped at the end; a start that fails fails the test."""
    _ensure_tools()
    try:
        c = start(testbed, keep=os.environ.get("GPUPOOL_E2E_KEEP") == "1")
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield c
    finally:
        stop_dra_cluster(c)


@pytest.fixture(scope="module")
def dra(testbed: tb.Testbed) -> Iterator[DraCluster]:
    with dra_cluster(testbed) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the nodes (passed or failed): no pod, no claim, nothing prepared."""
    yield
    if "dra" in request.fixturenames:
        request.getfixturevalue("dra").clear()


@pytest.fixture(scope="module")
def allocator(dra: DraCluster) -> Iterator[Extender]:
    """`gpupool scheduler` as its own process, as the chart runs it (no election of its own), under release
    `gpd`'s scheduler ServiceAccount: every request it makes is checked against the chart's dra.enabled
    rules (test_the_scheduler_used_only_the_charts_dra_rules). Only its ClaimAllocator matters here: claim
    pods need no extender entry in kube-scheduler's configuration, since gpupool has decided their node
    before kube-scheduler sees them."""
    with claim_allocator(dra, "gpupool-scheduler-dra.log") as ext:
        yield ext


@contextlib.contextmanager
def claim_allocator(c: DraCluster, log_name: str) -> Iterator[Extender]:
    """`gpupool scheduler` under release `gpd`'s scheduler account, placing the claims of gated pods, ready
    once every node of `c` is in its ledger."""
    bed = c.bed
    kubeconfig = bed.service_account_kubeconfig(RELEASE_NAMESPACE, SCHEDULER_ACCOUNT)
    # The chart sets GPUPOOL_SCHEDULER_DRA_PLACEMENT with dra.placement (on): only this scheduler places
    # claims, not the session's extender (release gp, DRA off), which leaves gated pods alone.
    ext = Extender(bed, tb.free_port(), bed.dir / log_name, kubeconfig, env={"GPUPOOL_SCHEDULER_DRA_PLACEMENT": "true"})
    ext.start()
    try:
        ext.wait_ready()
        # The nodes are in its ledger once their agents' inventories are (they were published before).
        wait_for(lambda: ext.ledger()["ledger"]["nodes"] >= len(c.agents), 60, "the DRA nodes in the ledger",
                 lambda: f"{ext.ledger()['ledger']}\n{ext.tail()}")
        yield ext
    finally:
        ext.stop()


# --- what a container must see ------------------------------------------------------------------------------


def expected_grant(c: DraCluster, claim_obj: Obj) -> tuple[dict[str, str], set[str]]:
    """The environment and mounts a container using `claim_obj` must receive, written from the claim's
    allocation and the driver's contract (api/dra.py, agent/grant.py), not from the agent's code: each
    result's device `gpu-<i>` is GPU i of its pool's node, its consumed memory and cores the caps (no cores
    consumed: no compute cap, 100), isolation hook (the only class used here), the library's mounts."""
    results = [r for r in claim_obj["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER]
    uuids, memory, cores = [], [], []
    for r in results:
        agent = next(a for a in c.agents if a.node.name == r["pool"])
        uuids.append(agent.gpu_uuids[int(r["device"].removeprefix("gpu-"))])
        consumed = r.get("consumedCapacity") or {}
        memory.append(str(mib(consumed["memory"])))
        cores.append(str(int(consumed.get("cores", "0")) or 100))
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(memory),
           "GPUPOOL_CORES_PERCENT": ",".join(cores), "GPUPOOL_ISOLATION": "hook",
           "GPUPOOL_HOOK_DIR": "/run/gpupool/hook", "GPUPOOL_CORES_MODE": "hard"}
    return env, set(HOOK_MOUNTS)


def limits_seen(c: DraCluster, pod: str) -> tuple[int, list[str]]:
    """The memory cap (bytes, offset 16 of `struct gp_limits`, native/gp.h) of the first GPU in the limits
    file the container's library reads, and the strings in it (its GPUs' UUIDs)."""
    path = "/run/gpupool/limits/limits.v1"
    cap = int(c.exec(pod, "od", "-A", "n", "-t", "u8", "-j", "16", "-N", "8", path).split()[0])
    return cap, c.exec(pod, "strings", path).split()


# --- the tests ----------------------------------------------------------------------------------------------


def test_the_api_server_keeps_every_field_of_the_slices_and_classes(dra: DraCluster) -> None:
    """The 1.37 API server accepted the agent's ResourceSlices and the chart's DeviceClasses as written: it
    drops the fields of features it has off, so every field gpupool relies on is read back."""
    c = dra
    for i, agent in enumerate(c.agents):
        s = c.slice(i)
        assert s is not None
        spec = s["spec"]
        assert (spec["driver"], spec["nodeName"], spec["pool"]["name"], spec["pool"]["resourceSliceCount"]) == (
            DRIVER, agent.node.name, agent.node.name, 1)
        owner = s["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Node", agent.node.name)
        assert [d["name"] for d in spec["devices"]] == [f"gpu-{k}" for k in range(GPUS)]
        for k, d in enumerate(spec["devices"]):
            attrs = d["attributes"]
            assert attrs["uuid"] == {"string": agent.gpu_uuids[k]} and attrs["index"] == {"int": k}
            assert attrs["computeCapability"] == {"version": "8.9.0"} and attrs["driverVersion"] == {
                "version": "570.86.0"}
            assert d["allowMultipleAllocations"] is True  # consumable capacity is on: several claims per GPU
            assert d["capacity"]["memory"]["value"] == f"{GPU_MIB}Mi"
            assert d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Mi"
            assert d["capacity"]["cores"]["value"] == "100"
            assert d["capacity"]["cores"]["requestPolicy"]["default"] == "0"
            assert not d.get("taints")
    for obj in (o for o in c.objects if o["kind"] == "DeviceClass"):
        got = c.get(f"/apis/resource.k8s.io/v1/deviceclasses/{obj['metadata']['name']}")
        assert got is not None and got["spec"] == obj["spec"], obj["metadata"]["name"]


def test_a_share_claim_reaches_a_running_pod_with_exactly_its_allocation(dra: DraCluster) -> None:
    c = dra
    n0, n1 = c.node(0).name, c.node(1).name
    # A template (one claim per pod, made by the controller) on node 0 and a claim of its own on node 1.
    c.apply([claim_template("share-8g-30", memory="8Gi", cores="30"), claim("own-12g-55", memory="12Gi", cores="55"),
             claim_pod("share", n0, template="share-8g-30"), claim_pod("own", n1, claim_name="own-12g-55")])
    pods = {p["metadata"]["name"]: p for p in c.wait_running(["share", "own"])}
    for name, (node, want_mib, want_cores) in {"share": (n0, 8192, 30), "own": (n1, 12288, 55)}.items():
        pod = pods[name]
        assert pod["spec"]["nodeName"] == node
        got = c.pod_claim(pod)
        (result,) = got["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, node), result
        # what the allocator wrote is what the claim asked for (the numbers the grant is then checked against)
        assert (mib(result["consumedCapacity"]["memory"]), int(result["consumedCapacity"]["cores"])) == (
            want_mib, want_cores)
        assert c.grant(name) == expected_grant(c, got), name
        cap, strings = limits_seen(c, name)
        uuid = c.agent_of(pod).gpu_uuids[int(result["device"].removeprefix("gpu-"))]
        assert cap == want_mib << 20 and uuid in strings, (name, cap, strings)
        tamper = c.exec(name, "sh", "-c", "echo 0 > /run/gpupool/limits/limits.v1 && echo written || echo refused")
        assert tamper.strip() == "refused", (name, tamper)
        # the agent's answer: one CDI device named by the claim's UID, its spec in the node's CDI directory
        uid = got["metadata"]["uid"]
        entry = c.agent_of(pod).prepared()[uid]
        assert entry["cdi_ids"] == [f"{CDI_KIND}={uid}"]
        assert [(d["pool"], d["device"]) for d in entry["devices"]] == [(node, result["device"])]
        spec = json.loads(c.agent_of(pod).cdi_spec_path(uid).read_text())
        assert cdi_problems(spec) == [], spec  # containerd accepted it too: the container runs with its edits
        assert spec["kind"] == CDI_KIND and [d["name"] for d in spec["devices"]] == [uid]
    # Deleting a pod unprepares its claim on its node: CDI spec, checkpoint entry and the claim's hook
    # directory go (what kubelet's NodeUnprepareResources asks for).
    share_uid = c.pod_claim(pods["share"])["metadata"]["uid"]
    agent0 = c.agent_of(pods["share"])
    assert (agent0.hook_root / "claims" / share_uid).is_dir()
    c.delete_pods(["share"])
    wait_for(lambda: share_uid not in agent0.prepared(), 90, "share's claim unprepared", agent0.tail)
    assert not agent0.cdi_spec_path(share_uid).exists()
    assert not (agent0.hook_root / "claims" / share_uid).exists()


def test_the_library_holds_the_claims_memory(dra: DraCluster) -> None:
    """A CUDA program in a container with a 1 GiB claim: the interception library the CDI spec mounted and
    preloaded refuses what goes beyond (the fake driver reports 80 GiB, so a refusal at 1 GiB is the cap's)."""
    c = dra
    mb = 1 << 20
    # 768 MiB fits, another 768 MiB does not, 16 bytes still do; then the same from a second process whose
    # environment asks for 64 GiB and its own accounting directory, as a tenant would: the read-only limits
    # file still holds it.
    asks = f"printf 'alloc mem {768 * mb}\\nalloc mem {768 * mb}\\nalloc mem 16\\n'"
    script = (f"{asks} | probe direct; {asks} | env GPUPOOL_MEMORY_LIMIT_MIB=65536 GPUPOOL_HOOK_DIR=/tmp "
              "probe direct; exec sleep 1000000")
    c.apply([claim_template("probe-1g", memory="1Gi", cores="20"),
             claim_pod("capped", c.node(0).name, template="probe-1g", image=images.PROBE_IMAGE,
                       command=["sh", "-c", script])])
    c.wait_running(["capped"])

    def answers() -> list[str] | None:
        # the library's own diagnostics (gpupool-hook[pid]: ...) share the log; they are not answers
        out = [line for line in c.kubectl("logs", "-n", NAMESPACE, "capped").stdout.splitlines()
               if line.strip() and not line.startswith("gpupool-hook")]
        return out if len(out) >= 6 else None

    lines = wait_for(answers, 60, "the probe's answers", lambda: c.kubectl("logs", "-n", NAMESPACE, "capped").stdout)
    codes = [int(line.split()[0]) for line in lines[:6]]
    assert codes == [0, 2, 0] * 2, lines  # 2 = CUDA_ERROR_OUT_OF_MEMORY


def test_a_tenants_claim_config_does_not_lift_the_hook(dra: DraCluster) -> None:
    """The claim's own opaque config (FromClaim) asks for isolation none on a whole GPU; the class says hook,
    and only the class's config chooses (api/dra.py): the container gets the library and the caps."""
    c = dra
    tenant = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1", "kind": "GpuConfig", "isolation": "none"}}}]
    # No capacity asked: the whole GPU, which isolation none would serve without any cap if it were chosen.
    c.apply([claim("wants-none", config=tenant), claim_pod("tenant", c.node(1).name, claim_name="wants-none")])
    (pod,) = c.wait_running(["tenant"])
    got = c.pod_claim(pod)
    configs = got["status"]["allocation"]["devices"]["config"]
    # The tenant's config did reach the driver (the allocation carries it beside the class's) ...
    assert {(x["source"], x["opaque"]["parameters"]["isolation"]) for x in configs} == {
        ("FromClaim", "none"), ("FromClass", "hook")}
    env, mounts = c.grant("tenant")
    # ... and changed nothing: hook, with the library, and the whole GPU's memory as its cap
    assert (env, mounts) == expected_grant(c, got)
    assert env["GPUPOOL_ISOLATION"] == "hook" and env["GPUPOOL_MEMORY_LIMIT_MIB"] == str(GPU_MIB)
    assert mounts >= HOOK_MOUNTS


def prepare_over_socket(socket: Path, ref: tuple[str, str, str], beta: bool = False) -> list[tuple[Any, ...]]:
    """NodePrepareResources on the agent's service socket, as kubelet calls it; the claim's answer as
    (requests, pool, device, CDI ids) per device (an error fails)."""
    namespace, name, uid = ref
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        if beta:
            reply = v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(v1beta1.NodePrepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=namespace, name=name, uid=uid)]), timeout=30)
        else:
            reply = v1_grpc.DRAPluginStub(channel).NodePrepareResources(v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace=namespace, name=name, uid=uid)]), timeout=30)
    answer = reply.claims[uid]
    assert not answer.error, answer.error
    return [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices]


def test_prepare_again_gives_the_same_answer(dra: DraCluster) -> None:
    """kubelet asks again (its restart, a timeout): a claim already prepared gets the answer it got, from the
    checkpoint, without the spec being written again."""
    c = dra
    c.apply([claim_template("again", memory="4Gi", cores="10"), claim_pod("again", c.node(0).name, template="again")])
    (pod,) = c.wait_running(["again"])
    got = c.pod_claim(pod)
    uid = got["metadata"]["uid"]
    agent = c.agent_of(pod)
    first = agent.prepared()[uid]  # the answer kubelet got (checkpointed before it was returned)
    want = [(["gpu"], d["pool"], d["device"], first["cdi_ids"]) for d in first["devices"]]
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert want == [(["gpu"], c.node(0).name, result["device"], [f"{CDI_KIND}={uid}"])]
    spec_path = agent.cdi_spec_path(uid)
    before = (spec_path.read_bytes(), spec_path.stat().st_mtime_ns)
    ref = (NAMESPACE, got["metadata"]["name"], uid)
    assert prepare_over_socket(agent.service_socket, ref) == want
    assert prepare_over_socket(agent.service_socket, ref) == want
    assert prepare_over_socket(agent.service_socket, ref, beta=True) == want  # the v1beta1 service answers the same
    assert (spec_path.read_bytes(), spec_path.stat().st_mtime_ns) == before
    assert agent.prepared()[uid] == first
    assert c.grant("again") == expected_grant(c, got)  # the running container is untouched


def test_an_agent_killed_between_prepare_and_unprepare(dra: DraCluster) -> None:
    """SIGKILL while a pod runs; the restarted agent prepares a new pod's claim and unprepares the first
    pod's claim, which only its checkpoint tells it about."""
    c = dra
    agent, n0 = c.agents[0], c.node(0).name
    c.apply([claim_template("k-share", memory="2Gi", cores="10"), claim_pod("first", n0, template="k-share")])
    (first,) = c.wait_running(["first"])
    first_uid = c.pod_claim(first)["metadata"]["uid"]
    assert first_uid in agent.prepared()
    agent.restart(kill=True)
    c.apply([claim_pod("second", n0, template="k-share")])
    (second,) = c.wait_running(["second"])
    second_claim = c.pod_claim(second)
    second_uid = second_claim["metadata"]["uid"]
    assert c.grant("second") == expected_grant(c, second_claim)
    assert set(agent.prepared()) == {first_uid, second_uid}
    log_mark = len(agent.log.read_text(errors="replace"))
    c.delete_pods(["first"])
    wait_for(lambda: first_uid not in agent.prepared(), 90, "the first claim unprepared by the restarted agent",
             agent.tail)
    assert not agent.cdi_spec_path(first_uid).exists()
    assert not (agent.hook_root / "claims" / first_uid).exists()
    assert f"unprepared claim {first_uid}" in agent.log.read_text(errors="replace")[log_mark:]
    # the second pod's claim is untouched
    assert set(agent.prepared()) == {second_uid} and agent.cdi_spec_path(second_uid).is_file()
    assert phase(c.pod("second") or {}) == "Running"


def _taints(c: DraCluster, i: int) -> dict[str, list[str]]:
    s = c.slice(i) or {"spec": {"devices": []}}
    return {d["name"]: [t["key"] for t in d.get("taints") or []] for d in s["spec"]["devices"]}


def _unschedulable(c: DraCluster, name: str) -> bool:
    conditions = (c.pod(name) or {}).get("status", {}).get("conditions") or []
    return any(x["type"] == "PodScheduled" and x.get("reason") == "Unschedulable" for x in conditions)


def test_an_unhealthy_gpu_taints_its_device_and_new_claims_avoid_it(dra: DraCluster) -> None:
    """GPU 1 of node 0 fails its probes (the fake file declares it broken; the agent restarted with it reads
    that once, as it would find a GPU broken by a probe): its device carries gpu.gpupool.io/unhealthy, and
    claims pinned to node 0 are allocated gpu-0 only, a claim that fits gpu-1 alone (it is free) is not
    allocated; on node 1 the same claim is."""
    c = dra
    agent, n0, n1 = c.agents[0], c.node(0).name, c.node(1).name
    agent.restart(broken=(1,))
    try:
        wait_for(lambda: _taints(c, 0) == {"gpu-0": [], "gpu-1": [TAINT_UNHEALTHY]}, 90, "gpu-1 of node 0 tainted",
                 lambda: f"{_taints(c, 0)}\n{agent.tail()}")
        taint = next(t for d in (c.slice(0) or {})["spec"]["devices"] for t in d.get("taints") or [])
        assert taint["effect"] == "NoSchedule" and taint["timeAdded"]
        assert _taints(c, 1) == {"gpu-0": [], "gpu-1": []}
        # 20 GiB each: two fit gpu-0 (45 GiB), the third fits only gpu-1
        c.apply([claim_template("big", memory="20Gi", cores="10"),
                 *(claim_pod(f"fill-{k}", n0, template="big") for k in range(2))])
        filled = c.wait_running(["fill-0", "fill-1"])
        for pod in filled:
            assert c.pod_claim(pod)["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
            assert c.grant(pod["metadata"]["name"])[0]["NVIDIA_VISIBLE_DEVICES"] == agent.gpu_uuids[0]
        # Pinned to GPU 1 by a selector: on node 0 only the tainted device matches, on node 1 a healthy one.
        c.apply([claim_template("gpu1", memory="1Gi", selector=f'device.attributes["{DRIVER}"].index == 1'),
                 claim_pod("over", n0, template="big"), claim_pod("on-gpu1-n0", n0, template="gpu1"),
                 claim_pod("on-gpu1-n1", n1, template="gpu1")])
        (ok,) = c.wait_running(["on-gpu1-n1"])
        assert c.pod_claim(ok)["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
        for name in ("over", "on-gpu1-n0"):
            wait_for(lambda name=name: _unschedulable(c, name), 90, f"{name} found unschedulable",  # type: ignore[misc]
                     lambda name=name: describe_pod(c.pod(name)))  # type: ignore[misc]
            pod = c.pod(name) or {}
            assert not pod["spec"].get("nodeName")
            assert not (c.pod_claim(pod).get("status") or {}).get("allocation")
    finally:
        c.clear()
        agent.restart()
        wait_for(lambda: _taints(c, 0) == {"gpu-0": [], "gpu-1": []}, 90, "node 0 untainted", agent.tail)


def _pool(c: DraCluster, i: int) -> list[Obj]:
    """Node i's slices of gpupool's driver, the first one first."""
    items = (c.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
    return sorted((s for s in items if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == c.node(i).name),
                  key=lambda s: (len(s["metadata"]["name"]), s["metadata"]["name"]))


def _inventory_mib(c: DraCluster, i: int) -> list[int]:
    """The memory of node i's GPUs as its inventory (the node object) shows them."""
    read = read_node(c.get(f"/api/v1/nodes/{c.node(i).name}") or {})
    return [] if read is None else [g.memory_mib for g in read[0].gpus]


def _partition_of(c: DraCluster, pod: Obj) -> str:
    return str(c.pod_claim(pod)["status"]["allocation"]["devices"]["results"][0]["device"])


def test_mig_partitions_are_carved_for_claims_and_their_counters_keep_the_layout_valid(dra: DraCluster,
                                                                                      allocator: Extender) -> None:
    """GPU 1 of node 1 is an H100 in MIG mode: the agent publishes it as 25 partitions consuming the counters
    of its counter set (a slice of its own), the real API server keeps those fields, kube-scheduler's
    allocator (which knows nothing of MIG) hands out only partitions that form a valid layout, and the agent
    carves each claim's instance at prepare: the container sees its MIG device. A 4g.40gb claim holds
    memory slices 0-3, so a 3g.40gb claim can only get the partition at slice 4, and a 7g.80gb claim none.
    Then the same through gpupool's allocator (gated pods)."""
    c = dra
    agent, n1 = c.agents[1], c.node(1).name
    agent.restart(mig=(1,))
    try:
        wait_for(lambda: len(_pool(c, 1)) == 2, 90, "node 1's pool in two slices", agent.tail)
        devices_slice, counters_slice = _pool(c, 1)
        assert devices_slice["spec"]["pool"]["resourceSliceCount"] == 2
        devices = {d["name"]: d for d in devices_slice["spec"]["devices"]}
        assert "gpu-0" in devices and "gpu-1" not in devices
        partitions = [d for n, d in devices.items() if n.startswith("gpu-1-")]
        assert len(partitions) == 25
        four_g = devices["gpu-1-4g40gb-0"]
        assert four_g["attributes"]["profile"] == {"string": "4g.40gb"}
        assert four_g["consumesCounters"] == [{"counterSet": "gpu-1-mig", "counters": {
            **{f"memory-slice-{k}": {"value": "1"} for k in range(4)}, "compute-slices": {"value": "4"}}}]
        (counters,) = counters_slice["spec"]["sharedCounters"]
        assert counters["name"] == "gpu-1-mig" and counters["counters"]["compute-slices"] == {"value": "7"}

        def profile(p: str) -> str:
            return f'device.attributes["{DRIVER}"].profile == "{p}"'

        mig_class = f"mig.{DRIVER}"
        c.apply([claim_template("four", device_class=mig_class, selector=profile("4g.40gb")),
                 claim_template("three", device_class=mig_class, selector=profile("3g.40gb")),
                 claim_template("seven", device_class=mig_class, selector=profile("7g.80gb")),
                 claim_pod("mig-4g", n1, template="four")])
        (four,) = c.wait_running(["mig-4g"])
        assert _partition_of(c, four) == "gpu-1-4g40gb-0"
        c.apply([claim_pod("mig-3g", n1, template="three")])
        (three,) = c.wait_running(["mig-3g"])
        assert _partition_of(c, three) == "gpu-1-3g40gb-4"  # slice 0 is held: only start 4 is left
        seen = {}
        for pod in (four, three):
            env, mounts = c.grant(pod["metadata"]["name"])
            assert env["GPUPOOL_ISOLATION"] == "mig" and env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
            assert not mounts & HOOK_MOUNTS  # hardware isolation: no interception library
            seen[env["GPUPOOL_MIG_PROFILE"]] = env["NVIDIA_VISIBLE_DEVICES"]
        assert sorted(seen) == ["3g.40gb", "4g.40gb"] and len(set(seen.values())) == 2
        c.apply([claim_pod("mig-7g", n1, template="seven")])
        wait_for(lambda: _unschedulable(c, "mig-7g"), 90, "the 7g.80gb pod found unschedulable",
                 lambda: describe_pod(c.pod("mig-7g")))
        assert not (c.pod_claim(c.pod("mig-7g") or {}).get("status") or {}).get("allocation")

        # The same claims from gated pods: gpupool's allocator places them with its MIG planning (the only
        # GPU in MIG mode is node 1's GPU 1, found without the pods naming a node), kube-scheduler binds.
        c.clear()
        c.apply([claim_template("four", device_class=mig_class, selector=profile("4g.40gb")),
                 claim_template("three", device_class=mig_class, selector=profile("3g.40gb")),
                 gated_pod("gated-4g", template="four")])
        (four,) = c.wait_running(["gated-4g"])
        c.apply([gated_pod("gated-3g", template="three")])
        (three,) = c.wait_running(["gated-3g"])
        for pod, device in ((four, "gpu-1-4g40gb-0"), (three, "gpu-1-3g40gb-4")):
            claim_obj = c.pod_claim(pod)
            assert (pod["spec"]["nodeName"], _partition_of(c, pod)) == (n1, device)
            assert MANAGER in allocation_writers(claim_obj)
            assert c.grant(pod["metadata"]["name"])[0]["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    finally:
        c.clear()
        agent.restart()
        # back to two shared GPUs: the counters' slice goes (deleted by the agent, under the chart's rules)
        wait_for(lambda: len(_pool(c, 1)) == 1 and slice_ready(c, 1), 90, "node 1's pool in one slice again",
                 agent.tail)
        # ... and its inventory shows the L40S again, in the allocator's ledger too, before the next test
        # replays placements on these nodes
        wait_for(lambda: _inventory_mib(c, 1) == [GPU_MIB] * GPUS and not any(allocator.ledger()["diff"].values()),
                 90, "node 1's GPUs back in its inventory and the allocator's ledger", agent.tail)


# --- gpupool's own allocator (gpupool.scheduler.claims) ---------------------------------------------------

SCHEDULER_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SCHEDULER_ACCOUNT}"
GPUPOOL_SOURCE = "gpupool-scheduler"  # the component of its Events (SchedulerConfig.scheduler_name)
MANAGER = "gpupool"  # the field manager of its writes (gpupool.cluster.kube.FIELD_MANAGER)
# Shares that fill a GPU exactly (GPU_MIB is divisible by 4): in two, and in four.
HALF_MIB, HALF_CORES = GPU_MIB // 2, 50
QUARTER_MIB, QUARTER_CORES = GPU_MIB // 4, 25
GPU_ID = tuple[str, str]  # (pool = node, device)


def gated_pod(name: str, **kw: Any) -> Obj:
    """`claim_pod` on any real node with gpupool's scheduling gate, as the webhook puts it on a claim pod
    when gpupool places claims (webhook/admission.py)."""
    pod = claim_pod(name, None, **kw)
    pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return pod


def allocation_writers(claim_obj: Obj) -> set[str]:
    """The field managers that own the claim's status.allocation (its managedFields): who allocated it."""
    return {m["manager"] for m in claim_obj["metadata"].get("managedFields") or []
            if "f:allocation" in ((m.get("fieldsV1") or {}).get("f:status") or {})}


def scheduler_requests(c: DraCluster, resource: str, name: str | None = None) -> list[tuple[str, int]]:
    """(verb, response code) of each request the gpupool scheduler's account made on `resource`
    ("pods", "resourceclaims/status", ...), on the object `name` when given (the audit log)."""
    out = []
    for e in c.bed.audit_events():
        ref = e.get("objectRef")
        if e["user"]["username"] != SCHEDULER_USER or ref is None:
            continue
        if ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "") != resource:
            continue
        if name is None or ref.get("name") == name:
            out.append((e["verb"], int((e.get("responseStatus") or {}).get("code", 0))))
    return out


def gpus_held(c: DraCluster, pods: list[Obj]) -> Counter[GPU_ID]:
    """Claims per GPU, from the claims' allocations."""
    out: Counter[GPU_ID] = Counter()
    for pod in pods:
        for r in c.pod_claim(pod)["status"]["allocation"]["devices"]["results"]:
            out[(r["pool"], r["device"])] += 1
    return out


def allocator_workload(allocator: Extender) -> tuple[TaskShape, ...]:
    """The workload gpupool's scheduler has observed (its debug view): a policy that weighs the expected
    workload (gpupool's does) decides with it, so the replay must too. In a full session the scheduler has
    seen other modules' pods."""
    return tuple(TaskShape(w["cpu_milli"], w["gpu_milli"], w["gpu_count"], frozenset(w["models"]), w["weight"])
                 for w in allocator.ledger()["workload"])


def replay(c: DraCluster, policy: str, count: int, memory_mib: int, cores: int,
           nodes: list[str] | None = None, workload: tuple[TaskShape, ...] = ()) -> Counter[GPU_ID]:
    """Where `count` claims of one share go when `policy` places them one after the other on empty GPUs,
    decided by the simulator's engine (gpupool.core.placement.place), not read from the cluster: the state
    is every Node with a gpupool inventory as the API shows them (the scheduler's ledger is built from the
    same objects, ordered by name), the candidates the DRA nodes (or `nodes`), each claim a one-GPU share
    without CPU or memory, the context fresh (no observed workload, ties to the node order)."""
    read = [r[0] for r in map(read_node, (c.get("/api/v1/nodes") or {}).get("items") or []) if r is not None]
    state = ClusterState(sorted(read, key=lambda n: n.name))
    allowed = np.array(sorted(state.index[n] for n in nodes or [a.node.name for a in c.agents]), dtype=np.int64)
    ctx = PolicyContext(rng=np.random.default_rng(0), rank=np.arange(len(state), dtype=np.int64), workload=workload)
    chosen = get_policy(policy)
    out: Counter[GPU_ID] = Counter()
    for k in range(count):
        request = PodRequest(key=f"replay-{k}", gpu=GPURequest(count=1, milli=cores * 10, memory_mib=memory_mib))
        decided = place(state, request, chosen, ctx, allowed)
        assert not isinstance(decided, Unschedulable), f"claim {k} fits nowhere in the replay: {decided}"
        assert state.allocate(request, decided.allocation) is None
        for g in decided.allocation.grants:
            out[(decided.allocation.node, f"gpu-{g.index}")] += 1
    return out


def shown_counts(counts: Counter[GPU_ID]) -> str:
    return ", ".join(f"{n}/{d}: {k}" for (n, d), k in sorted(counts.items()))


def gpupool_events(c: DraCluster, pod: Obj) -> list[Obj]:
    """The Events gpupool's scheduler recorded on `pod`."""
    return [e for e in c.events() if e["involvedObject"].get("uid") == pod["metadata"]["uid"]
            and (e.get("source") or {}).get("component") == GPUPOOL_SOURCE]


def wait_placed(c: DraCluster, allocator: Extender, names: list[str], timeout_s: float = 150.0) -> list[Obj]:
    """`wait_running`, and on a timeout what gpupool's side shows too: the claims, the scheduler's log."""
    try:
        return c.wait_running(names, timeout_s)
    except AssertionError as e:
        claims = [(x["metadata"]["name"], bool((x.get("status") or {}).get("allocation"))) for x in c.claims()]
        raise AssertionError(f"{e}\nclaims (name, allocated): {claims}\n--- gpupool scheduler:\n"
                             f"{allocator.tail()}") from None


def check_gpupool_allocated(c: DraCluster, pod: Obj, memory_mib: int, cores: int) -> Obj:
    """`pod` (Running) got its claim from gpupool: the allocation written by gpupool's scheduler only, the
    share asked, on the node the pod runs on, reserved for the pod by kube-scheduler, and the container
    sees exactly that allocation. Returns the claim."""
    name = pod["metadata"]["name"]
    got = c.pod_claim(pod)
    assert allocation_writers(got) == {MANAGER}, got["metadata"].get("managedFields")
    assert not pod["spec"].get("schedulingGates"), pod["spec"]["schedulingGates"]
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, pod["spec"]["nodeName"]), result
    assert (mib(result["consumedCapacity"]["memory"]), int(result["consumedCapacity"]["cores"])) == (
        memory_mib, cores), result
    assert result.get("shareID"), result  # one of several claims on a shared device (allowMultipleAllocations)
    # stamped when allocated: kube-scheduler 1.37 would add the stamp itself when reserving, a change of the
    # allocation the API server refuses (scheduler/claims.py)
    assert got["status"]["allocation"].get("allocationTimestamp"), got["status"]["allocation"]
    assert [r["uid"] for r in got["status"].get("reservedFor") or []] == [pod["metadata"]["uid"]]
    assert c.grant(name) == expected_grant(c, got), name
    return got


def test_gpupool_allocates_a_gated_pods_claim_and_kube_scheduler_binds_it(dra: DraCluster,
                                                                           allocator: Extender) -> None:
    """A gated pod whose claim (from a template) asks for a share: gpupool's scheduler writes the claim's
    allocation (its account, the audit log says; its field manager, managedFields say) and removes the gate;
    kube-scheduler 1.37 accepts a claim allocated by someone else (it reserves it for the pod and binds the
    pod to the allocation's node), kubelet prepares it through the agent, and the container gets exactly
    that share."""
    c = dra
    c.apply([claim_template("gp-share", memory="8Gi", cores="30"), gated_pod("placed", template="gp-share")])
    (pod,) = wait_placed(c, allocator, ["placed"])
    got = check_gpupool_allocated(c, pod, 8192, 30)
    name = got["metadata"]["name"]
    assert ("patch", 200) in scheduler_requests(c, "resourceclaims/status", name)
    assert ("patch", 200) in scheduler_requests(c, "pods", "placed")  # the gate removed
    # kube-scheduler wrote only the reservation: the allocation is gpupool's alone
    reservers = {m["manager"] for m in got["metadata"]["managedFields"]
                 if "f:reservedFor" in ((m.get("fieldsV1") or {}).get("f:status") or {})}
    assert reservers and MANAGER not in reservers, got["metadata"]["managedFields"]
    uid = got["metadata"]["uid"]
    assert c.agent_of(pod).prepared()[uid]["cdi_ids"] == [f"{CDI_KIND}={uid}"]
    # the scheduler's ledger holds the claim where it was allocated
    (entry,) = [e for e in allocator.ledger()["ledger"]["entries"] if e["uid"] == uid]
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert (entry["kind"], entry["node"], [g["index"] for g in entry["gpus"]]) == (
        "claim", result["pool"], [int(result["device"].removeprefix("gpu-"))])


def test_a_burst_of_gated_claims_packs_as_gpupools_policy_decides(dra: DraCluster, allocator: Extender) -> None:
    """Eight gated pods at once, each with a quarter of a GPU (2 nodes x 2 GPUs hold 16): every pod runs
    with its claim allocated by gpupool, and each GPU holds exactly the claims that gpupool's policy puts
    there when it places the same eight on empty GPUs (the simulator's engine, `replay`). Compared per GPU,
    not in time; every request is the same, so the order in which the pods are placed cannot matter."""
    c = dra
    # Empty GPUs, as the replay starts: the previous test's claims are gone from the API (`nothing_left`),
    # and from the scheduler's ledger once its watch has brought their deletion.
    # (Other modules' pods of the session may hold GPUs of other nodes: only the DRA nodes must be empty.)
    dra_nodes = {a.node.name for a in c.agents}
    wait_for(lambda: not [e for e in allocator.ledger()["ledger"]["entries"] if e["node"] in dra_nodes], 60,
             "no entry on the DRA nodes in the ledger", lambda: str(allocator.ledger()["ledger"]["entries"]))
    want = replay(c, "gpupool", 8, QUARTER_MIB, QUARTER_CORES, workload=allocator_workload(allocator))
    names = [f"pack-{k}" for k in range(8)]
    c.apply([claim_template("quarter", memory=f"{QUARTER_MIB}Mi", cores=str(QUARTER_CORES)),
             *(gated_pod(n, template="quarter") for n in names)])
    pods = wait_placed(c, allocator, names, 300)
    got = gpus_held(c, pods)
    print(f"gpupool allocator: {shown_counts(got)}; the policy's replay: {shown_counts(want)}")
    assert got == want
    for pod in pods:
        check_gpupool_allocated(c, pod, QUARTER_MIB, QUARTER_CORES)


def kube_scheduler_caught_up(c: DraCluster) -> None:
    """Return once kube-scheduler's own allocator has seen every claim event up to now: the previous test's
    claims are deleted in the API, but a loaded machine measured its cache still counting one of them (a
    burst then went 3 + 1 instead of 4 on a GPU). A claim that matches no device is tried and refused by it
    (its FailedScheduling Event); the claim informer delivers in order, so the deletions were processed
    before. It holds nothing and is deleted."""
    c.apply([claim_template("nowhere", memory="1Gi", selector=f'device.attributes["{DRIVER}"].index == 99'),
             claim_pod("barrier", None, template="nowhere")])
    wait_for(lambda: any(e.startswith("FailedScheduling") for e in c.events_of("barrier")), 90,
             "kube-scheduler refused the barrier pod", lambda: str(c.events_of("barrier")))
    c.clear()


def test_the_same_burst_left_to_kube_scheduler_fills_each_nodes_first_gpu_first(dra: DraCluster,
                                                                                 allocator: Extender) -> None:
    """The same eight pods without the gate: kube-scheduler's own allocator. Its choice of node has random
    ties, so only what the dra-default model (gpupool.core.policies.dra_default) says about the devices
    inside a node is held to: on each node the claims go to the first GPU that fits, in device order,
    exactly as the model's `choose` puts that node's claims one after the other. The node split and what
    gpupool's policy does with the same burst are printed beside it."""
    c = dra
    kube_scheduler_caught_up(c)
    names = [f"first-fit-{k}" for k in range(8)]
    c.apply([claim_template("quarter", memory=f"{QUARTER_MIB}Mi", cores=str(QUARTER_CORES)),
             *(claim_pod(n, None, template="quarter") for n in names)])
    pods = c.wait_running(names, 300)
    got = gpus_held(c, pods)
    for pod in pods:
        writers = allocation_writers(c.pod_claim(pod))
        assert writers and MANAGER not in writers, writers  # kube-scheduler's allocator, not gpupool's
    per_node = Counter(pod["spec"]["nodeName"] for pod in pods)
    for node, count in per_node.items():
        mine = Counter({k: v for k, v in got.items() if k[0] == node})
        assert mine == replay(c, "dra-default", count, QUARTER_MIB, QUARTER_CORES, nodes=[node]), (node, mine)
    print(f"kube-scheduler's allocator: {shown_counts(got)} (pods per node {dict(per_node)}; GPUs used "
          f"{len(got)}); gpupool's policy: {shown_counts(replay(c, 'gpupool', 8, QUARTER_MIB, QUARTER_CORES))}")


def test_a_pod_that_fits_nowhere_stays_gated_until_a_gpu_frees(dra: DraCluster, allocator: Extender) -> None:
    """Eight gated pods of half a GPU fill the four GPUs (two each, as the policy's replay says); a ninth
    stays gated, unallocated and unbound, with one FailedScheduling Event from gpupool naming its claim;
    when one of the eight goes, the ninth gets the GPU it freed and runs."""
    c = dra
    names = [f"fill-{k}" for k in range(8)]
    c.apply([claim_template("half", memory=f"{HALF_MIB}Mi", cores=str(HALF_CORES)),
             *(gated_pod(n, template="half") for n in names)])
    pods = wait_placed(c, allocator, names, 300)
    assert gpus_held(c, pods) == replay(c, "gpupool", 8, HALF_MIB, HALF_CORES,
                                        workload=allocator_workload(allocator))
    assert set(gpus_held(c, pods).values()) == {2}  # full: every GPU holds two halves
    c.apply([gated_pod("ninth", template="half")])

    def told() -> list[Obj]:
        pod = c.pod("ninth")
        return gpupool_events(c, pod) if pod else []

    events = wait_for(told, 90, "gpupool's FailedScheduling Event on the ninth pod",
                      lambda: f"{describe_pod(c.pod('ninth'))}\n{allocator.tail()}")
    ninth = c.pod("ninth") or {}
    claim_name = c.pod_claim(ninth)["metadata"]["name"]
    (event,) = events  # one Event per reason, however often the pod is tried
    assert (event["reason"], event["type"]) == ("FailedScheduling", "Warning"), event
    # the framework's words for a pod that fits nowhere (claims are scheduled by the framework, issue 39)
    assert event["message"].startswith(f"gpupool: claim {NAMESPACE}/{claim_name}: fits no node, e.g. needs 1 x a "
                                       "GPU with 50 percent compute"), event["message"]
    assert [g["name"] for g in ninth["spec"].get("schedulingGates") or []] == [SCHEDULING_GATE]
    assert not ninth["spec"].get("nodeName")
    assert not (c.pod_claim(ninth).get("status") or {}).get("allocation")
    # one of the eight goes: its GPU has room for the ninth, and nowhere else has
    freed = c.pod_claim(pods[3])["status"]["allocation"]["devices"]["results"][0]
    c.delete_pods([names[3]])
    (ninth,) = wait_placed(c, allocator, ["ninth"], 180)
    got = check_gpupool_allocated(c, ninth, HALF_MIB, HALF_CORES)
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (freed["pool"], freed["device"])
    assert len(gpupool_events(c, ninth)) == 1


def test_a_claim_with_a_cel_selector_is_left_to_kube_scheduler(dra: DraCluster, allocator: Extender) -> None:
    """Only kube-scheduler evaluates CEL: gpupool removes the gate without allocating (no write of the
    claim's status by its account), kube-scheduler's allocator allocates the claim on the device the
    selector names, and the pod runs with exactly that allocation."""
    c = dra
    c.apply([claim_template("cel-gpu1", memory="1Gi", selector=f'device.attributes["{DRIVER}"].index == 1'),
             gated_pod("cel", template="cel-gpu1")])
    (pod,) = wait_placed(c, allocator, ["cel"])
    got = c.pod_claim(pod)
    writers = allocation_writers(got)
    assert writers and MANAGER not in writers, writers
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (pod["spec"]["nodeName"], "gpu-1"), result
    assert ("patch", 200) in scheduler_requests(c, "pods", "cel")
    assert scheduler_requests(c, "resourceclaims/status", got["metadata"]["name"]) == []
    assert c.grant("cel") == expected_grant(c, got)


# --- one node, both forms: the device plugin beside the DRA driver ------------------------------------------

DP_SCHEDULER = "gpupool-dra-dp-e2e"  # the kube-scheduler profile whose extender is gpupool's allocator process


@pytest.fixture
def dp_scheduler(dra: DraCluster, allocator: Extender) -> Iterator[str]:
    """The allocator process as the extender of a kube-scheduler profile of its own (`DP_SCHEDULER`), so one
    `gpupool scheduler` (one ledger) places device-plugin pods and claims, as the chart's one scheduler pod
    does: the allocator restarted with that scheduler name (it places and binds only pods naming it), and a
    second kube-scheduler with only that profile and the chart's extender entry pointing at the allocator,
    under the same account (the chart runs kube-scheduler and the extender as one pod). Afterwards the
    allocator runs again as before."""
    config = json.loads(tb.scheduler_config(allocator.url, chart_scheduler_config(), scheduler_name=DP_SCHEDULER))
    config["profiles"] = [{"schedulerName": DP_SCHEDULER}]  # kube-scheduler-dra owns the claim pods' profile

    def restart_allocator() -> None:
        allocator.stop()
        allocator.start()
        allocator.wait_ready()
        wait_for(lambda: allocator.ledger()["ledger"]["nodes"] >= len(dra.agents)
                 and not any(allocator.ledger()["diff"].values()), 60, "the allocator's ledger in step",
                 lambda: f"{allocator.ledger()}\n{allocator.tail()}")

    allocator.env["GPUPOOL_SCHEDULER_SCHEDULER_NAME"] = DP_SCHEDULER
    try:
        restart_allocator()
        dra.bed.start_scheduler(json.dumps(config), kubeconfig=allocator.kubeconfig, name="kube-scheduler-dra-dp")
        yield DP_SCHEDULER
    finally:
        dra.bed.stop_scheduler("kube-scheduler-dra-dp")
        dra.clear()
        del allocator.env["GPUPOOL_SCHEDULER_SCHEDULER_NAME"]
        restart_allocator()


def _ledger_on(allocator: Extender, node: str) -> list[Obj]:
    return [e for e in allocator.ledger()["ledger"]["entries"] if e["node"] == node]


def test_one_node_serves_a_device_plugin_pod_and_a_claim_on_the_same_gpu(dra: DraCluster, allocator: Extender,
                                                                         dp_scheduler: str) -> None:
    """Node 0's agent serves both forms. Its real kubelet reports `gpupool.io/gpu` slots (the device plugin
    registered) and its ResourceSlice is published. A pod asking for gpupool.io/gpu-memory and gpu-cores,
    pinned to node 0's GPU 0 (gpupool.io/gpu-uuid), is placed through the extender and served by kubelet's
    Allocate; a whole-GPU claim pinned to node 0 then goes to GPU 1 (the only GPU with room for it: gpupool's
    allocator counts the pod); a claim pinned to node 0 then goes to GPU 0 (the only room left). Both run,
    each container with exactly its own share, and the ledger holds both on GPU 0 within its memory. A third
    share that fits only with GPU 0 over-committed is placed nowhere, as a device-plugin pod (the extender
    counts the claims) and as a claim (the allocator counts the pod)."""
    c = dra
    n0 = c.node(0).name
    agent = c.agents[0]
    gpu0 = agent.gpu_uuids[0]
    # 1. the node offers both forms
    wait_for(lambda: int(((c.get(f"/api/v1/nodes/{n0}") or {}).get("status") or {}).get("allocatable", {})
                         .get(RESOURCE_GPU, "0")) == GPUS * 10, 90, "node 0 offering gpupool.io/gpu slots",
             lambda: f"{((c.get(f'/api/v1/nodes/{n0}') or {}).get('status') or {}).get('allocatable')}\n"
                     f"{agent.tail()}")
    assert slice_ready(c, 0)
    dp_mib, dp_cores = 20480, 30
    claim_mib, claim_cores = 16384, 40
    over_mib = 12288  # GPU 0 then has GPU_MIB - 20480 - 16384 = 9204 MiB free, GPU 1 none
    assert dp_mib + claim_mib <= GPU_MIB < dp_mib + claim_mib + over_mib

    def device_plugin_pod(name: str, memory_mib: int, cores: int) -> Obj:
        pod = share_pod(name, n0, memory_mib, cores, scheduler=dp_scheduler, annotations={ANN_UUID: gpu0})
        pod["metadata"]["namespace"] = NAMESPACE
        return pod

    def pinned_claim_pod(name: str, template: str) -> Obj:
        pod = claim_pod(name, n0, template=template)
        pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        return pod

    # 2. the device-plugin pod through the extender, then the claims through the allocator
    c.apply([device_plugin_pod("dp", dp_mib, dp_cores)])
    (dp,) = wait_placed(c, allocator, ["dp"])
    assert dp["spec"]["nodeName"] == n0
    dp_doc = dp["metadata"]["annotations"][ANN_ALLOCATION]
    assert c.grant("dp") == device_plugin_grant(dp), (dp_doc, c.grant("dp"))
    env = c.grant("dp")[0]
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == (
        gpu0, str(dp_mib), str(dp_cores)), env
    cap, strings = limits_seen(c, "dp")
    assert cap == dp_mib << 20 and gpu0 in strings, (cap, strings)
    c.apply([claim_template("whole", memory=f"{GPU_MIB}Mi", cores="100"), pinned_claim_pod("fill", "whole")])
    (fill,) = wait_placed(c, allocator, ["fill"])
    check_gpupool_allocated(c, fill, GPU_MIB, 100)
    assert _partition_of(c, fill) == "gpu-1"  # GPU 0 holds the pod's 20 GiB: the whole GPU fits only GPU 1
    c.apply([claim_template("share", memory=f"{claim_mib}Mi", cores=str(claim_cores)),
             pinned_claim_pod("dra", "share")])
    (claimed,) = wait_placed(c, allocator, ["dra"])
    got = check_gpupool_allocated(c, claimed, claim_mib, claim_cores)
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (n0, "gpu-0"), result  # the pod's GPU
    cap, strings = limits_seen(c, "dra")
    assert cap == claim_mib << 20 and gpu0 in strings, (cap, strings)
    # each has its own limits file: the pod's still says the pod's share
    assert limits_seen(c, "dp")[0] == dp_mib << 20
    assert {p["metadata"]["name"]: phase(p) for p in c.pods()} == {"dp": "Running", "fill": "Running",
                                                                   "dra": "Running"}
    # kubelet's device checkpoint: the pod got its gpupool.io/gpu slot from the device plugin
    checkpoint = json.loads((c.node(0).device_plugin_dir / "kubelet_internal_checkpoint").read_text())
    assert any(e["PodUID"] == dp["metadata"]["uid"] and e["ResourceName"] == RESOURCE_GPU
               for e in checkpoint["Data"]["PodDeviceEntries"]), checkpoint
    assert got["metadata"]["uid"] in agent.prepared()

    # 3. the ledger: both forms on GPU 0 of node 0, within its memory; the same as the API's recomputation
    ledger = allocator.ledger()
    assert not any(ledger["diff"].values()), ledger["diff"]
    on_gpu0 = {(e["kind"], e["uid"]): g["memory_mib"] for e in _ledger_on(allocator, n0) for g in e["gpus"]
               if g["index"] == 0}
    assert on_gpu0 == {("pod", dp["metadata"]["uid"]): dp_mib, ("claim", got["metadata"]["uid"]): claim_mib}, (
        _ledger_on(allocator, n0))
    assert sum(on_gpu0.values()) <= GPU_MIB
    # ... and a third share that fits only on GPU 0 over-committed, in either form, is placed nowhere
    c.apply([device_plugin_pod("over-dp", over_mib, 10), claim_template("over", memory=f"{over_mib}Mi", cores="10"),
             pinned_claim_pod("over-claim", "over")])
    wait_for(lambda: _unschedulable(c, "over-dp"), 90, "the over-committing device-plugin pod unschedulable",
             lambda: f"{describe_pod(c.pod('over-dp'))}\n{allocator.tail()}")

    def refused() -> list[Obj]:
        pod = c.pod("over-claim")
        return [e for e in c.events() if pod is not None and e["involvedObject"].get("uid") == pod["metadata"]["uid"]
                and e["reason"] == "FailedScheduling"]

    (event,) = wait_for(refused, 90, "gpupool's FailedScheduling Event on the over-committing claim's pod",
                        lambda: f"{describe_pod(c.pod('over-claim'))}\n{allocator.tail()}")
    over_dp = next(x for x in (c.pod("over-dp") or {})["status"]["conditions"] if x["type"] == "PodScheduled")
    print(f"over-dp: {over_dp.get('message')}; over-claim: {event['message']}")
    over_claim = c.pod("over-claim") or {}
    assert ": fits no node, e.g. needs 1 x a GPU with" in event["message"], event["message"]
    assert [g["name"] for g in over_claim["spec"].get("schedulingGates") or []] == [SCHEDULING_GATE]
    assert not (c.pod_claim(over_claim).get("status") or {}).get("allocation")
    for name in ("over-dp", "over-claim"):
        pod = c.pod(name) or {}
        assert not pod["spec"].get("nodeName") and ANN_ALLOCATION not in (pod["metadata"].get("annotations") or {})
    ledger = allocator.ledger()
    assert not any(ledger["diff"].values()), ledger["diff"]
    assert sorted(e["uid"] for e in _ledger_on(allocator, n0)) == sorted(
        p["metadata"]["uid"] if p["metadata"]["name"] == "dp" else c.pod_claim(p)["metadata"]["uid"]
        for p in (dp, fill, claimed))
    assert phase(c.pod("dp") or {}) == "Running" and phase(c.pod("dra") or {}) == "Running"


def _remote_servers(c: DraCluster, i: int) -> set[str]:
    """The remoteServer attributes of node i's devices (empty: it serves no remote share)."""
    return {d["attributes"]["remoteServer"]["string"] for s in _pool(c, i) for d in s["spec"].get("devices") or []
            if "remoteServer" in d.get("attributes", {})}


def _server_file(agent: DraAgent, claim_obj: Obj) -> Path:
    """Where the pod's node keeps the address the claim's new client processes dial (mounted read-only)."""
    return agent.hook_root / "claims" / claim_obj["metadata"]["uid"] / "remote" / "server"


def test_a_remote_share_runs_a_pod_on_one_node_on_the_gpu_of_another(dra: DraCluster, allocator: Extender) -> None:
    """Node 0's agent runs its GPU servers (over the fake driver) and publishes them on its devices; node 1's
    does not. A gated pod pinned to node 1 with a claim of the remote class: gpupool's allocator gives it a
    GPU of node 0 (the only ones with a server) and writes node 1 as the claim's node, kube-scheduler binds
    the pod there, node 1's agent prepares the claim with the forwarding library, node 0's server address
    and the claim's token, and the CUDA program in the container is held to the claim's 1 GiB by node 0's
    server: 768 MiB fits, 768 MiB more does not (2 = CUDA_ERROR_OUT_OF_MEMORY), 16 bytes do. A pod pinned
    to node 0 gets its share there too, through the server's unix socket. Deleting the pods revokes the
    shares on node 0."""
    c = dra
    n0, n1 = c.node(0).name, c.node(1).name
    # Pods reach this machine at their bridge's address; any node's bridge address reaches node 0's
    # listener (every address of this machine), as a node's InternalIP would in a cluster.
    host = c.node(1).pod_cidr.rsplit(".", 1)[0] + ".1"
    server = f"tcp:{host}:{tb.free_port()}"
    c.agents[0].restart(serve=server)
    try:
        wait_for(lambda: _remote_servers(c, 0) == {server} and slice_ready(c, 0), 90,
                 "node 0's devices publish its GPU server", c.agents[0].tail)
        assert _remote_servers(c, 1) == set()
        wait_for(lambda: not any(allocator.ledger()["diff"].values()), 60, "the allocator's ledger in step",
                 allocator.tail)
        mb = 1 << 20
        asks = f"printf 'alloc mem {768 * mb}\\nalloc mem {768 * mb}\\nalloc mem 16\\n'"
        script = f"{asks} | probe direct; exec sleep 1000000"
        remote_class = f"remote.{DRIVER}"
        far, near = (claim_pod(name, node, template="remote-1g", image=images.PROBE_IMAGE, command=["sh", "-c", script])
                     for name, node in (("far", n1), ("near", n0)))
        for pod in (far, near):
            pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        c.apply([claim_template("remote-1g", memory="1Gi", cores="20", device_class=remote_class), far, near])
        pods = {p["metadata"]["name"]: p for p in wait_placed(c, allocator, ["far", "near"])}

        def answers(name: str) -> list[str] | None:
            out = [line for line in c.kubectl("logs", "-n", NAMESPACE, name).stdout.splitlines()
                   if line.strip() and not line.startswith("gpupool-")]
            return out if len(out) >= 3 else None

        for name, node, address in (("far", n1, server), ("near", n0, "unix:/run/gpupool/remote/socket/server.sock")):
            pod = pods[name]
            got = c.pod_claim(pod)
            assert allocation_writers(got) == {MANAGER}
            (result,) = got["status"]["allocation"]["devices"]["results"]
            assert (result["pool"], pod["spec"]["nodeName"]) == (n0, node), result  # the GPU is node 0's
            (term,) = got["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
            assert term["matchFields"][0]["values"] == [node]
            agent = c.agents[1 if node == n1 else 0]
            spec = json.loads(agent.cdi_spec_path(got["metadata"]["uid"]).read_text())
            (device,) = spec["devices"]
            env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
            assert env["GPUPOOL_REMOTE_SERVER_FILE"] == "/run/gpupool/remote/claim/server"
            assert env["LD_LIBRARY_PATH"] == "/usr/lib/gpupool/remote"
            assert _server_file(agent, got).read_text() == address + "\n"
            assert not device["containerEdits"].get("deviceNodes")  # no GPU of the pod's node
            lines = wait_for(lambda n=name: answers(n), 60, f"{name}'s answers",  # type: ignore[misc]
                             lambda n=name: c.kubectl("logs", "-n", NAMESPACE, n).stdout)  # type: ignore[misc]
            assert [int(line.split()[0]) for line in lines[:3]] == [0, 2, 0], (
                name, c.kubectl("logs", "-n", NAMESPACE, name).stdout, c.agents[0].tail())
        # the scheduler's ledger holds both shares on node 0's GPUs, none on node 1
        entries = [e for e in allocator.ledger()["ledger"]["entries"] if e["kind"] == "claim"]
        assert sorted(e["node"] for e in entries) == [n0, n0], entries
        tokens = c.agents[0].hook_root / "remote" / "tokens"
        assert len(tokens.read_text().split("\n")) - 1 == 2
        c.clear()
        wait_for(lambda: tokens.read_text() == "", 60, "node 0's server forgot the shares", c.agents[0].tail)
    finally:
        c.clear()
        c.agents[0].restart()
        wait_for(lambda: _remote_servers(c, 0) == set() and slice_ready(c, 0), 90, "node 0 without its server",
                 c.agents[0].tail)


def _move_of(c: DraCluster, uid: str) -> Move | None:
    cm = c.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/configmaps/{MOVES_CONFIGMAP}")
    return read_moves(cm).get(uid)


def test_gpupool_migrate_moves_a_running_remote_client_to_another_nodes_gpu(dra: DraCluster,
                                                                         allocator: Extender) -> None:
    """Both nodes run GPU servers. A pod pinned to node 1 gets its remote share there (through the unix
    socket); its CUDA program, fed commands through a FIFO, allocates 600 MiB of its 1 GiB. An admin runs
    `gpupool migrate` to node 0: node 0's agent prepares the share and says ready, node 1's asks the
    program's worker to move, and the program's next call lands on node 0 with its allocation: there 600 MiB
    more do not fit (the share's accounting came along), 300 MiB do. The move ends `moved`, node 1 forgets the
    share, the scheduler's ledger holds it on node 0, the pod's node names node 0's server to new processes,
    and a new process in the same container is held to what is left of the same share."""
    c = dra
    n0, n1 = c.node(0).name, c.node(1).name
    host = c.node(1).pod_cidr.rsplit(".", 1)[0] + ".1"
    servers = [f"tcp:{host}:{tb.free_port()}" for _ in range(2)]
    for i in (0, 1):
        c.agents[i].restart(serve=servers[i])
    try:
        for i in (0, 1):
            wait_for(lambda i=i: _remote_servers(c, i) == {servers[i]} and slice_ready(c, i), 90,  # type: ignore[misc]
                     f"node {i}'s devices publish its GPU server", c.agents[i].tail)
        wait_for(lambda: not any(allocator.ledger()["diff"].values()), 60, "the allocator's ledger in step",
                 allocator.tail)
        mb = 1 << 20
        feed = "mkfifo /tmp/in && (while :; do cat /tmp/in; done) | probe direct > /tmp/out 2>&1"
        pod = claim_pod("mover", n1, template="remote-1g", image=images.PROBE_IMAGE, command=["sh", "-c", feed])
        pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        c.apply([claim_template("remote-1g", memory="1Gi", cores="20", device_class=f"remote.{DRIVER}"), pod])
        (running,) = wait_placed(c, allocator, ["mover"])
        got = c.pod_claim(running)
        uid = got["metadata"]["uid"]
        (result,) = got["status"]["allocation"]["devices"]["results"]
        assert (result["pool"], running["spec"]["nodeName"]) == (n1, n1)  # the same node first
        assert _server_file(c.agents[1], got).read_text() == "unix:/run/gpupool/remote/socket/server.sock\n"

        def answers() -> list[str]:  # the probe's answers; the library's own lines (gpupool-...) share the file
            return [x for x in c.exec("mover", "cat", "/tmp/out").splitlines() if x and not x.startswith("gpupool-")]

        def ask(command: str) -> str:
            before = len(answers())
            c.exec("mover", "sh", "-c", f"echo '{command}' > /tmp/in")
            wait_for(lambda: len(answers()) > before, 30, f"the answer to {command}",
                     lambda: c.exec("mover", "cat", "/tmp/out"))
            return answers()[before]

        assert ask(f"alloc mem {600 * mb}").split()[0] == "0"
        done = subprocess.run([*tb.gpupool_argv(), "migrate", "mover", "--to", n0, "-n", NAMESPACE,
                               "--gpupool-namespace", RELEASE_NAMESPACE, "--wait", "0",
                               "--kubeconfig", str(c.bed.kubeconfig())],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert f"move requested, {n1}/gpu-" in done.stdout and f"-> {n0}/gpu-" in done.stdout, done.stdout
        wait_for(lambda: (m := _move_of(c, uid)) is not None and m.state == "ready", 60, "node 0 ready",
                 lambda: f"{_move_of(c, uid)}\n{c.agents[0].tail()}")
        # the program's next call that waits for a reply moves it, with what it holds
        assert ask(f"alloc mem {600 * mb}").split()[0] == "2"  # 600 + 600 MiB > 1 GiB on node 0 too
        assert ask(f"alloc mem {300 * mb}").split()[0] == "0"
        wait_for(lambda: (m := _move_of(c, uid)) is not None and m.state == "moved", 60, "the move done",
                 lambda: f"{_move_of(c, uid)}\n{c.agents[1].tail()}")
        moved = _move_of(c, uid)
        assert moved is not None and moved.target.node == n0
        wait_for(lambda: uid not in (c.agents[1].hook_root / "remote" / "tokens").read_text(), 30,
                 "node 1 forgot the share", c.agents[1].tail)
        assert uid not in (c.agents[1].hook_root / "remote" / "tokens").read_text()
        wait_for(lambda: sorted((e["uid"], e["node"]) for e in allocator.ledger()["ledger"]["entries"]
                                if e["uid"].startswith(uid)) == [(uid, n0)], 30, "the ledger holds it on node 0",
                 allocator.tail)
        assert _server_file(c.agents[1], got).read_text() == servers[0] + "\n"
        # a new process of the pod dials node 0 and shares what is left of the 1 GiB (900 MiB held)
        two = f"printf 'alloc mem {100 * mb}\\nalloc mem {100 * mb}\\n'"
        fresh = c.exec("mover", "sh", "-c", f"{two} | probe direct")
        codes = [line.split()[0] for line in fresh.splitlines() if line and not line.startswith("gpupool-")]
        assert codes == ["0", "2"], fresh
    finally:
        c.clear()
        for i in (0, 1):
            c.agents[i].restart()
        for i in (0, 1):
            wait_for(lambda i=i: _remote_servers(c, i) == set() and slice_ready(c, i), 90,  # type: ignore[misc]
                     f"node {i} without its server", c.agents[i].tail)


def test_the_scheduler_used_only_the_charts_dra_rules(dra: DraCluster, allocator: Extender) -> None:
    """Every request of gpupool's scheduler (the audit log, with at least one claim allocated here) was
    granted and is within what the chart gives its account with dra.enabled: system:kube-scheduler and
    system:volume-scheduler (bound by the chart) and the chart's own roles. The chart's admission policy
    refuses any other change of a pod by that account."""
    c = dra
    c.apply([claim_template("rules", memory="2Gi", cores="10"), gated_pod("rules", template="rules")])
    (pod,) = wait_placed(c, allocator, ["rules"])
    check_gpupool_allocated(c, pod, 2048, 10)
    rules = []
    for built_in in ("system:kube-scheduler", "system:volume-scheduler"):
        role = c.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{built_in}")
        assert role is not None, built_in
        rules += role["rules"]
    mine = [o for o in c.objects if o["kind"] in ("ClusterRole", "Role")
            and o["metadata"]["name"].startswith(SCHEDULER_ACCOUNT)]
    rules += [r for o in mine for r in o["rules"]]
    granted = {(g, r, v) for rule in rules if "resources" in rule for g in rule.get("apiGroups", [""])
               for r in rule["resources"] for v in rule["verbs"]}
    used, refused = audited(c, SCHEDULER_USER)
    assert refused == []
    assert used - granted == set()
    # what allocating needs was used: the claim's finalizer and status written, the gate removed
    assert {("resource.k8s.io", "resourceclaims", "patch"), ("resource.k8s.io", "resourceclaims/status", "patch"),
            ("", "pods", "patch")} <= used, sorted(used)
    print("scheduler requests:", sorted(used))
    # The same account changing anything else of a pod: RBAC allows the patch, and so would the API server
    # on a running pod (a label, a deadline), the chart's policy does not.
    for patch in ({"metadata": {"labels": {"moved": "yes"}}}, {"spec": {"activeDeadlineSeconds": 3600}}):
        done = c.kubectl("patch", "pod", "-n", NAMESPACE, "rules", "--type", "merge", "-p", json.dumps(patch),
                         check=False, kubeconfig=allocator.kubeconfig)
        assert done.returncode != 0 and "the gpupool scheduler may" in done.stderr, (patch, done.stderr)


def audited(c: DraCluster, user: str) -> tuple[set[tuple[str, str, str]], list[str]]:
    """What `user` did on the API server (the audit log): every (group, resource, verb) it used, and the
    requests it was refused (403)."""
    used, refused = set(), []
    for e in c.bed.audit_events():
        ref = e.get("objectRef")
        if e["user"]["username"] != user or ref is None:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, e["verb"]))
        if (e.get("responseStatus") or {}).get("code") == 403:
            refused.append(f"{e['verb']} {e.get('requestURI')}")
    return used, refused


def test_the_agents_used_only_the_charts_dra_rules_and_only_their_own_slice(dra: DraCluster) -> None:
    """Every request the agents made (the audit log) was granted and is within the chart's agent role with
    dra.enabled; and the chart's own-node policy refuses an agent's write to another node's slice."""
    c = dra
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{AGENT_ACCOUNT}"
    # the ClusterRole, and with dra.remote the Role for the moves ConfigMap in the release's namespace
    roles = [o for o in c.objects
             if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"].startswith(AGENT_ACCOUNT)]
    granted = {(g, r, v) for role in roles for rule in role["rules"] for g in rule.get("apiGroups", [""])
               for r in rule["resources"] for v in rule["verbs"]}
    used, refused = audited(c, user)
    assert refused == []
    assert used - granted == set()
    # what DRA needs of the role was used: the slice written, the claims read
    assert {("resource.k8s.io", "resourceslices", "create"), ("resource.k8s.io", "resourceslices", "patch"),
            ("resource.k8s.io", "resourceclaims", "get")} <= used
    # ... and what remote shares need: claims watched on GPU nodes, the moves ConfigMap read and advanced
    assert {("resource.k8s.io", "resourceclaims", "watch"), ("", "configmaps", "watch"),
            ("", "configmaps", "patch")} <= used
    print("agent rules granted, unused here:", sorted(granted - used))
    # Node 0's agent emptying node 1's slice with a patch (the write its role grants: get, create, patch):
    # RBAC allows it on every slice, the chart's policy does not.
    other = c.slice(1)
    assert other is not None
    done = c.kubectl("patch", "resourceslice", other["metadata"]["name"], "--type", "merge", "-p",
                     json.dumps({"spec": {"devices": []}}), check=False, kubeconfig=c.agents[0].kubeconfig)
    assert done.returncode != 0 and "only the ResourceSlice of its own node" in done.stderr, done.stderr
    assert len((c.slice(1) or {})["spec"]["devices"]) == GPUS
