"""`scripts/k8s-testbed up --nodes 1 --gpupool`, the one command a newcomer runs: it prints what to use, and the
pod manifest it prints runs as written and gets its grant. Its own control plane, beside the suite's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.real_node_fixtures import _ensure_tools, parse_grant, wait_for

pytestmark = pytest.mark.e2e


def test_one_command_brings_up_gpupool_and_its_example_pod_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ensure_tools()
    workdir = tmp_path_factory.mktemp("up")
    log = workdir.parent / f"{workdir.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "k8s-testbed"), "up", "--nodes", "1",
                                 "--gpupool", "--dir", str(workdir)], stdout=out, stderr=subprocess.STDOUT)
    try:
        def described() -> dict | None:  # type: ignore[type-arg]
            assert proc.poll() is None, log.read_text()
            first = log.read_text().splitlines()[:1]
            return json.loads(first[0]) if first and first[0].startswith("{") else None

        info = wait_for(described, 300, "the testbed's description", lambda: log.read_text()[-2000:])
        kubectl = [info["kubectl"], "--kubeconfig", info["kubeconfig"]]
        version = subprocess.run([*kubectl, "version", "-o", "json"], capture_output=True, text=True, check=True)
        assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == "v1.37.2"
        subprocess.run([*kubectl, "apply", "-f", info["example"]], capture_output=True, text=True, check=True)

        def grant() -> dict[str, str] | None:
            done = subprocess.run([*kubectl, "-n", "demo", "logs", "share-demo"], capture_output=True, text=True)
            return parse_grant(done.stdout)[0] if "GPUPOOL_MEMORY_LIMIT_MIB" in done.stdout else None

        env = wait_for(grant, 120, "the example pod's grant in its log")
        node = info["nodes"][0]["name"]
        assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == "10240" and env["GPUPOOL_CORES_PERCENT"] == "30"
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-{node.replace('.', '-')}-")  # the node's own GPUs
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-2000:]
