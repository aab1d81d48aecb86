"""The MPS supervisor with the fake control program (tests/agent/fakes/nvidia-cuda-mps-control): real
processes, a daemon per GPU, killed and restarted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpupool.agent.devices.mps import MpsConfig, MpsSupervisor, inventory_fields, metric_samples, run_control

FAKE = str(Path(__file__).parents[1] / "fakes" / "nvidia-cuda-mps-control")
GPUS = ("GPU-mps-0001", "GPU-mps-0002")


def pid_of(sup: MpsSupervisor, gpu: str) -> int:
    return int((sup.pipe_dir(gpu) / "nvidia-cuda-mps-control.pid").read_text())


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[MpsSupervisor]:
    # short root: unix socket paths are limited to ~100 characters
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"mps-{os.getpid()}-{tmp_path.name[-12:]}"
    config = MpsConfig(pipe_root=root / "pipe", log_root=root / "log", control=FAKE,
                       default_thread_percentage=50, default_pinned_mem_limit_mib=4096)
    supervisor = MpsSupervisor(config, GPUS, clock=lambda: 7.0)
    yield supervisor
    for gpu in GPUS:  # end the daemons this test started, by their own pid files
        pidfile = supervisor.pipe_dir(gpu) / "nvidia-cuda-mps-control.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def test_one_daemon_per_gpu_with_its_own_pipe_and_log_directories(sup: MpsSupervisor) -> None:
    health = sup.start_all()
    assert all(h.up for h in health.values())
    assert pid_of(sup, GPUS[0]) != pid_of(sup, GPUS[1])
    for gpu in GPUS:
        assert (sup.pipe_dir(gpu) / "control").exists()
        # each daemon sees only its GPU
        assert f"devices {gpu}" in (sup.log_dir(gpu) / "control.log").read_text()
        # the per-client defaults were sent to it
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(sup.pipe_dir(gpu))}
        asked = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n"
        answer = run_control([FAKE], env, asked, 5)
        assert answer.ok and answer.output.split() == ["50", "4096M"]
        assert sup.refuses(gpu) is None


def test_killed_daemon_is_restarted_and_mps_pods_are_refused_meanwhile(sup: MpsSupervisor) -> None:
    sup.start_all()
    os.kill(pid_of(sup, GPUS[0]), signal.SIGKILL)
    sup.probe()
    reason = sup.refuses(GPUS[0])
    assert reason is not None and "down" in reason
    assert sup.refuses(GPUS[1]) is None  # the other GPU keeps serving
    assert metric_samples(sup.health)[:2] == [("gpupool_mps_daemon_up", {"gpu": GPUS[0]}, 0.0),
                                              ("gpupool_mps_daemon_restarts_total", {"gpu": GPUS[0]}, 0.0)]
    sup.check()
    assert sup.refuses(GPUS[0]) is None
    assert sup.health[GPUS[0]].restarts == 1 and sup.health[GPUS[1]].restarts == 0
    assert inventory_fields(sup.health)[GPUS[0]] == {"mps": "up", "mps_restarts": 1}


def test_a_daemon_that_cannot_start_stays_down_with_the_reason(sup: MpsSupervisor) -> None:
    sup.base_env["FAKE_MPS_FAIL_START"] = "1"
    sup.check()
    reason = sup.refuses(GPUS[0])
    assert reason is not None and "cannot start the MPS control daemon" in reason
    del sup.base_env["FAKE_MPS_FAIL_START"]
    sup.check()
    assert sup.refuses(GPUS[0]) is None


def test_a_running_daemon_is_kept_across_agent_restarts(sup: MpsSupervisor) -> None:
    sup.start_all()
    before = pid_of(sup, GPUS[0])
    again = MpsSupervisor(sup.config, GPUS, clock=lambda: 8.0)
    again.start_all()
    assert pid_of(again, GPUS[0]) == before and again.health[GPUS[0]].starts == 0
    again.stop_all()
    assert not (sup.pipe_dir(GPUS[0]) / "nvidia-cuda-mps-control.pid").exists()
    assert again.refuses(GPUS[0]) is not None


def test_missing_program_and_bad_config_are_clear(tmp_path: Path) -> None:
    config = MpsConfig(pipe_root=tmp_path / "p", log_root=tmp_path / "l", control=str(tmp_path / "nope"))
    s = MpsSupervisor(config, ["GPU-x"], clock=lambda: 0.0)
    s.check()
    assert "program not found" in (s.refuses("GPU-x") or "")
    assert "no MPS daemon managed" in (s.refuses("GPU-other") or "")
    assert MpsConfig(tmp_path, tmp_path, default_thread_percentage=0).problems() == [
        "MPS default thread percentage 0 must be 1-100"]


async def test_supervise_restarts_a_killed_daemon_until_stopped(sup: MpsSupervisor) -> None:
    import asyncio

    from gpupool.agent.devices.mps import supervise

    stop = asyncio.Event()
    task = asyncio.create_task(supervise(sup, stop, interval_s=0.05))
    for _ in range(400):  # the first check starts both daemons
        if all(h.up for h in sup.health.values()):
            break
        await asyncio.sleep(0.01)
    first = pid_of(sup, GPUS[0])
    os.kill(first, signal.SIGKILL)
    for _ in range(400):  # a later check finds it dead and starts a new one
        if sup.health[GPUS[0]].restarts == 1 and sup.health[GPUS[0]].up:
            break
        await asyncio.sleep(0.01)
    assert sup.health[GPUS[0]].restarts == 1 and pid_of(sup, GPUS[0]) != first
    stop.set()
    await asyncio.wait_for(task, 5)
    assert sup.refuses(GPUS[0]) is None  # left running for the next agent


def test_agent_supervisor_keeps_logs_out_of_the_pods_mount(tmp_path: Path) -> None:
    from gpupool.agent.devices.mps import agent_supervisor

    s = agent_supervisor(tmp_path / "mps", ["GPU-1"], clock=lambda: 0.0)
    assert s.pipe_dir("GPU-1") == tmp_path / "mps" / "GPU-1"
    assert s.log_dir("GPU-1") == tmp_path / "mps-log" / "GPU-1"


def test_the_agent_command_gives_the_agent_a_supervisor_where_the_config_runs_mps_daemons(tmp_path: Path) -> None:
    from gpupool.agent.config import AgentConfig
    from gpupool.commands.agent import _mps_supervisor

    backend = SimpleNamespace(discover=lambda: SimpleNamespace(devices=[SimpleNamespace(uuid="GPU-cmd-1")]))
    root = {"node_name": "n", "mps_root": tmp_path / "mps"}
    assert _mps_supervisor(AgentConfig(isolation="hook", **root), backend) is None
    assert _mps_supervisor(AgentConfig(isolation="mps", mps_daemons=False, **root), backend) is None
    assert isinstance(_mps_supervisor(AgentConfig(isolation="hook", mps_daemons=True, **root), backend), MpsSupervisor)
    made = _mps_supervisor(AgentConfig(isolation="mps", **root), backend)
    assert isinstance(made, MpsSupervisor) and list(made.gpus) == ["GPU-cmd-1"]
    # pipes where Allocate mounts them from, logs in a sibling directory pods never see
    assert made.pipe_dir("GPU-cmd-1") == tmp_path / "mps" / "GPU-cmd-1"
    assert made.log_dir("GPU-cmd-1") == tmp_path / "mps-log" / "GPU-cmd-1"
