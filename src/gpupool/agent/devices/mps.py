"""The MPS supervisor: one `nvidia-cuda-mps-control -d` per GPU, each with its own pipe and log
directory, restarted when it dies; MPS pods are refused on a GPU whose daemon is down.

Why one daemon per GPU (reference §3.4): a fatal fault in one MPS client reaches every client of the
same server; with a daemon per GPU a crash stalls one GPU, not the node. Each daemon sees only its GPU
(`CUDA_VISIBLE_DEVICES=<GPU UUID>`), so inside it that GPU is device 0.

Layout: pipe directory `<pipe_root>/<GPU UUID>` (the directory the agent already mounts into MPS pods,
gpupool.agent.isolation.grant), log directory `<log_root>/<GPU UUID>` (kept out of the pods' mount: the control log
names every client).

Health = the daemon answers `get_default_active_thread_percentage` on its pipe (what NVIDIA's device
plugin checks too). Per-client defaults (`set_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit`) are sent after every (re)start: the daemon forgets them on quit,
and they apply only to MPS servers started afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True, slots=True)
class MpsConfig:
    pipe_root: Path
    log_root: Path
    control: str = CONTROL  # program name or path
    default_thread_percentage: int | None = None  # 1-100, for clients that set no limit of their own
    default_pinned_mem_limit_mib: int | None = None
    command_timeout_s: float = 10.0  # a control command that hangs this long counts as a dead daemon

    def problems(self) -> list[str]:
        out = []
        if self.default_thread_percentage is not None and not 1 <= self.default_thread_percentage <= 100:
            out.append(f"MPS default thread percentage {self.default_thread_percentage} must be 1-100")
        if self.default_pinned_mem_limit_mib is not None and self.default_pinned_mem_limit_mib <= 0:
            out.append(f"MPS default pinned memory limit {self.default_pinned_mem_limit_mib} MiB must be positive")
        return out


@dataclass(slots=True)
class DaemonHealth:
    gpu: str
    up: bool = False
    restarts: int = 0  # starts after the first one
    starts: int = 0
    last_error: str = ""
    since: float = 0.0  # clock value of the last change of `up`


@dataclass(frozen=True, slots=True)
class Answer:
    ok: bool
    output: str


Runner = Callable[[list[str], dict[str, str], str, float], Answer]


def run_control(argv: list[str], env: dict[str, str], stdin: str, timeout_s: float) -> Answer:
    """Run the control program; a missing program or a hang is an answer, not an exception."""
    try:
        done = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except FileNotFoundError:
        return Answer(False, f"{argv[0]}: program not found")
    except subprocess.TimeoutExpired:
        return Answer(False, f"{argv[0]}: no answer within {timeout_s:g} s")
    except OSError as e:
        return Answer(False, f"{argv[0]}: {e}")
    text = (done.stdout + done.stderr).strip()
    return Answer(done.returncode == 0, text)


@dataclass(slots=True)
class MpsSupervisor:
    config: MpsConfig
    gpus: Sequence[str]  # GPU UUIDs that serve MPS pods
    clock: Callable[[], float]
    runner: Runner = run_control
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    health: dict[str, DaemonHealth] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.health = {g: DaemonHealth(g) for g in self.gpus}

    def pipe_dir(self, gpu: str) -> Path:
        return self.config.pipe_root / gpu

    def log_dir(self, gpu: str) -> Path:
        return self.config.log_root / gpu

    def _env(self, gpu: str) -> dict[str, str]:
        return {**self.base_env, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu)), "CUDA_VISIBLE_DEVICES": gpu}

    def _send(self, gpu: str, commands: str) -> Answer:
        return self.runner([self.config.control], self._env(gpu), commands, self.config.command_timeout_s)

    def _set(self, gpu: str, up: bool, error: str = "") -> None:
        h = self.health[gpu]
        if h.up != up:
            h.since = self.clock()
        h.up = up
        h.last_error = error

    def start(self, gpu: str) -> bool:
        """Start the GPU's daemon (`-d`) and send the per-client defaults. True when it answers."""
        h = self.health[gpu]
        self.pipe_dir(gpu).mkdir(parents=True, exist_ok=True)
        self.log_dir(gpu).mkdir(parents=True, exist_ok=True)
        if h.starts:
            h.restarts += 1
        h.starts += 1
        started = self.runner([self.config.control, "-d"], self._env(gpu), "", self.config.command_timeout_s)
        if not started.ok:
            self._set(gpu, False, f"start failed: {started.output or 'no output'}")
            return False
        defaults = []
        if self.config.default_thread_percentage is not None:
            defaults.append(f"set_default_active_thread_percentage {self.config.default_thread_percentage}")
        if self.config.default_pinned_mem_limit_mib is not None:
            # device 0: the daemon sees only this GPU (CUDA_VISIBLE_DEVICES)
            defaults.append(f"set_default_device_pinned_mem_limit 0 {self.config.default_pinned_mem_limit_mib}M")
        if defaults:
            answer = self._send(gpu, "\n".join(defaults) + "\n")
            if not answer.ok:
                self._set(gpu, False, f"defaults refused: {answer.output or 'no output'}")
                return False
        return self.probe_one(gpu)

    def probe_one(self, gpu: str) -> bool:
        answer = self._send(gpu, "get_default_active_thread_percentage\n")
        self._set(gpu, answer.ok, "" if answer.ok else f"not answering: {answer.output or 'no output'}")
        return answer.ok

    def probe(self) -> dict[str, DaemonHealth]:
        """Ask every daemon whether it is alive; marks dead ones down (their GPUs refuse MPS pods)."""
        for gpu in self.gpus:
            self.probe_one(gpu)
        return self.health

    def check(self) -> dict[str, DaemonHealth]:
        """Probe every daemon and restart those that are down (the agent calls this periodically)."""
        for gpu in self.gpus:
            if not self.probe_one(gpu):
                self.start(gpu)
        return self.health

    def start_all(self) -> dict[str, DaemonHealth]:
        for gpu in self.gpus:
            if not self.probe_one(gpu):  # a daemon left running by an earlier agent is kept
                self.start(gpu)
        return self.health

    def stop_all(self) -> None:
        for gpu in self.gpus:
            self._send(gpu, "quit\n")
            self._set(gpu, False, "stopped")

    def refuses(self, gpu: str) -> str | None:
        """Why an MPS pod cannot be served on `gpu` now (None: it can)."""
        h = self.health.get(gpu)
        if h is None:
            return f"GPU {gpu} has no MPS daemon managed by gpupool"
        if not h.up:
            return f"the MPS daemon of GPU {gpu} is down ({h.last_error or 'not started'}); retry after its restart"
        return None


def metric_samples(health: dict[str, DaemonHealth]) -> list[tuple[str, dict[str, str], float]]:
    """Samples for /metrics: gpupool_mps_daemon_up and gpupool_mps_daemon_restarts_total per GPU."""
    out: list[tuple[str, dict[str, str], float]] = []
    for gpu, h in sorted(health.items()):
        out.append(("gpupool_mps_daemon_up", {"gpu": gpu}, 1.0 if h.up else 0.0))
        out.append(("gpupool_mps_daemon_restarts_total", {"gpu": gpu}, float(h.restarts)))
    return out


def inventory_fields(health: dict[str, DaemonHealth]) -> dict[str, dict[str, str | int]]:
    """Per GPU, what the node inventory shows about its MPS daemon."""
    return {gpu: {"mps": "up" if h.up else "down", "mps_restarts": h.restarts} for gpu, h in sorted(health.items())}


CHECK_INTERVAL_S = 10.0
_log = logging.getLogger("gpupool.agent.mps")


class MpsCollector(Collector):
    """/metrics: gpupool_mps_daemon_up and gpupool_mps_daemon_restarts_total per GPU, read at scrape time."""

    def __init__(self, supervisor: MpsSupervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpupool_mps_daemon_up", "1 when the GPU's MPS control daemon answers",
                               labels=["gpu"])
        restarts = CounterMetricFamily("gpupool_mps_daemon_restarts",
                                       "Times the agent restarted the GPU's MPS control daemon", labels=["gpu"])
        for name, labels, value in metric_samples(dict(self.supervisor.health)):
            (up if name == "gpupool_mps_daemon_up" else restarts).add_metric([labels["gpu"]], value)
        yield up
        yield restarts


async def supervise(
    supervisor: MpsSupervisor,
    stop: asyncio.Event,
    interval_s: float = CHECK_INTERVAL_S,
    on_change: Callable[[], None] | None = None,
) -> None:
    """Check (and restart) the daemons every `interval_s` until `stop` is set; log each change of state
    and call `on_change` when the inventory fields changed (the agent then republishes its inventory).
    Daemons are left running at stop: an agent restart must not take MPS away from running pods (the next
    agent keeps a daemon that answers)."""
    seen: dict[str, bool] = {}
    published: dict[str, dict[str, str | int]] = {}
    while True:
        health = await asyncio.to_thread(supervisor.check)
        fields = inventory_fields(health)
        if fields != published and on_change is not None:
            on_change()
        published = fields
        for gpu, h in sorted(health.items()):
            if seen.get(gpu) != h.up:
                if h.up:
                    _log.info("MPS daemon of %s is up (restarts: %d)", gpu, h.restarts)
                else:
                    _log.error("MPS daemon of %s is down: %s; MPS pods on it are refused", gpu, h.last_error)
                seen[gpu] = h.up
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            continue


def agent_supervisor(mps_root: Path, gpus: Sequence[str], clock: Callable[[], float]) -> MpsSupervisor:
    """The agent's supervisor: pipe directories under `mps_root` (what Allocate mounts into pods), logs in
    a sibling `<mps_root>-log` directory that pods never see."""
    log_root = mps_root.with_name(mps_root.name + "-log")
    return MpsSupervisor(MpsConfig(pipe_root=mps_root, log_root=log_root), list(gpus), clock)
