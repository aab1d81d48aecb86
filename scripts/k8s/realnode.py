"""Real nodes for the testbed: one containerd 2 and one kubelet 1.37 per node, all on this machine.

Standard library only (the `scripts/k8s-testbed up --nodes N` command runs without the virtualenv).

Each node has its own directory (containerd root, state and socket; kubelet root dir, certificates and
device-plugin dir), its own cgroup root (`--cgroup-root`) and its own loopback address. Why each choice:

- One containerd per kubelet: a kubelet garbage-collects every container of its runtime that it does not
  know, so two kubelets on one containerd would remove each other's pods.
- Own cgroup root: with the cgroupfs driver a kubelet removes pod cgroups under its `kubepods` it does not
  know (orphan clean-up), which would kill the other nodes' containers.
- Own mount namespace: kubelet has the device-plugin directory compiled in
  (/var/lib/kubelet/device-plugins). containerd runs under `unshare --mount --propagation slave` with the
  node's own directory bind-mounted there, and kubelet joins that namespace (`nsenter`); the host's mounts
  still propagate in, the node's mounts do not leak out. /var/log/pods and /var/log/containers (also
  compiled in) are the node's own the same way, and so are /var/lib/kubelet/plugins_registry and
  /var/lib/kubelet/plugins (the kubelet's DRA registration and plugin directories under its --root-dir)
  and /var/run/cdi (the CDI directory its containerd reads): a DRA driver installed with the paths every
  node has (the chart's defaults) registers with this node's kubelet. Both share the namespace so the volumes kubelet
  mounts are the ones containerd sees. The gpupool agent runs outside and uses the node's directory.
- The node's name is a loopback address (127.x.y.z): kubelet refuses a loopback --node-ip, but a name that
  parses as an IP becomes the node's InternalIP and Hostname address unvalidated, so the API server reaches
  this kubelet (exec, logs) on loopback without /etc/hosts entries or other API server flags.
- `restrict_oom_score_adj`: kubelet asks for oom_score_adj -998 for pod sandboxes; lowering it needs
  CAP_SYS_RESOURCE, which some sandboxed machines (this project's Firecracker VMs) drop from the bounding
  set, and runc then fails with "failed to update /proc/self/oom_score_adj: Permission denied". containerd
  clamps the value to its own instead.
- A pod network per node: the CNI bridge plugin on a bridge of the node's own (`gp<tag><i>`), addresses
  from the node's own /24 of 10.<block>.0.0/16 (host-local, state in the node's directory), the bridge as
  gateway so this machine reaches every pod, and the pods' default route. Pods need no hostNetwork, which
  Pod Security `baseline` (the tenants' namespaces) forbids. No masquerade: nothing leaves the machine. With
  Testbed(serve_pods=True) kube-proxy serves the Services' ClusterIPs to pods (tests/harness/testbed.py).
- cgroup v1: this machine mounts only v1 controllers, which kubelet 1.37 refuses unless told
  (`failCgroupV1: false`); containerd 2 still runs on them. Kubelet's own settings are a
  KubeletConfiguration file: most of 1.20's flags are gone.
- The kubelet serves exec and logs to the API server with anonymous access allowed (AlwaysAllow): the
  testbed's API server has no kubelet client certificate, and only loopback reaches the kubelet.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import images
import testbed as tb

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # compiled into kubelet 1.20
# Where a DRA driver installed as on any node (the chart's dra.kubeletRoot and dra.cdiDir defaults) puts its
# registration socket, its own socket and its CDI specs: in each node's mount namespace these are that
# node's kubelet directories (under its --root-dir) and the CDI directory its containerd reads.
KUBELET_PLUGINS_REGISTRY = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS = Path("/var/lib/kubelet/plugins")
CDI_DIR = Path("/var/run/cdi")
# Also compiled in; kubelet's container GC deletes the log directories of pods it does not know, so on a
# shared /var/log/pods each kubelet would delete the other nodes' container logs (kubectl logs: empty).
POD_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
CGROUP_FS = Path("/sys/fs/cgroup")
REAL_NODE_LABEL = "gpupool.io/real-node"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def bin_path(name: str) -> Path:
    """A binary scripts/k8s/build.sh built (kubelet, containerd, ctr, the shim, cni/<plugin>)."""
    return tb.cache_dir() / "bin" / name


# kube-proxy: the Services of a testbed that serves pods (tests/harness/testbed.py, serve_pods)
BUILT = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "cni/bridge", "cni/host-local",
         "cni/loopback")


def missing_tools() -> list[str]:
    """What this machine lacks to run real nodes (each with where it comes from)."""
    need = {"runc": "runc", "unshare": "util-linux", "nsenter": "util-linux", "cc": "gcc"}
    out = [f"{tool} (apt-get install {pkg})" for tool, pkg in need.items() if shutil.which(tool) is None]
    if not Path("/bin/busybox").is_file():
        out.append("/bin/busybox (apt-get install busybox-static)")
    out += [f"{bin_path(b)} (scripts/k8s-testbed build)" for b in BUILT if not os.access(bin_path(b), os.X_OK)]
    if os.geteuid() != 0:
        out.append("root (kubelet and containerd manage cgroups and mounts)")
    return out


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies kubelet's cgroupfs driver writes to (named `systemd` included)."""
    if not (CGROUP_FS / "memory").is_dir():
        raise tb.TestbedError(f"no cgroup v1 memory hierarchy under {CGROUP_FS}: the testbed's kubelet with the "
                              "cgroupfs driver needs the v1 controllers mounted there")
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "unified"
                  and (p / "cgroup.procs").exists())


def _containerd_config(node: RealNode) -> str:
    d = node.dir
    cri = "[plugins.'io.containerd.cri.v1"
    return f"""version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{node.containerd_socket}"
[ttrpc]
  address = "{node.containerd_socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
{cri}.images']
  snapshotter = "overlayfs"
{cri}.images'.pinned_images]
  sandbox = "{images.PAUSE_IMAGE}"
{cri}.runtime']
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi"]
{cri}.runtime'.containerd]
  default_runtime_name = "runc"
{cri}.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.runtime'.containerd.runtimes.runc.options]
  Root = "{d}/runc"
  SystemdCgroup = false
{cri}.runtime'.cni]
  conf_dir = "{d}/cni/conf"
  bin_dirs = ["{bin_path("cni")}"]
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def _cni_config(node: RealNode) -> dict[str, object]:
    return {"cniVersion": "1.0.0", "name": f"gpupool-{node.bridge}", "plugins": [
        {"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False,
         # The default route through the bridge: pods reach this host's addresses and the Services' ClusterIPs
         # (kube-proxy's rules, Testbed(serve_pods=True)).
         "ipam": {"type": "host-local", "dataDir": str(node.dir / "cni" / "ipam"),
                  "ranges": [[{"subnet": node.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    ]}


@dataclass
class RealNode:
    """One node: containerd + kubelet (restartable on their own), registered as `name`."""

    bed: tb.Testbed
    name: str  # a loopback address, also the kubelet's listen address
    dir: Path
    cgroup_root: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)  # key=value:Effect, registered by kubelet
    bridge: str = ""  # the node's pod network: a bridge (at most 15 characters) ...
    pod_cidr: str = ""  # ... and the /24 it hands addresses from
    kubelet_port: int = 0
    # A directory of the testbed's that every node sees as its own (this node's `local/`, bind-mounted there
    # in its mount namespace): a host path a DaemonSet names once for all nodes is then per node, as on
    # separate machines (the chart's agent hook root: each agent removes the hook directories of pods not on
    # its node, so one directory shared by two nodes would lose the other node's pods' limits files).
    local: Path | None = None
    containerd: tb.Process | None = None
    kubelet: tb.Process | None = None
    kubelet_starts: int = 0

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def device_plugin_dir(self) -> Path:
        """Where kubelet.sock of this node is, seen from outside its mount namespace (agent's view)."""
        return self.dir / "device-plugins"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> tb.Process:
        return tb.spawn(f"{name}@{self.name}", argv, self.dir / f"{name}.log", env or {})

    # --- containerd -----------------------------------------------------------------------------------
    def start_containerd(self, archives: dict[str, Path], timeout_s: float = 60.0) -> None:
        for sub in ("containerd", "runc", "cni/conf", "cdi", "device-plugins", "kubelet", "mps"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "cni/conf/10-pods.conflist").write_text(json.dumps(_cni_config(self)))
        config = self.dir / "containerd.toml"
        config.write_text(_containerd_config(self))
        mounts = [(self.device_plugin_dir, DEVICE_PLUGIN_DIR), *((self.dir / "log" / p.name, p) for p in POD_LOG_DIRS),
                  (self.kubelet_root / "plugins_registry", KUBELET_PLUGINS_REGISTRY),
                  (self.kubelet_root / "plugins", KUBELET_PLUGINS), (self.dir / "cdi", CDI_DIR),
                  *([(self.dir / "local", self.local)] if self.local else [])]
        for source, target in mounts:
            source.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)  # the mount points, outside the namespace
        binds = " && ".join(f'mount --bind "{source}" "{target}"' for source, target in mounts)
        script = f'{binds} && exec "{bin_path("containerd")}" --config "{config}" --log-level warn'
        # The shim is found on PATH: the one built with this containerd comes first.
        self.containerd = self._spawn("containerd", ["env", f"PATH={bin_path('')}:{os.environ.get('PATH', '')}",
                                                     "unshare", "--mount", "--propagation", "slave",
                                                     "sh", "-c", script])
        deadline = time.monotonic() + timeout_s
        while not self._ctr_ok():
            if not self.containerd.alive():
                raise tb.TestbedError(f"containerd of {self.name} exited ({self.containerd.popen.returncode}); "
                                      f"log {self.containerd.log}:\n{self.containerd.tail()}")
            if time.monotonic() > deadline:
                raise tb.TestbedError(f"containerd of {self.name} not answering after {timeout_s:.0f}s:\n"
                                      f"{self.containerd.tail()}")
            time.sleep(0.2)
        try:
            images.import_images(archives, self.containerd_socket, str(bin_path("ctr")))
            images.tag_example_images(self.containerd_socket, str(bin_path("ctr")))
        except images.ImageError as e:
            raise tb.TestbedError(str(e)) from None

    def _ctr_ok(self) -> bool:
        if not self.containerd_socket.exists():
            return False
        done = subprocess.run([bin_path("ctr"), "--address", str(self.containerd_socket), "version"],
                              capture_output=True,
                              check=False, timeout=30)
        return done.returncode == 0

    def stand_in_devices(self, paths: list[str]) -> None:
        """Character devices at `paths` (under /dev) as this node's containerd sees them, for CDI specs that
        name a vendor's device nodes this machine lacks (/dev/kfd, /dev/dri/renderD*, /dev/vdavinci*): containerd
        refuses a CDI deviceNode whose host path does not exist or is not a device. Each stand-in is a node with
        /dev/null's numbers (1:3), so a container may open it and reads nothing.

        Only inside the node's mount namespace: the first call lays an overlay over /dev there (the host's
        /dev below, a tmpfs of the namespace above; /dev/pts and /dev/shm moved back on top), so the host's
        /dev never changes and the stand-ins go with the namespace when the node stops."""
        assert self.containerd is not None and self.containerd.alive(), "containerd of this node is not running"
        top = self.dir / "dev-overlay"
        top.mkdir(exist_ok=True)
        keep = "".join(f'mkdir "{top}/keep/{m}"; mount --bind /dev/{m} "{top}/keep/{m}"\n' for m in ("pts", "shm"))
        back = "".join(f'mount --move "{top}/keep/{m}" /dev/{m}\n' for m in ("pts", "shm"))
        script = (f'if ! grep -q "^gpupool-dev /dev overlay" /proc/self/mounts; then\n'
                  f'mount -t tmpfs gpupool-dev "{top}"\nmkdir "{top}/upper" "{top}/work" "{top}/keep"\n{keep}'
                  f'mount -t overlay gpupool-dev -o lowerdir=/dev,upperdir="{top}/upper",workdir="{top}/work" /dev\n'
                  f'{back}fi\n')
        for path in paths:
            if not path.startswith("/dev/") or ".." in path:
                raise tb.TestbedError(f"stand-in device {path!r} is not a path under /dev")
            script += f'mkdir -p "{os.path.dirname(path)}"; [ -c "{path}" ] || mknod -m 666 "{path}" c 1 3\n'
        done = subprocess.run(["nsenter", "--target", str(self.containerd.popen.pid), "--mount", "--", "sh", "-ec",
                               script], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise tb.TestbedError(f"stand-in devices on {self.name} failed ({done.returncode}): {done.stderr.strip()}")

    # --- kubelet --------------------------------------------------------------------------------------
    def _cgroup_dirs(self) -> list[Path]:
        return [h / self.cgroup_root.strip("/") for h in _cgroup_hierarchies()]

    def _make_cgroup_root(self) -> None:
        for d in self._cgroup_dirs():
            d.mkdir(exist_ok=True)
            if d.parent.name == "cpuset":  # a new v1 cpuset starts empty; no task could run in it
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((d.parent / f).read_text())

    def start_kubelet(self, verbosity: int = 1) -> tb.Process:
        assert self.containerd is not None and self.containerd.alive(), "containerd of this node is not running"
        self._make_cgroup_root()
        if not self.kubelet_port:
            self.kubelet_port = _free_port(self.name)
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        config = self.dir / "kubelet.json"
        config.write_text(json.dumps(self._kubelet_config(), indent=1))
        argv = [
            "nsenter", "--target", str(self.containerd.popen.pid), "--mount", "--",
            str(bin_path("kubelet")),
            "--config", str(config),
            "--kubeconfig", str(self.bed.kubeconfig()),
            "--root-dir", str(self.kubelet_root),
            "--cert-dir", str(self.kubelet_root / "pki"),
            "--hostname-override", self.name,
            "--node-labels", labels,
            "--v", str(verbosity),
        ]
        self.kubelet = self._spawn("kubelet", argv)
        self.kubelet_starts += 1
        return self.kubelet

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.name, "port": self.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "runtimeRequestTimeout": "2m",
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "failCgroupV1": False,
            "failSwapOn": False,
            # The images are imported, not pullable: never garbage-collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "makeIPTablesUtilChains": False,  # no kube-proxy: leave the host's firewall alone
            "volumePluginDir": str(self.kubelet_root / "volume-plugins"),
            "registerWithTaints": [_taint(t) for t in self.taints],
            "nodeStatusUpdateFrequency": "4s",
            "kubeAPIQPS": 100, "kubeAPIBurst": 200,
            "serializeImagePulls": False,
        }

    def stop_kubelet(self, kill: bool = False) -> None:
        if self.kubelet is not None:
            self.kubelet.kill() if kill else self.kubelet.stop()
            self.kubelet = None

    # --- teardown -------------------------------------------------------------------------------------
    def _pids_in_cgroups(self) -> set[int]:
        pids: set[int] = set()
        for d in self._cgroup_dirs():
            # os.walk, not rglob: a pod's cgroup may vanish while the walk is inside it, and os.walk skips what is
            # gone (rglob raised FileNotFoundError there) and goes on with the rest
            for root, _dirs, files in os.walk(d):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(x) for x in (Path(root) / "cgroup.procs").read_text().split())
        return pids

    def _pids_in_namespace(self, ns: str | None) -> set[int]:
        """Processes in this node's mount namespace (containerd, kubelet, the runc shims)."""
        if ns is None:
            return set()
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == ns:
                        out.add(int(entry.name))
                except OSError:
                    pass
        return out

    def stop(self) -> None:
        """Stop kubelet, then every container of this node, then containerd and its shims; remove the
        node's cgroups. Processes are found by this node's cgroup root and mount namespace only."""
        ns = None
        if self.containerd is not None and self.containerd.alive():
            try:
                ns = os.readlink(f"/proc/{self.containerd.popen.pid}/ns/mnt")
            except OSError:
                ns = None
        self.stop_kubelet()
        for pid in self._pids_in_cgroups():
            _kill(pid)
        if self.containerd is not None:
            self.containerd.stop()
        for pid in self._pids_in_namespace(ns):
            _kill(pid)
        if self.bridge:
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        deadline = time.monotonic() + 20
        for d in self._cgroup_dirs():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [d]:
                while sub.exists():
                    try:
                        sub.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.1)


def _taint(spec: str) -> dict[str, str]:
    """key=value:Effect, as the kubelet's old --register-with-taints flag took it."""
    key_value, effect = spec.rsplit(":", 1)
    key, _, value = key_value.partition("=")
    return {"key": key, "value": value, "effect": effect}


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@dataclass
class RealNodes:
    """N real nodes on one testbed. `start()` returns when every node is registered and Ready, without the
    API server's not-ready taint."""

    bed: tb.Testbed
    count: int
    labels: dict[str, str] = field(default_factory=dict)
    keep: bool = False
    # Taint the nodes (gpupool.io/real-node=<tag>:NoSchedule) so that only pods tolerating it land there:
    # in a shared test session, pods other tests left pending must not take these nodes' GPUs.
    taint: bool = False
    nodes: list[RealNode] = field(default_factory=list)
    root: Path | None = None

    @property
    def local(self) -> Path | None:
        """The directory each node sees as its own (RealNode.local)."""
        return self.root / "node-local" if self.root is not None else None

    def start(self, timeout_s: float = 180.0) -> RealNodes:
        problems = missing_tools()
        if problems:
            raise tb.TestbedError("real nodes need: " + "; ".join(problems))
        # Unix socket paths must stay short (108 bytes): a short directory directly under /tmp.
        # The tag is a label value and a taint value: hex, as mkdtemp's own letters may end in "_", which
        # the kubelet refuses (it then exits at start).
        tag = os.urandom(4).hex()
        self.root = Path(tempfile.mkdtemp(prefix="gpn-", dir="/tmp"))
        block = random.randint(2, 250)  # several testbeds at once: distinct node addresses
        archives = images.build_images(tb.cache_dir() / "images")
        try:
            for i in range(self.count):
                taints = [f"{REAL_NODE_LABEL}={tag}:NoSchedule"] if self.taint else []
                node = RealNode(self.bed, f"127.{block}.0.{i + 1}", self.root / f"n{i}", f"/gpupool-{tag}-n{i}",
                                {REAL_NODE_LABEL: tag, **self.labels}, taints, bridge=f"gp{tag[:6]}{i}",
                                pod_cidr=f"10.{block}.{i}.0/24", local=self.local)
                self.nodes.append(node)
                node.start_containerd(archives)
                node.start_kubelet()
            for node in self.nodes:
                wait_node_ready(self.bed, node, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        for node in self.nodes:  # the Node objects go too: no cloud controller removes them
            api_request(self.bed, "DELETE", f"/api/v1/nodes/{node.name}")
        if self.root is not None and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> list[dict[str, str]]:
        return [{"name": n.name, "dir": str(n.dir), "device_plugin_dir": str(n.device_plugin_dir),
                 "containerd": str(n.containerd_socket)} for n in self.nodes]


def api_request(bed: tb.Testbed, method: str, path: str, body: object = None,
                content_type: str = "application/merge-patch+json") -> dict | None:
    """One call to the testbed's API server as its administrator; None on any failure (404 included)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(bed.url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {bed.admin_token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _ready(node: dict) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_node_ready(bed: tb.Testbed, node: RealNode, timeout_s: float) -> dict:
    """Wait for the kubelet to register its node and report Ready, then remove the not-ready taint the API
    server put on the new node (the node-lifecycle controller's job, which the testbed leaves off)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if node.kubelet is None or not node.kubelet.alive():
            proc = node.kubelet
            raise tb.TestbedError(f"kubelet of {node.name} is not running; log {proc.log if proc else '-'}:\n"
                                  f"{proc.tail() if proc else ''}")
        obj = api_request(bed, "GET", f"/api/v1/nodes/{node.name}")
        if obj is not None and _ready(obj):
            taints = (obj.get("spec") or {}).get("taints") or []
            keep = [t for t in taints if t.get("key") != NOT_READY_TAINT]
            if len(keep) == len(taints):
                return obj
            rv = obj["metadata"]["resourceVersion"]
            api_request(bed, "PATCH", f"/api/v1/nodes/{node.name}",
                        {"metadata": {"resourceVersion": rv}, "spec": {"taints": keep or None}})
            continue  # a conflict (kubelet wrote meanwhile) simply goes round again
        if time.monotonic() > deadline:
            assert node.kubelet is not None
            raise tb.TestbedError(f"node {node.name} not Ready after {timeout_s:.0f}s; kubelet log "
                                  f"{node.kubelet.log}:\n{node.kubelet.tail()}")
        time.sleep(0.3)
