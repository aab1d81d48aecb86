"""`scripts/k8s-testbed up --nodes 1 --gpupool`, the one command a newcomer runs: it prints what to use, the
pod manifest it prints runs as written and gets its grant from the chart's own pods, and a plain pod (no
scheduler named) runs too. Its own control plane, beside the suite's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.real_node_fixtures import _ensure_tools, ensure_project_images, images, parse_grant, wait_for

pytestmark = pytest.mark.e2e


def test_one_command_brings_up_gpupool_and_its_example_pod_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ensure_tools()
    ensure_project_images()  # the chart's pods run them
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
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-{node}-")  # the node's own GPUs (the chart's {node})
        assert Path(info["helm"]).is_file()

        # An ordinary pod: the default profile places it (the chart's kube-scheduler serves only gpupool's).
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "demo"},
                 "spec": {"containers": [{"name": "main", "image": images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                          "command": ["sleep", "1000000"]}]}}
        subprocess.run([*kubectl, "create", "-f", "-"], input=json.dumps(plain), capture_output=True, text=True,
                       check=True)

        def running() -> bool:
            done = subprocess.run([*kubectl, "-n", "demo", "get", "pod", "plain", "-o", "jsonpath={.status.phase}"],
                                  capture_output=True, text=True)
            return done.stdout == "Running"

        wait_for(running, 120, "the plain pod Running", lambda: subprocess.run(
            [*kubectl, "-n", "demo", "describe", "pod", "plain"], capture_output=True, text=True).stdout[-1500:])

        # `gpupool doctor` with its defaults (only the kubeconfig) finds the trial's release `gp` and passes it;
        # piped, it prints lines a reader can follow, not a table folded to 80 columns.
        doctor = subprocess.run([sys.executable, "-m", "gpupool", "doctor", "--kubeconfig", info["kubeconfig"]],
                                capture_output=True, text=True, timeout=180)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        lines = doctor.stdout.splitlines()
        assert lines[0] == "INFO  api: release gp", doctor.stdout
        assert max(len(line) for line in lines) <= 80 and not any(c in doctor.stdout for c in "│┃─"), doctor.stdout
        assert lines[-1].startswith("gpupool doctor: nothing failed"), doctor.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-2000:]
