"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler (1.37, built from their Go modules by scripts/k8s/build.sh), for the end-to-end tests, the
e2e benchmarks and `scripts/k8s-testbed up`.

Standard library only (tests/__init__ and tests/harness/__init__ import nothing), so `scripts/k8s-testbed
build` and `check` run without the project's virtualenv.

- The API server listens on 127.0.0.1 on a free port, serves a self-signed certificate (--cert-dir) and
  knows three static bearer tokens (token file), all in system:masters: an administrator, and two users
  named like the Helm chart's scheduler and agent service accounts, for the throughput benchmarks.
- RBAC as in a cluster: `service_account_kubeconfig` creates a ServiceAccount and asks the API server
  for a bound token (TokenRequest), so the e2e suite runs each component with exactly the chart's rules.
- Every request made by a service account is written to an audit log (`audit_events`), so a test can
  compare the verbs a component used with the ones the chart grants it.
- Admission as a current cluster has it: ServiceAccount, PodSecurity (`TENANT_POD_SECURITY` on the
  namespaces `tenant_namespace` makes, the built-in default elsewhere) and the rest of the defaults.
- kube-controller-manager runs every controller but node lifecycle and IPAM: the disruption controller
  keeps PodDisruptionBudgets current for the Eviction API, the service-account controllers give each
  namespace its `default` account and root CA. Node lifecycle stays off because most nodes here are API
  objects whose status the caller writes, with no kubelet heartbeat to keep them; on those a bound pod
  stays Pending with spec.nodeName set. Real nodes (kubelet + containerd) come from scripts/k8s/realnode.py.
- kube-scheduler is started separately (`start_scheduler`), because its configuration names the
  extender's URL, which is only known once the extender runs.
- `serve_pods=True`: pods reach the API server as in a cluster, through the `kubernetes` Service. The API
  server listens on every address and advertises this host's global IPv4 address (`host_address`; pods
  cannot reach loopback), its lease endpoint reconciler publishes that address behind the Service, its
  self-signed serving certificate names that address and the Service's ClusterIP (10.96.0.1), and the
  controller-manager publishes its CA in each namespace (`kube-root-ca.crt`), which pods verify with.
  kube-proxy (same Kubernetes build, iptables mode) serves every ClusterIP on this machine: all real nodes
  share its network namespace, so one kube-proxy serves them all. It needs net.ipv4.ip_forward (pod to pod
  through a Service across node bridges), which the testbed sets and restores at `stop()`, where
  `kube-proxy --cleanup` also removes its iptables chains. One such testbed per machine at a time (a lock
  file says so): two kube-proxies would rewrite each other's chains.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_ENV = "GPUPOOL_K8S_CACHE"

ADMIN_USER = "gpupool-e2e-admin"
# The users the chart's webhook trusts (release "gp" in namespace "gpupool-system").
SCHEDULER_USER = "system:serviceaccount:gpupool-system:gp-gpupool-scheduler"
AGENT_USER = "system:serviceaccount:gpupool-system:gp-gpupool-agent"


class TestbedError(RuntimeError):
    """The testbed cannot start; the message says what is missing or which component failed, and how."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gpupool-k8s")


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path


def find_binaries() -> Binaries:
    """The control plane's binaries, or a TestbedError that says how to build them (never a silent skip)."""
    bin_dir = cache_dir() / "bin"
    names = {f: f.replace("_", "-") for f in Binaries.__dataclass_fields__}
    missing = [str(bin_dir / n) for n in names.values() if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        raise TestbedError(
            "Kubernetes test binaries missing: " + ", ".join(missing) + ". Build them once with "
            "`scripts/k8s-testbed build` (Go modules from the module proxy; about 25 minutes cold on 2 cores)."
        )
    return Binaries(**{f: bin_dir / n for f, n in names.items()})


# The chart's scheduler.kubeScheduler.unschedulableRetry (values.yaml says why; a deploy test holds the two
# equal): kube-scheduler's longest wait before retrying a pod the extender refused.
UNSCHEDULABLE_RETRY = "30s"

# What a production cluster enforces on its tenants' namespaces (Pod Security Standards).
TENANT_POD_SECURITY = "baseline"


def gpupool_argv() -> list[str]:
    """How to run the `gpupool` command of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("gpupool")
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from gpupool.cli import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """In the child: get SIGKILL when the thread that started us ends (a killed pytest or testbed command must not
    leave an API server behind). Linux only; elsewhere a no-op. So start the testbed from a thread that
    lives as long as it (the main thread), never from a short-lived worker thread."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


# The `kubernetes` Service's ClusterIP: the first address of --service-cluster-ip-range.
SERVICE_CIDR, KUBERNETES_SERVICE_IP = "10.96.0.0/16", "10.96.0.1"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def host_address() -> str:
    """An IPv4 address of this host that is not loopback (`ip -4 addr show scope global`): what pods reach
    this host at, and what an EndpointSlice may name (never 127.0.0.0/8)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=False).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        try:
            socket.inet_aton(address)
        except OSError:
            continue
        return address
    raise TestbedError("no global IPv4 address on this host (ip -4 addr): pods and EndpointSlices need one")


# klog's fatal severity (F + MMDD), a Go panic, a Go runtime fatal error
_FATAL = re.compile(r"^(F\d{4} |panic: |fatal error: )")


def _token() -> str:
    return os.urandom(16).hex()


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        """The log's last lines, after the lines that say why it died (a Go component's fatal log line or
        panic comes before thousands of lines of goroutine stacks, which a plain tail would show alone)."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        last = text[-lines:]
        why = [line for line in text[:-lines] if _FATAL.match(line)][:5]
        return "\n".join([*why, *(["..."] if why else []), *last])

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.popen, timeout)

    def kill(self) -> None:
        kill_process(self.popen)


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Process:
    """Start `argv` in its own session, its output appended to `log`, killed when the thread that started it
    ends (die_with_parent); `env` is added to this process's environment."""
    with log.open("ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, preexec_fn=die_with_parent,
                                 env=None if env is None else {**os.environ, **env})
    return Process(name, popen, log)


def stop_process(popen: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` (nothing if it already exited)."""
    if popen is None or popen.poll() is not None:
        return
    popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout)


def kill_process(popen: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL: a crash, no clean-up of any kind."""
    if popen is not None and popen.poll() is None:
        popen.kill()
        popen.wait(10)


@dataclass
class Testbed:
    """One control plane. `start()` returns once the API server answers /readyz; `stop()` ends everything
    and removes the state directory (unless `keep`)."""

    workdir: Path | None = None
    keep: bool = False
    binaries: Binaries | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    api_port: int = 0
    etcd_url: str = ""  # set when etcd starts (tests/harness/faults.py restarts the API server against it)
    processes: dict[str, Process] = field(default_factory=dict)
    # Pods reach the API server through the `kubernetes` Service (module doc); `host` is the address it
    # advertises (default: host_address()).
    serve_pods: bool = False
    host: str = ""
    _ip_forward: str = ""  # its value before the testbed set it (restored at stop)
    _proxy_lock: Any = None

    # --- paths ----------------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        assert self.workdir is not None, "testbed not started"
        return self.workdir

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_token(self) -> str:
        return self.tokens[ADMIN_USER]

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.log"

    def kubeconfig(self, user: str = ADMIN_USER) -> Path:
        """A kubeconfig file for one of the testbed's users (written on first use)."""
        safe = user.replace(":", "_")
        path = self.dir / f"kubeconfig-{safe}.yaml"
        if not path.exists():
            self._write_kubeconfig(path, safe, self.tokens[user])
        return path

    def _write_kubeconfig(self, path: Path, safe: str, token: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            # Self-signed serving certificate on loopback: the client does not verify it.
            "clusters": [{"name": "testbed", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": safe, "user": {"token": token}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": safe}}],
            "current-context": "testbed",
        }
        path.write_text(json.dumps(doc, indent=1))  # JSON is YAML

    # --- service accounts and their requests -----------------------------------------------------------
    def admin_request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One REST call with the administrator's token (a PATCH is a merge patch); raises TestbedError
        with the API's answer."""
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        req = urllib.request.Request(
            self.url + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.admin_token}",
                     "Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
                answer: dict[str, Any] = json.loads(r.read() or b"{}")
                return answer
        except urllib.error.HTTPError as e:
            raise TestbedError(f"{method} {path}: HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from None

    def server_version(self) -> str:
        """The API server's own version (gitVersion, e.g. v1.37.2), as benchmarks print it."""
        return str(self.admin_request("GET", "/version")["gitVersion"])

    def ensure(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` under `collection` unless one of that name exists; returns the stored object."""
        try:
            return self.admin_request("POST", collection, obj)
        except TestbedError as e:
            if "HTTP 409" not in str(e):
                raise
        return self.admin_request("GET", f"{collection}/{obj['metadata']['name']}")

    def service_account_kubeconfig(self, namespace: str, name: str, node: str | None = None) -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name` (created if missing) with a
        bound token from the TokenRequest API, as a pod's projected token is: the API server signs it,
        ties it to the account's UID and expires it (a day here; a test session is shorter), and RBAC sees
        system:serviceaccount:<namespace>:<name>. With `node`, the token is also bound to that Node, so the
        API server names the node in the request's user info (`authentication.kubernetes.io/node-name`) as
        it does for the token of a pod running there: what the chart's own-node policy for the agent reads."""
        path = self.dir / f"kubeconfig-sa-{namespace}-{name}{f'-{node}' if node else ''}.yaml"
        issued_for = path.with_suffix(".uid")  # the account's UID the token is bound to
        account = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        if path.exists() and issued_for.exists():
            # A token outlives neither its account nor its namespace: an earlier module of the session that
            # deleted them (its release's namespace, say) leaves a token the API server refuses (401).
            with contextlib.suppress(TestbedError):
                if self.admin_request("GET", account)["metadata"]["uid"] == issued_for.read_text():
                    return path
        self.ensure("/api/v1/namespaces", {"metadata": {"name": namespace}})
        self.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
        spec: dict[str, Any] = {"expirationSeconds": 86400}
        if node is not None:
            uid = self.admin_request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        answer = self.admin_request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
        })
        self._write_kubeconfig(path, f"sa-{namespace}-{name}", answer["status"]["token"])
        issued_for.write_text(self.admin_request("GET", account)["metadata"]["uid"])
        return path

    def tenant_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A namespace as a platform team gives one to a tenant: Pod Security `TENANT_POD_SECURITY`
        enforced (created if missing; an existing one gets the labels)."""
        meta = {"name": name, "labels": {"pod-security.kubernetes.io/enforce": TENANT_POD_SECURITY,
                                         **(labels or {})}}
        try:
            return self.admin_request("POST", "/api/v1/namespaces", {"metadata": meta})
        except TestbedError as e:
            if "HTTP 409" not in str(e):
                raise
        return self.admin_request("PATCH", f"/api/v1/namespaces/{name}", {"metadata": {"labels": meta["labels"]}})

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log so far: one event per request made with a service-account token."""
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> Testbed:
        self.binaries = self.binaries or find_binaries()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpupool-k8s-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd(timeout_s)
            self._start_apiserver(timeout_s)
            self._start_controller_manager(timeout_s)
            if self.serve_pods:
                self._start_kube_proxy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-proxy", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
        for proc in self.processes.values():
            proc.stop()
        self.processes.clear()
        self._stop_kube_proxy()
        if self.workdir is not None and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = self.processes[name] = spawn(name, argv, self.dir / f"{name}.log")
        return proc

    def _wait(self, proc: Process, ready: object, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not proc.alive():
                raise TestbedError(f"{proc.name} exited with status {proc.popen.returncode}; log {proc.log}:\n"
                                   f"{proc.tail()}")
            if ready():  # type: ignore[operator]
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"{proc.name} not ready after {timeout_s:.0f}s; log {proc.log}:\n{proc.tail()}")
            time.sleep(0.2)

    def _start_etcd(self, timeout_s: float) -> None:
        assert self.binaries is not None
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn("etcd", [
            str(self.binaries.etcd),
            "--name", "testbed",
            "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", self.etcd_url,
            "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"testbed=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # throwaway data: fsync would only measure the disk
            "--log-level", "warn",
        ])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:
                    return b'"true"' in r.read()
            except (OSError, urllib.error.URLError):
                return False

        self._wait(proc, healthy, timeout_s)

    def _start_apiserver(self, timeout_s: float) -> None:
        assert self.binaries is not None
        self.tokens = {u: _token() for u in (ADMIN_USER, SCHEDULER_USER, AGENT_USER)}
        (self.dir / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"system:masters"\n' for user, tok in self.tokens.items())
        )
        sa_key = self.dir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(self.dir / "sa.pub")],
                       check=True, capture_output=True)
        self.api_port = free_port()
        if self.serve_pods:
            self.host = self.host or host_address()
            address = ["--bind-address", "0.0.0.0", "--advertise-address", self.host]
        else:
            # The `kubernetes` Service's endpoints may not be loopback: no endpoints, nothing dials it.
            address = ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                       "--endpoint-reconciler-type", "none"]
        # Metadata (who, verb, resource, answer) of every request made with a service-account token.
        (self.dir / "audit-policy.json").write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
        }))
        proc = self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver),
            "--etcd-servers", self.etcd_url,
            *address,
            # Webhooks and API services behind a Service are dialled at an endpoint's address: without
            # serve_pods no kube-proxy serves ClusterIPs here.
            "--enable-aggregator-routing=true",
            "--secure-port", str(self.api_port),
            "--cert-dir", str(self.dir / "certs"),
            "--token-auth-file", str(self.dir / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-key-file", str(self.dir / "sa.pub"),
            "--service-account-signing-key-file", str(sa_key),
            "--service-account-issuer", "https://gpupool-testbed.invalid",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--allow-privileged",
            # Large e2e bursts: the default in-flight limits would throttle the benchmark, not Kubernetes.
            "--max-requests-inflight", "2000",
            "--max-mutating-requests-inflight", "1000",
            "--audit-policy-file", str(self.dir / "audit-policy.json"),
            "--audit-log-path", str(self.audit_log),
            "--audit-log-mode", "blocking",  # an event is on disk before the answer: tests read it at once
            "--v", "1",
        ])
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE

        def ready() -> bool:
            req = urllib.request.Request(self.url + "/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
            try:
                with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
                    return bool(r.status == 200)
            except (OSError, urllib.error.URLError):
                return False

        self._wait(proc, ready, timeout_s)
        # The default namespace exists once the API server's bootstrap controller ran; callers create pods in it.
        self._wait(proc, lambda: self._get("/api/v1/namespaces/default", ctx) is not None, timeout_s)

    def _start_controller_manager(self, timeout_s: float) -> None:
        assert self.binaries is not None
        proc = self._spawn("kube-controller-manager", [
            str(self.binaries.kube_controller_manager),
            "--kubeconfig", str(self.kubeconfig()),
            "--bind-address", "127.0.0.1",
            "--secure-port", "0",  # no serving at all: readiness is judged by what its controllers did
            "--leader-elect=false",
            # Every controller but those that need real machines behind every node (see the module's doc).
            "--controllers", "*,-node-lifecycle-controller,-node-ipam-controller",
            "--service-account-private-key-file", str(self.dir / "sa.key"),
            "--root-ca-file", str(self.dir / "certs" / "apiserver.crt"),
            "--use-service-account-credentials=false",
            "--kube-api-qps", "500", "--kube-api-burst", "1000",
            "--concurrent-gc-syncs", "5",
            "--v", "1",
        ])
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        # The service-account controller has run once `default` has its account (pods need it from now on).
        self._wait(proc, lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default", ctx) is not None,
                   timeout_s)

    # --- kube-proxy (serve_pods) -----------------------------------------------------------------------
    def _start_kube_proxy(self, timeout_s: float) -> None:
        """kube-proxy in iptables mode for every node of this machine; returns once its rules send the
        `kubernetes` Service's ClusterIP to the API server (iptables' nat table names it)."""
        import fcntl

        binary = cache_dir() / "bin" / "kube-proxy"
        if not os.access(binary, os.X_OK):
            raise TestbedError(f"{binary} missing: the testbed's pods reach Services through it. Build it with "
                               "`scripts/k8s-testbed build`.")
        lock = (Path(tempfile.gettempdir()) / "gpupool-testbed-kube-proxy.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise TestbedError("another testbed with pods' Services (serve_pods) runs on this machine: its "
                               "kube-proxy owns the iptables chains (one at a time)") from None
        self._proxy_lock = lock
        self._ip_forward = IP_FORWARD.read_text().strip()
        if self._ip_forward != "1":
            IP_FORWARD.write_text("1")
        health, metrics = free_port(), free_port()
        config = self.dir / "kube-proxy.json"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig())},
            "mode": "iptables",
            # Not a Node (one kube-proxy for all); the bind address gives it this host's address, which it would
            # otherwise wait 30 s to read from its Node.
            "hostnameOverride": f"gpupool-testbed-{self.host}", "bindAddress": self.host,
            "healthzBindAddress": f"127.0.0.1:{health}", "metricsBindAddress": f"127.0.0.1:{metrics}",
            # The host's conntrack limits and timeouts stay as they are; no route_localnet (NodePorts on
            # 127.0.0.1), no rules beyond what Services need.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        }, indent=1))
        proc = self._spawn("kube-proxy", [str(binary), "--config", str(config), "--v", "1"])

        def serving() -> bool:
            rules = subprocess.run(["iptables", "-t", "nat", "-S", "KUBE-SERVICES"], capture_output=True, text=True,
                                   check=False).stdout
            return f"-d {KUBERNETES_SERVICE_IP}/32" in rules and "default/kubernetes:https" in rules

        self._wait(proc, serving, timeout_s)

    def _stop_kube_proxy(self) -> None:
        if self._proxy_lock is None:
            return
        binary = cache_dir() / "bin" / "kube-proxy"
        subprocess.run([str(binary), "--cleanup"], capture_output=True, timeout=60, check=False)
        if self._ip_forward and self._ip_forward != "1":
            IP_FORWARD.write_text(self._ip_forward)
        self._proxy_lock.close()
        self._proxy_lock = None

    def start_default_scheduler(self) -> Process:
        """kube-scheduler with only the default profile (`default-scheduler`), as a cluster runs it: the pods
        that name no scheduler (a release's own Deployments and DaemonSet pods, a plain pod) are placed."""
        doc = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
               "clientConnection": {"kubeconfig": "__KUBECONFIG__"}, "leaderElection": {"leaderElect": False},
               "profiles": [{"schedulerName": "default-scheduler"}]}
        return self.start_scheduler(json.dumps(doc, indent=1), verbosity=1, name="default-scheduler")

    def _get(self, path: str, ctx: ssl.SSLContext) -> dict[str, Any] | None:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.admin_token}"})
        try:
            with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except (OSError, urllib.error.URLError, ValueError):
            return None

    # --- kube-scheduler -------------------------------------------------------------------------------
    def start_scheduler(self, config_text: str, verbosity: int = 2, kubeconfig: Path | None = None,
                        name: str = "kube-scheduler") -> Process:
        """Start kube-scheduler with a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1)
        whose clientConnection is filled in here (`kubeconfig`, default the administrator's). Replaces a
        running one of the same `name` (a second name runs a second instance beside it)."""
        assert self.binaries is not None
        self.stop_scheduler(name)
        path = self.dir / f"{name}.yaml"
        path.write_text(config_text.replace("__KUBECONFIG__", str(kubeconfig or self.kubeconfig())))
        proc = self._spawn(name, [
            str(self.binaries.kube_scheduler),
            "--config", str(path),
            "--secure-port", "0",  # no serving (health is judged by pods getting bound)
            "--pod-max-in-unschedulable-pods-duration", UNSCHEDULABLE_RETRY,
            "--v", str(verbosity),
        ])
        time.sleep(0.5)
        if not proc.alive():
            raise TestbedError(f"kube-scheduler exited with status {proc.popen.returncode}; log {proc.log}:\n"
                               f"{proc.tail()}")
        return proc

    def stop_scheduler(self, name: str = "kube-scheduler") -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def describe(self) -> dict[str, str]:
        return {
            "server": self.url,
            "kubeconfig": str(self.kubeconfig()),
            "scheduler_kubeconfig": str(self.kubeconfig(SCHEDULER_USER)),
            "agent_kubeconfig": str(self.kubeconfig(AGENT_USER)),
            "workdir": str(self.dir),
        }


def scheduler_config(extender_url: str, chart_config: dict[str, Any] | None = None,
                     scheduler_name: str = "gpupool-scheduler", qps: int = 1000,
                     leader_election: bool = False) -> str:
    """kube-scheduler configuration (kubescheduler.config.k8s.io/v1) with the gpupool extender.

    `chart_config` is the chart's `scheduler-config.yaml` (parsed): its extender entry and profiles are kept
    as they are; only the extender URL, the client connection and leader election (one instance, unless
    `leader_election` keeps the chart's) are changed. Without it, an equivalent entry is written here. A
    `default-scheduler` profile is added so pods that do not ask for gpupool are scheduled by the same
    instance.
    """
    if chart_config is not None:
        extenders = [dict(e) for e in chart_config.get("extenders") or []]
        if len(extenders) != 1:
            raise TestbedError(f"expected one extender in the chart's scheduler config, found {len(extenders)}")
        profiles = [dict(p) for p in chart_config.get("profiles") or []]
    else:
        extenders = [{
            "filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind", "preemptVerb": "preempt",
            "weight": 1,
            "enableHTTPS": False, "nodeCacheCapable": True, "httpTimeout": "10s", "ignorable": False,
            "managedResources": [
                {"name": "gpupool.io/gpu", "ignoredByScheduler": False},
                {"name": "gpupool.io/gpu-memory", "ignoredByScheduler": True},
                {"name": "gpupool.io/gpu-cores", "ignoredByScheduler": True},
            ],
        }]
        profiles = [{"schedulerName": scheduler_name}]
    extenders[0]["urlPrefix"] = extender_url
    if not any(p.get("schedulerName") == "default-scheduler" for p in profiles):
        profiles.append({"schedulerName": "default-scheduler"})
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": "__KUBECONFIG__", "qps": qps, "burst": qps * 2},
        "leaderElection": {"leaderElect": False},
        "profiles": profiles,
        "extenders": extenders,
    }
    if leader_election and chart_config is not None:
        doc["leaderElection"] = chart_config["leaderElection"]  # the chart's Lease, one its Role names
    return json.dumps(doc, indent=1)

