"""The node agent's one configuration object: defaults < file (YAML) < environment < flags.

Environment variables are `GPUPOOL_AGENT_<FIELD>` (e.g. GPUPOOL_AGENT_SPLIT=4; GPUPOOL_AGENT_IGNORED_XIDS is
comma-separated), plus `NODE_NAME` for the node name, which is how a DaemonSet passes it (fieldRef
spec.nodeName); GPUPOOL_AGENT_NODE_NAME overrides it. The agent reads the environment only through this
loader (the services' one loader, gpupool.api.config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpupool.api.config import ConfigError, ConfigLoader
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import RESOURCE_GPU

ENV_PREFIX = "GPUPOOL_AGENT_"
# Xids caused by applications, not by the GPU (nvidia-facts.md section 4.6): they never mark a GPU unhealthy.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)

__all__ = ["APPLICATION_XIDS", "ENV_PREFIX", "LOADER", "AgentConfig", "ConfigError", "load_config"]


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    node_name: str = Field(min_length=1, max_length=253)
    # Who finds the node's cards: NVML (NVIDIA), AMD SMI (`amdsmi`: AMD Instinct), DCMI (`dcmi`: Huawei Ascend),
    # or a described set of cards (`fake`, any vendor: the file's `vendor:`). The vendor also decides what a
    # container is handed for its cards (gpupool.agent.isolation.vendors).
    backend: Literal["nvml", "amdsmi", "dcmi", "fake"] = "nvml"
    fake_file: Path | None = None  # the GPU description for backend=fake
    split: int = Field(default=10, ge=1, le=100)  # device-plugin slots per GPU (pods per GPU at most)
    # Isolation used when a pod's allocation does not name one: mps, hook (interception shim) or none.
    isolation: Literal["mps", "hook", "none"] = "hook"
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    kubelet_socket: str = "kubelet.sock"  # file name inside device_plugin_dir
    socket_name: str = Field(default="gpupool.sock", pattern=r"^[A-Za-z0-9._-]+\.sock$")
    resource_name: str = RESOURCE_GPU
    cdi: bool = False  # hand GPUs to the runtime as CDI devices instead of NVIDIA_VISIBLE_DEVICES
    # Serve GPUs as a DRA driver (gpupool.agent.dra.driver: ResourceSlices, claims prepared through CDI) instead of
    # the device plugin. kubelet_root holds plugins_registry/ and plugins/; cdi_dir is where the container
    # runtime reads CDI specs; the slice is checked every dra_resync_s (kubelet deletes it at its start).
    dra: bool = False
    # With dra: serve the device plugin too, from the same GPUs, so pods that still ask for gpupool.io/gpu*
    # run on the node beside pods with claims (a cluster moving to DRA namespace by namespace). Both forms
    # take their shares from one device table, under one lock, and the scheduler counts both against each GPU.
    device_plugin_with_dra: bool = False
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    dra_resync_s: float = Field(default=10.0, gt=0)
    cdi_kind: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$")
    mps_root: Path = Path("/run/gpupool/mps")  # host dir; <mps_root>/<GPU UUID> is that GPU's pipe dir
    mps_container_dir: str = "/run/gpupool/mps"  # where the pipe dir appears in the container
    # Run one MPS control daemon per GPU (agent/mps.py). None: where the default isolation is mps. Without
    # them Allocate refuses MPS shares (their limits would not apply) and the scheduler keeps them away.
    mps_daemons: bool | None = None
    # isolation hook: host dir with the interception library and one directory per pod (agent/hookdir.py)
    hook_root: Path = Path("/run/gpupool/hook")
    # The Allocate checkpoint (answers given to kubelet). Default: a directory inside device_plugin_dir, which
    # the DaemonSet mounts from the host already; kubelet's start-up clean-up removes files there, not
    # directories.
    checkpoint_dir: Path | None = None
    watch_interval_s: float = Field(default=0.2, gt=0, le=1.0)  # how often kubelet.sock is checked
    reprobe_interval_s: float = Field(default=30.0, gt=0)  # unhealthy GPUs are re-probed this often
    inventory_interval_s: float = Field(default=30.0, gt=0)  # rediscovery and inventory refresh
    # Node validation (agent/validation.py): re-checked this often while the node is ready, and this often
    # while a step fails (a fixed fault is noticed within it); SIGHUP re-checks at once.
    validation_interval_s: float = Field(default=300.0, gt=0)
    validation_retry_s: float = Field(default=10.0, gt=0)
    mps_check_interval_s: float = Field(default=10.0, gt=0)  # MPS daemons are probed (and restarted) this often
    # MIG: instances of pods gone are released, and those idle this long destroyed, every mig_interval_s
    mig_interval_s: float = Field(default=30.0, gt=0)
    mig_idle_after_s: float = Field(default=600.0, gt=0)
    # The watchdog (agent/watchdog.py): the host-side second line behind isolation hook. Every poll it reads
    # NVML's per-process memory and utilisation, maps host PIDs to containers by cgroup, and stops the
    # processes of a container that holds more memory than its grant (or reports them: `report`). At most
    # 1 s between polls, so an excess is acted on within 2 s. Needs hostPID (NVML reports host PIDs).
    watchdog: bool = True
    watchdog_poll_s: float = Field(default=0.5, gt=0, le=1.0)
    watchdog_memory_action: Literal["kill", "report"] = "kill"
    watchdog_memory_slack_mib: int = Field(default=0, ge=0)  # tolerated above the cap (driver context rounding)
    # Compute far above the cap for long: more than `margin` percentage points above the container's cores
    # for `after_s` in a row. Off, report (event and metric once per episode), or kill.
    watchdog_compute_action: Literal["off", "report", "kill"] = "report"
    watchdog_compute_margin: float = Field(default=25.0, gt=0, le=100)
    watchdog_compute_after_s: float = Field(default=30.0, gt=0)
    watchdog_proc_root: Path = Path("/proc")  # the host's /proc (the agent runs with hostPID)
    event_wait_s: float = Field(default=1.0, gt=0, le=10.0)  # one NVML event wait (bounds shutdown time)
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)  # /metrics (commands/agent_metrics.py); None: off
    metrics_host: str = "0.0.0.0"  # Prometheus scrapes the DaemonSet pod's address
    kubeconfig: str | None = None  # None = in-cluster credentials
    context: str | None = None
    # Remote shares (gpupool.agent.remote.serving, docs/remote.md). remote_key_file: the cluster's remote key (a
    # mounted Secret); tokens are HMACs of claim UIDs under it, so only agents can make one. With it alone
    # the agent prepares claims of isolation remote for pods on this node (the client side); with
    # remote_listen (tcp:HOST:PORT) it also runs this node's GPU servers and serves remote shares of its
    # GPUs, advertised in the ResourceSlice as remote_address (default: the address the server reports,
    # which needs a HOST other than a wildcard).
    remote_listen: str | None = Field(default=None, pattern=r"^tcp:[^\s]*:\d{1,5}$")
    remote_address: str | None = Field(default=None, pattern=r"^tcp:[^\s:]+:\d{1,5}$", max_length=64)
    remote_key_file: Path | None = None
    remote_server_binary: Path | None = None  # None: the packaged gpupool-gpu-server
    remote_hook: Path | None = None  # the library preloaded into workers; None: the one installed under hook_root
    remote_cuda: str | None = None  # the driver the server loads; None: the server's default (libcuda.so.1)
    remote_limits_fd: int | None = Field(default=None, ge=3)  # for a library built to read limits from a fd (tests)
    remote_restart_max_s: float = Field(default=30.0, gt=0)  # longest wait before a dead server is restarted
    # Moves of remote shares (gpupool.api.moves, docs/remote.md): the namespace of gpupool's moves ConfigMap
    # (the chart passes the release's). Agents with a remote key watch it: a GPU node's agent prepares a move's
    # target and moves its source's clients, a pod node's agent points its claims' address files at the server
    # a share is served from. None: moves are not followed. While a move waits for clients to leave the
    # source, the source's workers are checked every move_check_s.
    moves_namespace: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    move_check_s: float = Field(default=1.0, gt=0, le=60)

    @model_validator(mode="after")
    def _fake_needs_file(self) -> AgentConfig:
        if self.backend == "fake" and self.fake_file is None:
            raise ValueError("backend fake needs fake_file (a YAML/JSON GPU description)")
        return self

    @model_validator(mode="after")
    def _device_plugin_beside_dra(self) -> AgentConfig:
        if self.device_plugin_with_dra and not self.dra:
            raise ValueError("device_plugin_with_dra serves the device plugin beside the DRA driver: it needs dra "
                             "(without dra the device plugin alone serves the node)")
        return self

    @model_validator(mode="after")
    def _remote_needs_key(self) -> AgentConfig:
        if self.remote_listen is not None and not self.dra:
            raise ValueError("remote_listen serves claims of isolation remote: it needs dra")
        if self.remote_listen is not None and self.remote_key_file is None:
            raise ValueError("remote_listen needs remote_key_file (the cluster's remote key)")
        if self.remote_listen is not None and self.remote_address is None and remote_host_is_wildcard(
                self.remote_listen):
            raise ValueError(f"remote_listen {self.remote_listen} listens on every address: set remote_address "
                             "(tcp:HOST:PORT, what pods on other nodes dial)")
        return self

    @property
    def runs_mps_daemons(self) -> bool:
        return self.mps_daemons if self.mps_daemons is not None else self.isolation == IsolationMode.MPS.value

    @property
    def serves_device_plugin(self) -> bool:
        """Whether the node's GPUs are offered as gpupool.io/gpu slots (alone, or beside the DRA driver)."""
        return not self.dra or self.device_plugin_with_dra

    @property
    def kubelet_socket_path(self) -> Path:
        return self.device_plugin_dir / self.kubelet_socket

    @property
    def plugin_socket_path(self) -> Path:
        return self.device_plugin_dir / self.socket_name

    @property
    def checkpoint_path(self) -> Path:
        """The directory of the Allocate checkpoint."""
        return self.checkpoint_dir or self.device_plugin_dir / "gpupool-agent"

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.model_dump().items())


def remote_host_is_wildcard(listen: str) -> bool:
    """Whether a tcp:HOST:PORT listen address names no one address (pods elsewhere could not dial it)."""
    host = listen[len("tcp:"):].rpartition(":")[0].strip("[]")
    return host in ("", "0.0.0.0", "::")


LOADER = ConfigLoader(
    AgentConfig, ENV_PREFIX, "agent", env_aliases={"node_name": "NODE_NAME"},
    hints={"node_name": "set NODE_NAME or --node-name"},
)
# flag > env > file > defaults, validated once; errors (ConfigError) name the field and its source.
load_config = LOADER.load
