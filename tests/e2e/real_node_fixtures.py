"""Real nodes for the e2e tests: containerd + kubelet 1.20 per node (scripts/k8s/realnode.py) on the
session's control plane, and one `gpupool agent` per node run as its DaemonSet would run it (the real
command, the fake GPU backend, the node's device-plugin directory, the chart's agent ServiceAccount and
RBAC). Each agent runs an MPS control daemon per GPU (setting mps_daemons), the stand-in control program
of tests/agent/fakes, since MPS shares are served only where a daemon answers.

A test module imports `real_cluster` (module scope: one set of nodes per module, started once) and the
helpers. Missing tools fail the tests with the command that installs them; nothing here skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.devices.mps import CONTROL, MpsConfig, MpsSupervisor
from gpupool.api.allocation import AllocationDoc, decode_allocation
from gpupool.api.names import ANN_ALLOCATION, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from tests.e2e.conftest import Extender, Identities
from tests.e2e.kubectl_tool import kubectl_binary
from tests.harness import testbed as tb

ROOT = Path(__file__).resolve().parents[2]
FAKE_MPS = ROOT / "tests" / "agent" / "fakes"  # nvidia-cuda-mps-control for the agents' MPS daemons
sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import images  # noqa: E402
import realnode  # noqa: E402

Obj = dict[str, Any]
GPUS_PER_NODE = 3
SPLIT = 10
GPU_MEMORY_MIB = 46068
NAMESPACE = "e2e-real"
# Prints the container's grant (env lines, then mounts); then waits to be stopped (grace period 1 s).
GRANT_COMMAND = ["sh", "-c", "/gpupool/grant; exec sleep 1000000"]
_REGISTERED = re.compile(r"registered \S+ with kubelet \(registration \d+\)")


def wait_for(check: Callable[[], Any], timeout_s: float = 120.0, what: str = "condition",
             describe: Callable[[], str] | None = None, step_s: float = 0.3) -> Any:
    """Poll until `check()` is truthy; the generous timeout only prevents a hang (never an assertion on
    how fast something happens)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step_s)
    raise AssertionError(f"{what} not reached within {timeout_s:.0f}s ({describe() if describe else last!r})")


def ensure_project_images() -> None:
    """The images the chart's own pods run, built by scripts/image (a no-op when their inputs are unchanged):
    the gpupool image of the Dockerfile and registry.k8s.io/kube-scheduler:<version> from the built binary."""
    for command in ("build", "kube-scheduler"):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "image"), command], capture_output=True,
                              text=True, timeout=1800, check=False)
        if done.returncode != 0:
            pytest.fail(f"scripts/image {command} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
                        pytrace=False)


def _ensure_tools() -> None:
    missing = realnode.missing_tools()
    if any("scripts/k8s-testbed build" in m for m in missing) and os.environ.get("GPUPOOL_K8S_BUILD", "1") != "0":
        log = tb.cache_dir() / "build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:  # builds kubelet beside the control plane (cached; ~3 min warm)
            subprocess.run(["bash", str(ROOT / "scripts" / "k8s" / "build.sh")], stdout=out,
                           stderr=subprocess.STDOUT, check=False)
        missing = realnode.missing_tools()
    if missing:
        pytest.fail("real-node e2e tests need: " + "; ".join(missing), pytrace=False)


@dataclass
class NodeAgent:
    """`gpupool agent` for one real node, as a separate process (restartable, killable)."""

    node: realnode.RealNode
    kubeconfig: Path
    metrics_port: int
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    mig_gpus: tuple[int, ...] = ()  # these GPUs are A100-80GB in MIG mode (the agent's fake MIG driver)

    @property
    def log(self) -> Path:
        return self.node.dir / "agent.log"

    @property
    def hook_root(self) -> Path:
        return self.node.dir / "hook"

    @property
    def fake_file(self) -> Path:
        return self.node.dir / "gpus.json"

    @property
    def gpu_uuids(self) -> list[str]:
        return [f"GPU-{self.node.name.replace('.', '-')}-{i}" for i in range(GPUS_PER_NODE)]

    def start(self) -> None:
        gpus: list[dict[str, Any]] = [
            {"uuid": u, "model": "L40S", "memory_mib": GPU_MEMORY_MIB, "numa_node": 0} for u in self.gpu_uuids
        ]
        for i in self.mig_gpus:
            gpus[i].update({"model": "A100-80GB", "memory_mib": 81920, "mig": True})
        self.fake_file.write_text(json.dumps({"driver_version": "570.86", "cuda_version": "12.8", "gpus": gpus}))
        argv = [*tb.gpupool_argv(), "agent", "--node-name", self.node.name, "--backend", "fake",
                "--fake-file", str(self.fake_file), "--split", str(SPLIT),
                "--device-plugin-dir", str(self.node.device_plugin_dir), "--mps-root", str(self.mps_root),
                "--kubeconfig", str(self.kubeconfig), "--inventory-interval-s", "2", "--log-level", "info"]
        # Each node's own hook root, as each node has its own /run in a cluster.
        env = {**os.environ, "GPUPOOL_AGENT_METRICS_PORT": str(self.metrics_port),
               "GPUPOOL_AGENT_HOOK_ROOT": str(self.hook_root), "GPUPOOL_AGENT_MIG_INTERVAL_S": "1",
               "GPUPOOL_AGENT_MPS_DAEMONS": "true", "PATH": f"{FAKE_MPS}{os.pathsep}{os.environ.get('PATH', '')}"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=tb.die_with_parent)
        self.starts += 1

    @property
    def mps_root(self) -> Path:
        return self.node.dir / "mps"

    def kill(self) -> None:
        tb.kill_process(self.proc)

    def quit_mps_daemons(self) -> None:
        """The agent leaves its MPS daemons running when it stops (running pods keep MPS); at the end of
        the module they are asked to quit, as an administrator would."""
        supervisor = MpsSupervisor(MpsConfig(pipe_root=self.mps_root, log_root=self.node.dir / "mps-log",
                                             control=str(FAKE_MPS / CONTROL)), self.gpu_uuids, time.monotonic)
        supervisor.stop_all()

    def stop(self) -> None:
        tb.stop_process(self.proc, 15)

    def registrations(self) -> int:
        """Successful registrations with kubelet, over every run of this agent (the log is appended)."""
        try:
            return len(_REGISTERED.findall(self.log.read_text(errors="replace")))
        except OSError:
            return 0

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class RealCluster:
    bed: tb.Testbed
    extender: Extender
    nodes: realnode.RealNodes
    agents: dict[str, NodeAgent] = field(default_factory=dict)
    kubectl_path: Path = Path("kubectl")

    def node(self, i: int) -> realnode.RealNode:
        return self.nodes.nodes[i]

    def agent(self, i: int) -> NodeAgent:
        return self.agents[self.node(i).name]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def limits_seen(self, pod: str, container: str = "main") -> tuple[int, list[str]]:
        """What the container reads from its limits file (/run/gpupool/limits/limits.v1, `struct gp_limits`
        in native/gp.h): the memory cap of its first GPU in MiB (offset 16) and the strings in it (its GPUs'
        UUIDs, its accounting directory)."""
        path = "/run/gpupool/limits/limits.v1"
        exec_ = ("exec", "-n", NAMESPACE, pod, "-c", container, "--")
        cap = int(self.kubectl(*exec_, "od", "-A", "n", "-t", "u8", "-j", "16", "-N", "8", path).split()[0])
        return cap // (1024 * 1024), self.kubectl(*exec_, "strings", path).split()

    def apply(self, objects: list[Obj]) -> None:
        """Create objects as a user would: one `kubectl apply` of a List."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def get(self, path: str) -> Obj | None:
        return realnode.api_request(self.bed, "GET", path)

    def pod(self, name: str) -> Obj | None:
        return self.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def pods(self) -> list[Obj]:
        doc = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods") or {}
        return list(doc.get("items") or [])

    def node_obj(self, i: int) -> Obj | None:
        return self.get(f"/api/v1/nodes/{self.node(i).name}")

    def gpu_slots(self, i: int) -> int:
        """gpupool.io/gpu allocatable as the node's real kubelet reports it (from the agent's device list)."""
        node = self.node_obj(i) or {}
        return int(((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE_GPU, "0"))

    def wait_running(self, names: list[str], timeout_s: float = 150.0) -> list[Obj]:
        def check() -> list[Obj] | None:
            pods = [self.pod(n) for n in names]
            if all(p is not None and phase(p) == "Running" for p in pods):
                return pods  # type: ignore[return-value]
            bad = [p for p in pods if p is not None and phase(p) == "Failed"]
            if bad:
                raise AssertionError(f"pods failed: {[describe_pod(p) for p in bad]}")
            return None

        return wait_for(check, timeout_s, f"pods {names} Running",  # type: ignore[no-any-return]
                        lambda: "; ".join(describe_pod(self.pod(n)) for n in names))

    def run_pod(self, pod: Obj, attempts: int = 3) -> tuple[Obj, int]:
        """Create `pod` and wait for it to run; a pod kubelet refused at admission is created again, as its
        controller would (right after a kubelet restart, kubelet can admit a pod before the re-registered
        plugin has sent its device list). Returns the running pod and how many refusals it took."""
        name = pod["metadata"]["name"]
        for refusals in range(attempts):
            self.apply([pod])

            def settled() -> Obj | None:
                p = self.pod(name)
                return p if p is not None and phase(p) in ("Running", "Failed") else None

            got: Obj = wait_for(settled, 150, f"{name} running or refused", lambda: describe_pod(self.pod(name)))
            if phase(got) == "Running":
                return got, refusals
            assert got["status"].get("reason") == "UnexpectedAdmissionError", describe_pod(got)
            self.delete_pods([name], force=True)
            wait_for(lambda: self.pod(name) is None, 60, f"refused {name} deleted")
        raise AssertionError(f"{name} refused at admission {attempts} times")

    def delete_pods(self, names: list[str], force: bool = False) -> None:
        extra = ["--grace-period=0", "--force"] if force else []
        self.kubectl("delete", "pod", "-n", NAMESPACE, "--wait=false", "--ignore-not-found", *extra, *names)

    def wait_pods_gone(self, timeout_s: float = 240.0) -> None:
        """Wait until kubelet has confirmed every deletion (the API drops a pod only then). The limit only
        prevents a hang: after many kubelet restarts a 2-core machine can take minutes to stop them all."""
        wait_for(lambda: not self.pods(), timeout_s, "pods gone (kubelet confirmed each deletion)",
                 lambda: "; ".join(describe_pod(p) + f":deleting={bool(p['metadata'].get('deletionTimestamp'))}"
                                   for p in self.pods()))

    def grant(self, name: str, container: str | None = None) -> tuple[dict[str, str], set[str]]:
        """What the container (the pod's only one, or `container`) says it received: its gpupool/NVIDIA/MPS
        variables and gpupool mounts."""
        text = self.kubectl("logs", "-n", NAMESPACE, name, *(["-c", container] if container else []))
        return parse_grant(text)

    def checkpoint(self, i: int) -> dict[str, list[str]]:
        """kubelet's device checkpoint of node i: pod UID -> gpupool.io/gpu device IDs it assigned."""
        path = self.node(i).device_plugin_dir / "kubelet_internal_checkpoint"
        doc = json.loads(path.read_text())
        out: dict[str, list[str]] = {}
        for e in doc["Data"]["PodDeviceEntries"]:
            if e["ResourceName"] != RESOURCE_GPU:
                continue
            ids = e["DeviceIDs"]
            flat = [d for v in ids.values() for d in v] if isinstance(ids, dict) else list(ids)
            out.setdefault(e["PodUID"], []).extend(flat)
        return out


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def describe_pod(pod: Obj | None) -> str:
    if pod is None:
        return "(gone)"
    st = pod.get("status") or {}
    waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in st.get("containerStatuses") or []]
    return (f"{pod['metadata']['name']}@{pod['spec'].get('nodeName')}:{st.get('phase')}:{st.get('reason', '')}:"
            f"{st.get('message', '')}:{waiting}")


def parse_grant(text: str) -> tuple[dict[str, str], set[str]]:
    env: dict[str, str] = {}
    mounts: set[str] = set()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "env":
            key, _, value = rest.partition("=")
            env[key] = value
        elif kind == "mount":
            mounts.add(rest)
    return env, mounts


def expected_grant(
    pod: Obj, default_isolation: str = "hook", container: str | None = None
) -> tuple[dict[str, str], set[str]]:
    """The environment and mounts a container must receive, written from the pod's allocation
    annotation and the agent's documented contract (gpupool.agent.isolation.grant), not from the agent's code. With
    `container`, that container's own part of the allocation (the annotation's `containers`, version 2)."""
    doc: AllocationDoc = decode_allocation(pod["metadata"]["annotations"][ANN_ALLOCATION])
    isolation = doc.isolation or default_isolation
    gpus = doc.gpus
    if container is not None and doc.containers:
        gpus = next(part.gpus for part in doc.containers if part.name == container)
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(g.memory_mib) for g in gpus),
        "GPUPOOL_CORES_PERCENT": ",".join(f"{g.cores:g}" for g in gpus),
        "GPUPOOL_ISOLATION": isolation,
    }
    mounts: set[str] = set()
    if isolation == "hook":
        # The interception library, preloaded through /etc/ld.so.preload, the container's accounting directory
        # and, read-only, the limits the agent wrote for it.
        env["GPUPOOL_HOOK_DIR"] = "/run/gpupool/hook"
        env["GPUPOOL_CORES_MODE"] = pod["metadata"]["annotations"].get("gpupool.io/cores-mode", "hard")
        mounts |= {"/usr/local/lib/gpupool/libgpupool_hook.so", "/etc/ld.so.preload", "/run/gpupool/hook",
                   "/run/gpupool/limits"}
    if isolation == "mps" and any(g.cores < 100 or g.memory_mib < GPU_MEMORY_MIB for g in gpus):
        g = gpus[0]
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{g.cores:g}"
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={g.memory_mib}M"
        env["CUDA_MPS_PIPE_DIRECTORY"] = "/run/gpupool/mps"
        mounts.add("/run/gpupool/mps")
    return env, mounts


def share_pod(name: str, node: str, memory_mib: int | None, cores: int | None, gpus: int = 1,
              annotations: dict[str, str] | None = None, scheduler: str = "gpupool-scheduler",
              image: str = images.BUSYBOX_IMAGE, command: list[str] | None = None) -> Obj:
    """A GPU share pod as the webhook leaves it, pinned to one real node, printing its grant."""
    limits: dict[str, str] = {}
    if gpus:
        limits[RESOURCE_GPU] = str(gpus)
    if memory_mib is not None:
        limits[RESOURCE_MEMORY] = str(memory_mib)
    if cores is not None:
        limits[RESOURCE_CORES] = str(cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": dict(annotations or {}),
                     "labels": {"e2e/real": "1"}},
        "spec": {
            "schedulerName": scheduler if gpus else "default-scheduler",
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": False,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": command or GRANT_COMMAND, "resources": {"limits": limits} if limits else {},
            }],
        },
    }


@pytest.fixture(autouse=True)
def no_pods_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each real-node test (passed or failed), its pods are force-deleted, so a failure stays its own
    and the next test starts on empty nodes."""
    yield
    if "real_cluster" not in request.fixturenames:
        return
    cluster: RealCluster = request.getfixturevalue("real_cluster")
    names = [p["metadata"]["name"] for p in cluster.pods()]
    if names:
        cluster.delete_pods(names, force=True)
        wait_for(lambda: not cluster.pods(), 60, "pods of the previous test deleted")


@pytest.fixture(scope="module")
def real_cluster(testbed: tb.Testbed, extender: Extender, kube_scheduler: object,
                 identities: Identities, request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """Two real nodes with 3 fake GPUs each (10 slots per GPU), an agent per node, registered and Ready.
    The agents use the chart's agent ServiceAccount token (its RBAC); the kubelets the administrator's.
    A test module may set `MIG_GPUS = {node index: (GPU index, ...)}`: those GPUs are MIG-mode A100-80GB."""
    mig_gpus: dict[int, tuple[int, ...]] = getattr(request.module, "MIG_GPUS", {})
    _ensure_tools()
    nodes = realnode.RealNodes(testbed, 2, keep=os.environ.get("GPUPOOL_E2E_KEEP") == "1", taint=True)
    try:
        nodes.start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    cluster = RealCluster(testbed, extender, nodes, kubectl_path=kubectl_binary())
    try:
        testbed.tenant_namespace(NAMESPACE)  # Pod Security baseline, as a tenant's namespace has it
        for n, node in enumerate(nodes.nodes):
            agent = NodeAgent(node, identities.agent, tb.free_port(), mig_gpus=mig_gpus.get(n, ()))
            cluster.agents[node.name] = agent
            agent.start()
        for i, node in enumerate(nodes.nodes):
            wait_for(lambda i=i: cluster.gpu_slots(i) == GPUS_PER_NODE * SPLIT, 90,  # type: ignore[misc]
                     f"node {node.name} advertising {GPUS_PER_NODE * SPLIT} slots through its real kubelet",
                     lambda node=node: cluster.agents[node.name].tail())  # type: ignore[misc]
        yield cluster
    finally:
        pods = [p["metadata"]["name"] for p in cluster.pods()]
        if pods:
            cluster.delete_pods(pods, force=True)
        for agent in cluster.agents.values():
            agent.stop()
            agent.quit_mps_daemons()
        nodes.stop()
