"""The testbed lives with the test harness (tests/harness/testbed.py, outside the installed package). This
module keeps `import testbed` working for the stand-alone scripts in this directory, and adds what only a
source checkout has: `build()` runs build.sh; and, for the autoscaling tests (docs/autoscaling.md), the API
server's aggregation layer (`AggregatingTestbed`) and KEDA's operator and metrics apiserver as processes
(`Keda`, built by scripts/keda/build.sh). Standard library only, like the harness module."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.testbed import *  # noqa: E402, F403
from tests.harness.testbed import Binaries, Process, Testbed, TestbedError, free_port, spawn  # noqa: E402, F401

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"


def build(timeout_s: float | None = None) -> None:
    """Run build.sh (installs Debian build deps when missing, builds once into the cache)."""
    subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, timeout=timeout_s)


# --- the aggregation layer and KEDA (autoscaling on a pod's GPU share: docs/autoscaling.md) ---------------
# Standard library only, like the rest of this module: KEDA's manifests are applied with the testbed's kubectl.

KEDA_BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "keda" / "build.sh"
KEDA_CACHE_ENV = "GPUPOOL_KEDA_CACHE"
# The pin lives in the build script alone; read from there for what the benchmarks print.
KEDA_VERSION = next((line.split("=", 1)[1].strip() for line in KEDA_BUILD_SCRIPT.read_text().splitlines()
                     if line.startswith("KEDA_VERSION=")), "unknown")
KEDA_NAMESPACE = "keda"
KEDA_ACCOUNT = "keda-operator"  # KEDA's own manifests run the operator and the metrics apiserver as this
KEDA_APISERVICE = "v1beta1.external.metrics.k8s.io"
KEDA_METRICS_SERVICE = "keda-metrics-apiserver"
# KEDA's manifests (config/ of its module, copied beside the binaries by scripts/keda/build.sh) that say who
# its components are and what they may do; the testbed applies them as they are.
KEDA_RBAC = (("-f", "service_account/service_account.yaml"), ("-k", "rbac"),
             ("-f", "metrics-server/role.yaml"), ("-f", "metrics-server/role_binding.yaml"))
FRONT_PROXY_USER = "front-proxy-client"  # the aggregator's client certificate (requestheader allowed name)


def keda_dir() -> Path:
    return Path(os.environ.get(KEDA_CACHE_ENV) or Path.home() / ".cache" / "gpupool-keda")


@dataclass(frozen=True)
class KedaBinaries:
    operator: Path
    adapter: Path  # KEDA's metrics apiserver (external.metrics.k8s.io)
    config: Path  # config/ of KEDA's module: crd/bases, rbac, metrics-server, service_account


def find_keda() -> KedaBinaries:
    """KEDA's binaries and manifests, or a TestbedError that says how to build them."""
    base = keda_dir()
    found = KedaBinaries(base / "bin" / "keda-operator", base / "bin" / "keda-adapter", base / "config")
    missing = [str(p) for p in (found.operator, found.adapter) if not os.access(p, os.X_OK)]
    missing += [] if (found.config / "crd" / "bases").is_dir() else [str(found.config / "crd" / "bases")]
    if missing:
        raise TestbedError("KEDA missing: " + ", ".join(missing) + f". Build it once with `bash {KEDA_BUILD_SCRIPT}` "
                           "(KEDA's Go module from the module proxy; docs/autoscaling.md gives the cold time).")
    return found


def build_keda(timeout_s: float | None = None) -> None:
    subprocess.run(["bash", str(KEDA_BUILD_SCRIPT)], check=True, timeout=timeout_s)


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(f"openssl {' '.join(args[:2])}: {done.stderr.strip()}")


def make_ca(directory: Path, name: str, subject: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={subject}",
             "-keyout", str(key), "-out", str(crt))
    return crt, key


def sign_pair(directory: Path, name: str, ca: tuple[Path, Path], subject: str, sans: list[str]) -> tuple[Path, Path]:
    """A key and a certificate signed by `ca`, for serving and for client authentication, with the subject
    alternative names `sans` (e.g. DNS:x, IP:y)."""
    crt, key, csr = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment",
             "extendedKeyUsage=serverAuth,clientAuth"] + ([f"subjectAltName={','.join(sans)}"] if sans else [])
    ext.write_text("\n".join(lines) + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subject}", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "2", "-extfile", str(ext), "-out", str(crt))
    return crt, key


@dataclass
class AggregatingTestbed(Testbed):
    """The testbed with the API server's aggregation layer configured as kubeadm does it: a front-proxy CA
    that the API server tells extension API servers to trust for the requestheader user (the
    extension-apiserver-authentication ConfigMap), and the client certificate it proxies with; and
    kube-controller-manager's HPA controller syncing every `hpa_sync_s` seconds (15 by default) so that a
    test of scaling waits seconds, not minutes. Everything else is the plain testbed's."""

    hpa_sync_s: float = 2.0

    def _spawn(self, name: str, argv: list[str]) -> Process:
        if name == "kube-apiserver":
            argv = [*argv, *self._aggregation_flags()]
        elif name == "kube-controller-manager":
            argv = [*argv, "--horizontal-pod-autoscaler-sync-period", f"{self.hpa_sync_s:g}s"]
        return super()._spawn(name, argv)

    def _aggregation_flags(self) -> list[str]:
        pki = self.dir / "front-proxy"
        ca = make_ca(pki, "front-proxy-ca", "gpupool-testbed-front-proxy-ca")
        crt, key = sign_pair(pki, "front-proxy-client", ca, FRONT_PROXY_USER, [])
        return ["--requestheader-client-ca-file", str(ca[0]),
                "--requestheader-allowed-names", FRONT_PROXY_USER,
                "--requestheader-username-headers", "X-Remote-User",
                "--requestheader-group-headers", "X-Remote-Group",
                "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
                "--proxy-client-cert-file", str(crt), "--proxy-client-key-file", str(key)]


@dataclass
class Keda:
    """KEDA's operator and metrics apiserver as processes against an AggregatingTestbed, each with the
    ServiceAccount and RBAC of KEDA's own manifests (a bound token, as a pod's): the CRDs and the RBAC are
    applied from KEDA's module, the APIService for external.metrics.k8s.io names a Service whose
    EndpointSlice holds `host` (an address of this machine that is not loopback: an EndpointSlice may not
    name 127.0.0.0/8; the testbed's API server dials endpoints, --enable-aggregator-routing). The operator's
    gRPC metrics service and the metrics apiserver talk over mutual TLS with a CA made here, which the
    APIService's caBundle names. `verbosity`: KEDA's zap log level."""

    bed: Testbed
    host: str
    binaries: KedaBinaries | None = None
    verbosity: str = "info"
    processes: dict[str, Process] = field(default_factory=dict)
    adapter_port: int = 0
    grpc_port: int = 0

    @property
    def dir(self) -> Path:
        return self.bed.dir / "keda"

    def kubectl(self, *args: str) -> str:
        assert self.bed.binaries is not None
        done = subprocess.run([str(self.bed.binaries.kubectl), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise TestbedError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, timeout_s: float = 120.0) -> Keda:
        self.binaries = self.binaries or find_keda()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bed.ensure("/api/v1/namespaces", {"metadata": {"name": KEDA_NAMESPACE}})
        # KEDA's kustomization of its CRDs (bases plus its patches), server-side: they are larger than the
        # annotation client-side apply would write.
        self.kubectl("apply", "--server-side", "-k", str(self.binaries.config / "crd"))
        for how, name in KEDA_RBAC:
            self.kubectl("apply", how, str(self.binaries.config / name))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/scaledobjects.keda.sh")
        kubeconfig = self.bed.service_account_kubeconfig(KEDA_NAMESPACE, KEDA_ACCOUNT)
        certs = self._certificates()
        try:
            self._start_operator(kubeconfig, certs, timeout_s)
            self._start_adapter(kubeconfig, certs, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in ("keda-adapter", "keda-operator"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
        for path in (f"/apis/apiregistration.k8s.io/v1/apiservices/{KEDA_APISERVICE}",):
            with contextlib.suppress(TestbedError, OSError):  # a testbed stopping already, or never registered
                self.bed.admin_request("DELETE", path)

    def _certificates(self) -> Path:
        """ca.crt, tls.crt, tls.key where both KEDA programs read them (--cert-dir): one pair for the
        operator's gRPC server, the metrics apiserver's client of it and the metrics apiserver's serving,
        valid for the names each is reached by."""
        certs = self.dir / "certs"
        ca = make_ca(certs, "ca", "gpupool-testbed-keda-ca")
        names = [f"DNS:{svc}.{KEDA_NAMESPACE}.svc{suffix}" for svc in ("keda-operator", KEDA_METRICS_SERVICE)
                 for suffix in ("", ".cluster.local")]
        sign_pair(certs, "tls", ca, "keda", [*names, "IP:127.0.0.1", f"IP:{self.host}"])
        return certs

    def _spawn(self, name: str, argv: list[str], kubeconfig: Path) -> Process:
        # KEDA's manifests give both containers these (POD_NAMESPACE from the downward API); in a pod KEDA
        # reads its namespace from the projected service-account files, which a process here has not.
        env = {"KUBECONFIG": str(kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": KEDA_NAMESPACE,
               "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE}
        proc = self.processes[name] = spawn(name, argv, self.bed.dir / f"{name}.log", env)
        return proc

    def _wait(self, proc: Process, ready: Any, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not proc.alive():
                raise TestbedError(f"{proc.name} exited ({proc.popen.returncode}); log {proc.log}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise TestbedError(f"{what} not within {timeout_s:.0f}s; log {proc.log}:\n{proc.tail()}")
            time.sleep(0.3)

    def _start_operator(self, kubeconfig: Path, certs: Path, timeout_s: float) -> None:
        assert self.binaries is not None
        self.grpc_port, probe = free_port(), free_port()
        proc = self._spawn("keda-operator", [
            str(self.binaries.operator),
            "--leader-elect=false",
            "--metrics-bind-address", "0",  # its own Prometheus endpoint is not needed here
            "--health-probe-bind-address", f"127.0.0.1:{probe}",
            "--metrics-service-bind-address", f"127.0.0.1:{self.grpc_port}",
            "--cert-dir", str(certs), "--ca-dir", str(certs),
            "--enable-cert-rotation=false",  # the certificates are the testbed's (above)
            "--zap-log-level", self.verbosity,
        ], kubeconfig)

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=2) as r:
                    return bool(r.status == 200)
            except (OSError, urllib.error.URLError):
                return False

        self._wait(proc, healthy, "keda-operator ready", timeout_s)

    def _start_adapter(self, kubeconfig: Path, certs: Path, timeout_s: float) -> None:
        assert self.binaries is not None
        self.adapter_port = free_port()
        proc = self._spawn("keda-adapter", [
            str(self.binaries.adapter),
            "--bind-address", self.host, "--secure-port", str(self.adapter_port),
            "--cert-dir", str(certs), "--tls-cert-file", str(certs / "tls.crt"),
            "--tls-private-key-file", str(certs / "tls.key"),
            "--metrics-service-address", f"127.0.0.1:{self.grpc_port}",
            "--port", str(free_port()),  # its own Prometheus endpoint
            # The delegated authentication (TokenReview, the requestheader CA) and authorization
            # (SubjectAccessReview) a cluster's in-pod configuration would give it.
            "--lister-kubeconfig", str(kubeconfig), "--authentication-kubeconfig", str(kubeconfig),
            "--authorization-kubeconfig", str(kubeconfig),
            "--zap-log-level", self.verbosity,
        ], kubeconfig)
        ca = (certs / "ca.crt").read_bytes()
        self.bed.ensure(f"/api/v1/namespaces/{KEDA_NAMESPACE}/services", {
            "metadata": {"name": KEDA_METRICS_SERVICE, "namespace": KEDA_NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port}]},
        })
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{KEDA_METRICS_SERVICE}-local", "namespace": KEDA_NAMESPACE,
                         "labels": {"kubernetes.io/service-name": KEDA_METRICS_SERVICE,
                                    "endpointslice.kubernetes.io/managed-by": "gpupool-testbed"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.adapter_port, "protocol": "TCP"}],
        }
        path = f"/apis/discovery.k8s.io/v1/namespaces/{KEDA_NAMESPACE}/endpointslices"
        with contextlib.suppress(TestbedError):  # none yet
            self.bed.admin_request("DELETE", f"{path}/{KEDA_METRICS_SERVICE}-local")
        self.bed.admin_request("POST", path, endpoints)
        self.bed.ensure("/apis/apiregistration.k8s.io/v1/apiservices", {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": KEDA_APISERVICE},
            "spec": {"service": {"name": KEDA_METRICS_SERVICE, "namespace": KEDA_NAMESPACE, "port": 443},
                     "group": "external.metrics.k8s.io", "version": "v1beta1",
                     "groupPriorityMinimum": 100, "versionPriority": 100,
                     "caBundle": base64.b64encode(ca).decode()},
        })

        def available() -> bool:
            try:
                doc = self.bed.admin_request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{KEDA_APISERVICE}")
            except TestbedError:
                return False
            return any(c.get("type") == "Available" and c.get("status") == "True"
                       for c in (doc.get("status") or {}).get("conditions") or [])

        self._wait(proc, available, f"APIService {KEDA_APISERVICE} Available", timeout_s)

    def apiservice_status(self) -> str:
        doc = self.bed.admin_request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{KEDA_APISERVICE}")
        return json.dumps((doc.get("status") or {}).get("conditions"))
