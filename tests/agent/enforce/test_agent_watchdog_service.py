"""The watchdog runs inside the agent service (as `gpupool agent` starts it): a real process, listed by the
fake driver under its host PID and placed by a /proc tree in a pod's container, is stopped when it holds
more than the container's grant, through the agent's own killer (SIGKILL through a pidfd)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpupool.agent.config import load_config
from tests.agent.agent_helpers import eventually, pod_object, rig, scheduler_binds, scrape_metrics
from tests.agent.watchdog_helpers import write_proc

CID = "c" * 64


async def test_the_agent_runs_the_watchdog_which_stops_a_process_over_its_grant() -> None:
    proc = Path(tempfile.mkdtemp(prefix="gpa-proc-"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async with rig(watchdog_poll_s=0.05, watchdog_proc_root=proc) as r:
            assert r.agent.watchdog is not None
            p = await scheduler_binds(r.cluster, pod_object("greedy", 1), [("GPU-aaaa-1", 1, 8192, 25.0)])
            meta = p["metadata"]
            await r.cluster.patch_pod_status(meta["namespace"], meta["name"], {
                "phase": "Running", "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}]})
            write_proc(proc, child.pid, meta["uid"], CID)
            r.backend.run_process("GPU-aaaa-1", child.pid, 8000.0)
            await eventually(lambda: r.agent.watchdog is not None and r.agent.watchdog.stats.polls >= 3)
            assert child.poll() is None  # 8000 of 8192 MiB: within its grant
            r.backend.run_process("GPU-aaaa-1", child.pid, 9000.0)  # past it (say, a static binary)
            await eventually(lambda: child.poll() is not None)
            assert child.returncode == -9
            await eventually(lambda: any(e["reason"] == "GPUMemoryOverGrant" for e in r.cluster.events))
            (event,) = [e for e in r.cluster.events if e["reason"] == "GPUMemoryOverGrant"]
            assert event["involvedObject"]["uid"] == meta["uid"] and event["type"] == "Warning"
            text = await scrape_metrics(r)
            assert 'gpupool_watchdog_kills_total{reason="memory"} 1.0' in text
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        shutil.rmtree(proc, ignore_errors=True)


async def test_the_watchdog_can_be_turned_off() -> None:
    async with rig(watchdog=False) as r:
        assert r.agent.watchdog is None


def test_the_watchdog_settings_come_from_the_agent_config_loader() -> None:
    config = load_config(env={"NODE_NAME": "n", "GPUPOOL_AGENT_WATCHDOG": "false",
                              "GPUPOOL_AGENT_WATCHDOG_COMPUTE_ACTION": "kill",
                              "GPUPOOL_AGENT_WATCHDOG_POLL_S": "0.25"})
    assert (config.watchdog, config.watchdog_compute_action, config.watchdog_poll_s) == (False, "kill", 0.25)
    defaults = load_config(env={"NODE_NAME": "n"})
    assert defaults.watchdog and defaults.watchdog_poll_s <= 1.0
    assert (defaults.watchdog_memory_action, defaults.watchdog_compute_action) == ("kill", "report")
