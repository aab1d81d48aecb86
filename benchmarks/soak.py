"""A bad day survived: the Helm chart's own pods on two real nodes (containerd + kubelet each), share pods
and claim pods churned without pause, and faults injected one at a time on a schedule, while what must
always hold is checked (docs/e2e.md, "Soak"). Not in CI; tests/e2e/test_e2e_soak.py runs a short schedule
of the same code.

Faults (`FAULTS`): the agent pod of a node deleted, the scheduler pod deleted, a webhook pod deleted, a
node's kubelet restarted, a node's containerd restarted, etcd and kube-apiserver restarted, and a node's
kubelet stopped for `--node-down-s` (two minutes) then started again.

Checked all the time (every few seconds, by a thread of its own):
- no GPU holds more than its capacity (memory, compute, shares per GPU), counted twice: from the limits
  files the agents wrote on the nodes (limits.v1 of every container and claim), and from the API's
  allocations (pods' allocation annotations, claims' allocation results);
Checked once each fault has settled (the release Ready again, its node back):
- the scheduler's ledger equals the API (its /debug/ledger diff, read inside the scheduler pod's network
  namespace, is empty);
- no pod or claim stranded: no tenant pod bound but not running, none terminating, no claim whose pod is
  gone, for longer than `--grace-s`;
- no limits file or CDI spec outlives its pod (or claim) for longer than `--grace-s`;
- every admitted tenant pod either runs or has an Event saying why.

Output: the machine's core count, each fault with its settle time, the counts, every violation, and a last
line of JSON (`kubernetes_version`, `minutes`, `faults`, `pods`, `claims`, `violations`, `settle_s_max`,
`chart_pods`, ...). Run as root on a machine with the testbed's binaries (scripts/k8s-testbed build):

    .venv/bin/python benchmarks/soak.py --minutes 10 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

from gpupool.agent.state import hookdir  # noqa: E402
from gpupool.api.allocation import AllocationError, decode_allocation  # noqa: E402
from gpupool.api.names import ANN_ALLOCATION  # noqa: E402
from tests.harness import faults as fx  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

Obj = dict[str, Any]
TENANT = "soak-tenant"
GPU_MEMORY_MIB = 46068  # scripts/k8s/release.py's fake L40S
GPU_CORES = 100.0
SPLIT = 10  # the chart's splitCount: shares per GPU
CLASS = "gpu.gpupool.io"
# (memory MiB, cores %) of the shares the churn asks for; claim templates are named after them.
SIZES = ((2048, 10), (4096, 20), (8192, 30))
FAULTS = ("agent-pod", "scheduler-pod", "webhook-pod", "kubelet-restart", "containerd-restart",
          "apiserver-etcd-restart", "node-down")
CHEAP_FAULTS = FAULTS[:4]


# --- pure parts (tests/benchmarks/test_soak.py) -------------------------------------------------------------

@dataclass(frozen=True)
class Holding:
    """One share of one GPU, as a limits file or the API says it."""

    who: str  # pod or claim, for the violation's text
    uuid: str
    memory_mib: int
    cores: float


def over_capacity(holdings: Sequence[Holding], source: str, memory_mib: int = GPU_MEMORY_MIB,
                  cores: float = GPU_CORES, split: int = SPLIT) -> list[str]:
    """One line per GPU whose holdings exceed its memory, its compute or its number of shares."""
    by_gpu: dict[str, list[Holding]] = {}
    for h in holdings:
        by_gpu.setdefault(h.uuid, []).append(h)
    out = []
    for uuid, held in sorted(by_gpu.items()):
        mem, cpu = sum(h.memory_mib for h in held), sum(h.cores for h in held)
        if mem > memory_mib or cpu > cores + 1e-6 or len(held) > split:
            out.append(f"{source}: GPU {uuid} holds {mem} MiB / {cpu:g}% in {len(held)} shares (capacity "
                       f"{memory_mib} MiB / {cores:g}% / {split}): {', '.join(sorted(h.who for h in held))}")
    return out


def limits_holdings(data: bytes, who: str) -> list[Holding]:
    """The shares a limits.v1 (struct gp_limits, native/gp_core.h) grants: per GPU, its UUID, its memory cap
    and its compute (parts per million; 0 is the whole GPU). [] for a file that is not one."""
    if len(data) < hookdir._LIMITS_SIZE or struct.unpack_from("<Q", data, 0)[0] != hookdir._LIMITS_MAGIC:
        return []
    n = min(struct.unpack_from("<I", data, 12)[0], hookdir._MAX_DEV)
    out = []
    for i in range(n):
        raw = data[hookdir._L_UUID + hookdir._UUID_LEN * i:hookdir._L_UUID + hookdir._UUID_LEN * (i + 1)]
        ppm = struct.unpack_from("<Q", data, hookdir._L_CORES + 8 * i)[0]
        out.append(Holding(who, raw.split(b"\0", 1)[0].decode(errors="replace"),
                           struct.unpack_from("<Q", data, hookdir._L_LIMIT + 8 * i)[0] >> 20,
                           GPU_CORES if ppm == 0 else ppm / 10_000))
    return out


def quantity_mib(text: str) -> int:
    """A Kubernetes memory quantity in MiB (binary and decimal suffixes, plain bytes)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9,
             "T": 10**12}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * units[suffix]) >> 20
    return int(float(text)) >> 20


def api_holdings(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]) -> list[Holding]:
    """The shares the API grants: each non-terminal bound pod's allocation annotation (written for this pod
    on this node), and each allocated claim of gpupool's class (pool = node, device gpu-<i>)."""
    out = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        text = (meta.get("annotations") or {}).get(ANN_ALLOCATION)
        if not text or not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            doc = decode_allocation(text)
        except AllocationError:
            continue
        if doc.pod_uid != meta.get("uid") or doc.node != spec["nodeName"]:
            continue
        out += [Holding(f"pod {meta.get('name')}", g.uuid, g.memory_mib, g.cores) for g in doc.gpus]
    for claim in claims:
        results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or []
        for r in results:
            if r.get("driver") != CLASS or not str(r.get("device", "")).startswith("gpu-"):
                continue
            used = r.get("consumedCapacity") or {}
            out.append(Holding(f"claim {(claim.get('metadata') or {}).get('name')}",
                               f"GPU-{r['pool']}-{int(str(r['device']).removeprefix('gpu-'))}",
                               quantity_mib(str(used.get("memory", "0"))), float(used.get("cores", GPU_CORES))))
    return out


def schedule(minutes: float, gap_s: float, kinds: Sequence[str] = FAULTS) -> Iterator[str]:
    """The faults in order, round and round (the caller stops when its time is up)."""
    del minutes, gap_s
    while True:
        yield from kinds


def summary(settles: Mapping[str, Sequence[float]], faults: int, pods: int, claims: int,
            violations: Sequence[str], minutes: float, version: str, cores: int) -> Obj:
    """The JSON line: counts, the worst settle time overall and per kind of fault (seconds, 0.1 s)."""
    per_kind = {k: {"count": len(v), "max": round(max(v), 1), "mean": round(sum(v) / len(v), 1)}
                for k, v in settles.items() if v}
    worst = max((max(v) for v in settles.values() if v), default=0.0)
    return {"kubernetes_version": version, "minutes": round(minutes, 2), "faults": faults, "pods": pods,
            "claims": claims, "violations": len(violations), "settle_s_max": round(worst, 1),
            "settle_s": per_kind, "chart_pods": True, "cores": cores}


# --- the run ---------------------------------------------------------------------------------------------

@dataclass
class Record:
    pods: int = 0  # tenant pods created (admitted by the API)
    claims: int = 0  # of which claim pods (one claim each, from a template)
    refused: int = 0  # creations the API refused (mostly while it or the webhook was down)
    failed: int = 0  # tenant pods that ended Failed (a kubelet refusing them at admission, with its reason)
    violations: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    log: Callable[[str], None] = print

    def violation(self, key: str, text: str) -> None:
        with self.lock:
            if key in self.seen:
                return
            self.seen.add(key)
            self.violations.append(text)
        self.log(f"VIOLATION {text}")


class Soak:
    def __init__(self, cluster: Any, rng: random.Random, population: int, grace_s: float,
                 log: Callable[[str], None] = print) -> None:
        self.c, self.rng, self.population, self.grace_s = cluster, rng, population, grace_s
        self.bed: tb.Testbed = cluster.bed
        self.rec = Record(log=log)
        self.log = log
        self.stop = threading.Event()
        self.lifetime: dict[str, float] = {}  # our live pods -> seconds to run before the churn deletes them
        self.running_since: dict[str, float] = {}
        self.serial = 0
        self.threads: list[threading.Thread] = []

    # REST as the administrator; None when the API does not answer (it may be restarting)
    def api(self, method: str, path: str, body: Obj | None = None) -> Obj | None:
        try:
            return self.bed.admin_request(method, path, body)
        except (tb.TestbedError, OSError, ValueError):
            return None

    def items(self, path: str) -> list[Obj] | None:
        doc = self.api("GET", path)
        return None if doc is None else list(doc.get("items") or [])

    def setup(self) -> None:
        self.bed.tenant_namespace(TENANT)
        for mib, cores in SIZES:
            self.bed.ensure(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaimtemplates", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"share-{mib}-{cores}"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": CLASS,
                    "capacity": {"requests": {"memory": f"{mib}Mi", "cores": str(cores)}}}}]}}}})

    # --- churn ---
    def tenant(self) -> Obj:
        import images
        import release

        self.serial += 1
        mib, cores = self.rng.choice(SIZES)
        if self.serial % 2:
            pod: Obj = release.example_pod(f"s{self.serial}", TENANT, memory_mib=mib, cores=cores, testbed_taint=False)
        else:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"c{self.serial}", "namespace": TENANT},
                   "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"share-{mib}-{cores}"}],
                            "containers": [{"name": "main", "image": images.BUSYBOX_IMAGE,
                                            "imagePullPolicy": "Never",
                                            "command": ["sh", "-c", "/gpupool/grant; exec sleep 1000000"],
                                            "resources": {"claims": [{"name": "gpu"}]}}]}}
        pod["spec"]["terminationGracePeriodSeconds"] = 1
        pod["metadata"]["labels"] = {"soak": "1"}
        return pod

    def churn(self) -> None:
        """Keep `population` tenants: a tenant is deleted `lifetime` after it was first seen running (never
        before: a pod that does not run must stay to be seen stranded); a failed one at once."""
        while not self.stop.is_set():
            now = time.monotonic()
            pods = self.items(f"/api/v1/namespaces/{TENANT}/pods?labelSelector=soak%3D1")
            if pods is not None:
                phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}
                for name, lifetime in list(self.lifetime.items()):
                    phase = phases.get(name)
                    if phase == "Running" and name not in self.running_since:
                        self.running_since[name] = now
                    due = phase in ("Failed", "Succeeded") or (
                        name in self.running_since and now - self.running_since[name] >= lifetime)
                    if due and self.api("DELETE", f"/api/v1/namespaces/{TENANT}/pods/{name}") is not None:
                        self.rec.failed += phase == "Failed"
                        del self.lifetime[name]
                        self.running_since.pop(name, None)
            if len(self.lifetime) < self.population:
                pod = self.tenant()
                if self.api("POST", f"/api/v1/namespaces/{TENANT}/pods", pod) is None:
                    self.rec.refused += 1
                    self.serial -= 1  # the same name again next time
                else:
                    self.rec.pods += 1
                    self.rec.claims += "resourceClaims" in pod["spec"]
                    self.lifetime[pod["metadata"]["name"]] = self.rng.uniform(10, 40)
            self.stop.wait(1.0)

    # --- continuous checks ---
    def file_holdings(self) -> list[Holding]:
        """Every limits file on the nodes, each share named `<pods|claims>/<uid>/...@<node>`."""
        out = []
        for node in self.c.nodes.nodes:
            root = node.dir / "local" / "hook"
            for path in [*root.glob("pods/*/*/limits/limits.v1"), *root.glob("claims/*/limits/limits.v1")]:
                with contextlib.suppress(OSError):
                    out += limits_holdings(path.read_bytes(), f"{path.relative_to(root)}@{node.name}")
        return out

    def check_capacity(self) -> None:
        """Both counts. The files are read after the API is listed, and only those of a pod or claim the API
        still holds count (a pod the API dropped has had its containers stopped, kubelet confirmed it; its
        file left behind is the settled check's `outlives its pod`). A violation says what each share's
        owner was in the API at that moment."""
        pods = self.items(f"/api/v1/namespaces/{TENANT}/pods")
        claims = self.items(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims")
        if pods is None or claims is None:
            return
        owners: dict[str, str] = {}
        for p in pods:
            st = p.get("status") or {}
            if st.get("phase") not in ("Succeeded", "Failed"):
                owners[p["metadata"]["uid"]] = (
                    f"pod {p['metadata']['name']} {st.get('phase')} on {p['spec'].get('nodeName')}"
                    f"{' deleting' if p['metadata'].get('deletionTimestamp') else ''}")
        for c in claims:
            alloc = ((c.get("status") or {}).get("allocation") or {}).get("devices") or {}
            users = [r.get("name") for r in (c.get("status") or {}).get("reservedFor") or []]
            owners[c["metadata"]["uid"]] = (
                f"claim {c['metadata']['name']} {'allocated ' + str(alloc.get('results')) if alloc else 'unallocated'}"
                f" for {users}{' deleting' if c['metadata'].get('deletionTimestamp') else ''}")
        files = [h for h in self.file_holdings() if h.who.split("/")[1] in owners]
        for line in over_capacity(files, "limits files"):
            gpu = line.split()[3]
            why = "; ".join(f"{h.who.split('/')[1]}: {owners[h.who.split('/')[1]]}" for h in files if h.uuid == gpu)
            self.rec.violation(line, f"{line} [{why}]")
        for line in over_capacity(api_holdings(pods, claims), "API"):
            self.rec.violation(line, line)

    def watch(self) -> None:
        while not self.stop.is_set():
            try:
                self.check_capacity()
            except Exception as e:  # noqa: BLE001  # a check that fails must say so, not end the thread
                self.log(f"capacity check failed: {type(e).__name__}: {e}")
            self.stop.wait(3.0)

    def start(self) -> None:
        for target in (self.churn, self.watch):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    # --- after a fault ---
    def ledger_diff(self) -> dict[str, list[str]] | None:
        """The extender's /debug/ledger diff, read in the scheduler pod's network namespace (it listens on
        the pod's loopback); None when it does not answer."""
        rel = self.c.release
        pids = [p.pid for p in rel.processes() if p.role == "scheduler" and p.pod_uid]
        if not pids:
            return None
        code = ("import json,urllib.request;print(json.dumps(json.load(urllib.request.urlopen("
                f"'http://127.0.0.1:{rel.extender_port()}/debug/ledger',timeout=30))['diff']))")
        done = subprocess.run(["nsenter", "--target", str(pids[0]), "--net", sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def settled(self) -> bool:
        if self.api("GET", "/version") is None:
            return False
        if self.c.release.not_ready():
            return False
        for node in self.c.nodes.nodes:
            obj = self.api("GET", f"/api/v1/nodes/{node.name}") or {}
            if not any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (obj.get("status") or {}).get("conditions") or []):
                return False
        diff = self.ledger_diff()
        return diff is not None and not any(diff.values())

    def problems(self) -> dict[str, str]:
        """What must not last once the cluster has settled: key -> text."""
        out: dict[str, str] = {}
        pods = self.items(f"/api/v1/namespaces/{TENANT}/pods") or []
        claims = self.items(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims") or []
        events = self.items(f"/api/v1/namespaces/{TENANT}/events") or []
        explained = {str((e.get("involvedObject") or {}).get("uid")) for e in events}
        uids = {p["metadata"]["uid"]: p for p in pods}
        claim_uids = {c["metadata"]["uid"] for c in claims}
        for p in pods:
            meta, status = p["metadata"], p.get("status") or {}
            name, phase = meta["name"], status.get("phase")
            if meta.get("deletionTimestamp"):
                out[f"terminating {name}"] = (f"pod {name} still terminating (phase {phase}) on "
                                              f"{p['spec'].get('nodeName')}")
            elif phase == "Pending" and p["spec"].get("nodeName"):
                out[f"bound {name}"] = f"pod {name} bound to {p['spec']['nodeName']} but not running: {status}"
            elif phase == "Pending" and meta["uid"] not in explained:
                out[f"silent {name}"] = f"pod {name} pending with no Event saying why"
        for c in claims:
            owners = [o["uid"] for o in c["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"]
            if owners and not any(o in uids for o in owners):
                out[f"claim {c['metadata']['name']}"] = f"claim {c['metadata']['name']} outlives its pod"
        for node in self.c.nodes.nodes:
            root = node.dir / "local" / "hook"
            on_node = {u for u, p in uids.items() if p["spec"].get("nodeName") == node.name}
            for d in root.glob("pods/*"):
                if d.name not in on_node and d.name not in self._foreign(node.name):
                    out[f"limits {d.name}"] = f"hook directory {d.relative_to(root)} on {node.name} outlives its pod"
            for d in root.glob("claims/*"):
                if d.name not in claim_uids:
                    out[f"claimdir {d.name}"] = (f"hook directory {d.relative_to(root)} on {node.name} outlives "
                                                 "its claim")
            for spec in (node.dir / "cdi").glob("*"):
                with contextlib.suppress(OSError, ValueError):
                    names = {d.get("name") for d in json.loads(spec.read_text()).get("devices") or []}
                    if names and not names & (claim_uids | set(uids)):
                        out[f"cdi {spec.name}"] = f"CDI spec {spec.name} on {node.name} outlives its claim ({names})"
        return out

    def _foreign(self, node: str) -> set[str]:
        """The UIDs of every pod on `node` outside the tenant namespace (the release's own pods have none of
        gpupool's directories, but a directory of theirs would not be the churn's to judge)."""
        pods = self.items(f"/api/v1/pods?fieldSelector=spec.nodeName={node}") or []
        return {p["metadata"]["uid"] for p in pods}

    def settle(self, timeout_s: float) -> float:
        """Seconds until the cluster settles (release Ready, nodes Ready, ledger = API), then the checks that
        must hold once settled (given `grace_s` more to converge); violations recorded."""
        start = time.monotonic()
        while not self.settled():
            if time.monotonic() - start > timeout_s:
                diff = self.ledger_diff()
                self.rec.violation(f"settle {start}", f"not settled {timeout_s:.0f}s after the fault: release "
                                   f"{self.c.release.not_ready()}; ledger diff {diff}")
                break
            time.sleep(1)
        took = time.monotonic() - start
        # A problem is a violation only if it lasts the whole grace: the churn's young pods are pending
        # without an Event for a moment, a deleted pod's directory goes at the agent's next clean-up.
        deadline = time.monotonic() + self.grace_s
        lasting = self.problems()
        while lasting and time.monotonic() < deadline:
            time.sleep(3)
            now = self.problems()
            lasting = {k: now[k] for k in lasting if k in now}
        for key, text in lasting.items():
            self.rec.violation(key, text)
        return took


def inject(kind: str, soak: Soak, rng: random.Random, node_down_s: float) -> float:
    """Inject one fault (main thread: restarted processes live as long as it); returns when the fault's own
    action ends (for node-down, once the kubelet is back), which is when its settle time starts."""
    c, rel = soak.c, soak.c.release
    node = rng.choice(c.nodes.nodes)

    def delete_one(component: str) -> None:
        pods = [p for p in rel.pods() if p["metadata"]["labels"].get("app.kubernetes.io/component") == component
                and (component != "agent" or p["spec"].get("nodeName") == node.name)]
        if not pods:
            raise tb.TestbedError(f"no {component} pod to delete: {rel.describe_pods()}")
        name = rng.choice(pods)["metadata"]["name"]
        soak.log(f"  deleting pod {name}")
        c.kubectl("-n", rel.namespace, "delete", "pod", name, "--wait=false")
        # The fault ends when the pod is gone (its containers stopped): until then the release may still look
        # Ready, and a settle time measured from the request would be a few seconds of nothing.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and c.bed.admin_request("GET", f"/api/v1/namespaces/{rel.namespace}/pods"
                                                                  f"?fieldSelector=metadata.name={name}")["items"]:
            time.sleep(0.5)

    if kind == "agent-pod":
        delete_one("agent")
    elif kind == "scheduler-pod":
        delete_one("scheduler")
    elif kind == "webhook-pod":
        delete_one("webhook")
    elif kind == "kubelet-restart":
        soak.log(f"  kubelet of {node.name}")
        fx.restart_kubelet(node)
    elif kind == "containerd-restart":
        soak.log(f"  containerd of {node.name}")
        fx.restart_containerd(node)
    elif kind == "apiserver-etcd-restart":
        fx.restart_control_plane(c.bed)
    elif kind == "node-down":
        soak.log(f"  kubelet of {node.name} stopped for {node_down_s:.0f}s")
        node.stop_kubelet()
        time.sleep(node_down_s)
        node.start_kubelet()
    else:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
    return time.monotonic()


@dataclass
class Result:
    line: Obj
    violations: list[str]


def run(cluster: Any, minutes: float, seed: int, kinds: Sequence[str] = FAULTS, gap_s: float = 30.0,
        population: int = 8, grace_s: float = 90.0, node_down_s: float = 120.0, settle_timeout_s: float = 600.0,
        max_faults: int | None = None, log: Callable[[str], None] = print) -> Result:
    """The soak on a running chart cluster (test_e2e_chart_pods.chart_cluster, installed): churn for
    `minutes`, a fault every `gap_s` after the previous one settled (`max_faults` at most), then the checks
    of a settled cluster one last time."""
    rng = random.Random(seed)
    soak = Soak(cluster, rng, population, grace_s, log)
    soak.setup()
    version = cluster.bed.server_version()
    settles: dict[str, list[float]] = {}
    count = 0
    begin = time.monotonic()
    soak.start()
    try:
        for kind in schedule(minutes, gap_s, kinds):
            if time.monotonic() - begin > minutes * 60 or (max_faults is not None and count >= max_faults):
                break
            soak.stop.wait(gap_s)
            log(f"[{time.monotonic() - begin:6.0f}s] fault {count + 1}: {kind}")
            inject(kind, soak, rng, node_down_s)
            count += 1
            took = soak.settle(settle_timeout_s)
            settles.setdefault(kind, []).append(took)
            log(f"[{time.monotonic() - begin:6.0f}s]   settled in {took:.1f}s (pods {soak.rec.pods}, claims "
                f"{soak.rec.claims}, violations {len(soak.rec.violations)})")
    finally:
        soak.finish()
    soak.check_capacity()
    soak.settle(settle_timeout_s)
    elapsed = (time.monotonic() - begin) / 60
    line = summary(settles, count, soak.rec.pods, soak.rec.claims, soak.rec.violations, elapsed, version,
                   os.cpu_count() or 0)
    line.update(refused=soak.rec.refused, failed_pods=soak.rec.failed)
    return Result(line, list(soak.rec.violations))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="benchmarks/soak.py")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to churn and inject (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gap-s", type=float, default=30.0, help="churn between a settled fault and the next")
    parser.add_argument("--population", type=int, default=8, help="tenant pods alive at once")
    parser.add_argument("--grace-s", type=float, default=90.0, help="how long a settled cluster may take to "
                        "clear a stranded pod, a left file or an unexplained pending pod")
    parser.add_argument("--node-down-s", type=float, default=120.0)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds or args.minutes <= 0 or args.population <= 0:
        print(f"soak.py: error: --faults {unknown or 'empty'} (known: {', '.join(FAULTS)}), --minutes and "
              "--population must be positive", file=sys.stderr)
        return 2
    print(f"cores: {os.cpu_count()}", flush=True)
    import pytest

    from tests.e2e.test_e2e_chart_pods import chart_cluster

    started = time.monotonic()
    try:
        with chart_cluster("soak", "gpupool-soak", install=True) as cluster:
            print(f"cluster with the chart's pods up in {time.monotonic() - started:.0f}s", flush=True)
            result = run(cluster, args.minutes, args.seed, kinds, args.gap_s, args.population, args.grace_s,
                         args.node_down_s, log=lambda s: print(s, flush=True))
    except (pytest.fail.Exception, tb.TestbedError) as e:  # the fixtures' failures: what is missing, or busy
        print(f"soak.py: the cluster did not run: {e}", file=sys.stderr)
        return 1
    line = result.line
    print(f"faults {line['faults']}, pods {line['pods']} (of which claim pods {line['claims']}), violations "
          f"{line['violations']}; creations refused by the API {line['refused']}, pods failed {line['failed_pods']}")
    for kind, s in line["settle_s"].items():
        print(f"  settle after {kind}: max {s['max']}s, mean {s['mean']}s over {s['count']}")
    for v in result.violations:
        print(f"  violation: {v}")
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
