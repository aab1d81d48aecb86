"""The chart's agent.watchdog settings (deploy/helm/gpupool): off, the agent gets none of what the watchdog
needs; on, it gets the host's PIDs, CAP_KILL and Events, and its GPUPOOL_AGENT_WATCHDOG_* variables load
into the agent's configuration as set."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.agent.config import load_config
from tests.deploy.helm_tool import helm_binary

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpupool"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helm_binary(tmp_path_factory.mktemp("helm"))


def _render(helm: Path, *settings: str) -> list[dict[str, Any]]:
    args = [str(helm), "template", "gp", str(CHART), "--namespace", "gpupool-system"]
    for s in settings:
        args += ["--set-json", s]  # --set would turn 0.25 into a string
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _agent(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-agent")]
    (role,) = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-agent")]
    spec = ds["spec"]["template"]["spec"]
    return spec, spec["containers"][0], role["rules"]


def _config(container: dict[str, Any]) -> Any:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return load_config(env={**env, "NODE_NAME": "n"})


def test_off_the_agent_gets_no_host_pids_no_kill_and_no_events(helm: Path) -> None:
    spec, agent, rules = _agent(_render(helm))
    assert "hostPID" not in spec
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert all("events" not in r["resources"] for r in rules)
    assert _config(agent).watchdog is False


def test_on_the_agent_sees_the_hosts_processes_may_kill_and_record_events(helm: Path) -> None:
    spec, agent, rules = _agent(_render(
        helm, "agent.watchdog.enabled=true", "agent.watchdog.pollSeconds=0.25",
        'agent.watchdog.computeAction="kill"', "agent.watchdog.memorySlackMiB=128"))
    assert spec["hostPID"] is True
    sc = agent["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules
    config = _config(agent)
    assert (config.watchdog, config.watchdog_poll_s, config.watchdog_compute_action,
            config.watchdog_memory_slack_mib, config.watchdog_memory_action) == (True, 0.25, "kill", 128, "kill")


def test_a_poll_slower_than_a_second_is_refused_by_the_schema(helm: Path) -> None:
    args = [str(helm), "template", "gp", str(CHART), "--set-json", "agent.watchdog.pollSeconds=2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and "pollSeconds" in out.stderr
