"""The project's images run as pods on a real kubelet, as the chart's pods would run them.

`scripts/image build` builds the repository's Dockerfile with buildah (on a Debian Python 3.11 base made by
mmdebstrap) and `scripts/image kube-scheduler` the chart's registry.k8s.io/kube-scheduler:<version> from the
testbed's own binary; both are OCI archives, imported here into a real node's containerd
(scripts/k8s/images.py `import_project_images`) and run with `imagePullPolicy: Never`, under runc, in a
namespace that enforces Pod Security `restricted`: non-root (the image's own USER, checked by the kubelet
through `runAsNonRoot` alone), a read-only root file system, no capabilities, RuntimeDefault seccomp.

The images are built (or found cached: a no-op when their inputs are unchanged) by the module fixture;
building needs root, buildah and mmdebstrap (installed from Debian when missing), and the network for the
build stage's apt-get and pip.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.kubectl_tool import kubectl_binary
from tests.e2e.real_node_fixtures import _ensure_tools, wait_for
from tests.harness import testbed as tb

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpupool"
sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import images  # noqa: E402
import realnode  # noqa: E402

pytestmark = pytest.mark.e2e
NAMESPACE = "e2e-image"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What the chart's containers get (templates/_helpers.tpl gpupool.containerSecurity), with the image's own
# user: the kubelet refuses to start a container whose image runs as root under runAsNonRoot.
CONTAINER_SECURITY = {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                      "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}

# Run inside the gpupool image: one `key value` line per fact a test checks.
PLAIN_CHECK = r"""
echo "uid $(id -u)"
awk '$5 == "/" {split($6, o, ","); print "rootfs", o[1]}' /proc/self/mountinfo
if touch /tmp/probe 2>/dev/null; then echo "tmp writable"; else echo "tmp read-only"; fi
for c in cc gcc ld; do command -v "$c" >/dev/null && echo "compiler $c"; done
python3 -c 'import gpupool.hook as h; print("hook", h.library_path(), h.library_path().is_file())'
python3 -m pip --version >/dev/null 2>&1 && echo "pip present" || echo "pip absent"
for role in scheduler agent webhook simulate; do gpupool "$role" --help >/dev/null && echo "$role ok"; done
echo done
"""


@dataclass
class ImageNode:
    bed: tb.Testbed
    node: realnode.RealNode
    facts: dict[str, dict[str, Any]]  # scripts/image's JSON line per command

    @property
    def gpupool_image(self) -> str:
        return str(self.facts["build"]["image"])

    @property
    def scheduler_image(self) -> str:
        return str(self.facts["kube-scheduler"]["image"])

    def run_pod(self, name: str, image: str, container: dict[str, Any], pod_security: dict[str, Any] | None = None,
                pull_policy: str = "Never") -> tuple[dict[str, Any], str]:
        """A pod on the node that runs to completion; returns its final status and its log."""
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
               "spec": {"nodeName": self.node.name, "restartPolicy": "Never",
                        "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                        "tolerations": [{"operator": "Exists"}],
                        "securityContext": pod_security or POD_SECURITY,
                        "containers": [{"name": "main", "image": image, "imagePullPolicy": pull_policy,
                                        "securityContext": CONTAINER_SECURITY,
                                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}], **container}],
                        "volumes": [{"name": "tmp", "emptyDir": {}}]}}
        self.bed.admin_request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"

        def finished() -> dict[str, Any] | None:
            status: dict[str, Any] = self.bed.admin_request("GET", path).get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        def describe() -> str:
            status = self.bed.admin_request("GET", path).get("status") or {}
            return json.dumps(status.get("containerStatuses") or status)[:1500]

        status = wait_for(finished, 180, f"pod {name} to finish", describe)
        logs = subprocess.run([str(kubectl_binary()), "--kubeconfig", str(self.bed.kubeconfig()), "-n", NAMESPACE,
                               "logs", name], capture_output=True, text=True, timeout=60, check=False)
        assert logs.returncode == 0, logs.stderr
        return status, logs.stdout


def _scripts_image(command: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "image"), command], capture_output=True,
                          text=True, timeout=1800, check=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/image {command} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
                    pytrace=False)
    facts: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return facts


@pytest.fixture(scope="module")
def image_node(testbed: tb.Testbed) -> Iterator[ImageNode]:
    _ensure_tools()  # kube-scheduler's binary too: its image is made from it
    facts = {command: _scripts_image(command) for command in ("build", "kube-scheduler")}
    nodes = realnode.RealNodes(testbed, 1, taint=True)
    try:
        nodes.start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        node = nodes.nodes[0]
        try:
            images.import_project_images([node.containerd_socket], [f["image"] for f in facts.values()],
                                         str(realnode.bin_path("ctr")))
        except images.ImageError as e:
            pytest.fail(str(e), pytrace=False)
        testbed.tenant_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "restricted"})
        yield ImageNode(testbed, node, facts)
    finally:
        testbed.admin_request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        nodes.stop()


def _terminated(status: dict[str, Any]) -> dict[str, Any]:
    (container,) = status["containerStatuses"]
    terminated: dict[str, Any] = container["state"]["terminated"]
    return terminated


def _chart_default_image() -> str:
    """The reference the chart's pods use with its default values: image.repository, and the chart's
    appVersion for an empty image.tag."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    return f"{image['repository']}:{image['tag'] or chart['appVersion']}"


def test_the_gpupool_image_runs_as_a_pod_non_root_on_a_read_only_root(image_node: ImageNode) -> None:
    """As the chart's default values name it (`gpupool/gpupool:<appVersion>`, pullPolicy IfNotPresent):
    the imported image is found under that short name, so nothing is pulled (no registry is reachable)."""
    reference = _chart_default_image()
    assert reference == f"gpupool/gpupool:{VERSION}"
    status, log = image_node.run_pod("gpupool-version", reference, {"args": ["--version"]},
                                     pull_policy="IfNotPresent")
    assert status["phase"] == "Succeeded", (status, log)
    assert _terminated(status)["exitCode"] == 0
    assert log.strip() == f"gpupool, version {VERSION}"
    # The node ran the imported image (the full reference its archive named), never a pulled one.
    assert status["containerStatuses"][0]["image"] == image_node.gpupool_image == f"docker.io/{reference}"


def test_the_gpupool_image_is_plain(image_node: ImageNode) -> None:
    """Non-root by its own USER, nothing written to its root file system, the interception library inside
    the wheel's virtual environment, no compiler and no pip left in it."""
    status, log = image_node.run_pod("gpupool-plain", image_node.gpupool_image,
                                     {"command": ["sh", "-c", PLAIN_CHECK]})
    assert status["phase"] == "Succeeded", (status, log)
    lines = log.splitlines()
    assert lines[-1] == "done", log
    assert "uid 65532" in lines
    # The root file system is mounted read-only (uid 65532 could write nowhere in it anyway: the check is
    # the mount's own option), the emptyDir /tmp is the one writable place.
    assert "rootfs ro" in lines and "tmp writable" in lines, log
    assert not [line for line in lines if line.startswith("compiler ")], log
    (hook,) = [line.split() for line in lines if line.startswith("hook ")]
    assert hook[1].startswith("/opt/gpupool/lib/python3.11/site-packages/gpupool/hook/") and hook[2] == "True"
    assert "pip absent" in lines
    # Each role's command loads its modules with nothing to write (`/tmp` is the chart's emptyDir too).
    assert {"scheduler ok", "agent ok", "webhook ok", "simulate ok"} <= set(lines), log


def test_run_as_non_root_is_enforced_on_the_node(image_node: ImageNode) -> None:
    """The control of the checks above: an image without a non-root USER (kube-scheduler's, which runs as
    root unless the pod says otherwise, as the official one) is refused by this kubelet under the same pod
    security, so the gpupool image passed `runAsNonRoot` by its own USER."""
    name = "root-image"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"nodeName": image_node.node.name, "restartPolicy": "Never", "securityContext": POD_SECURITY,
                    "tolerations": [{"operator": "Exists"}], "automountServiceAccountToken": False,
                    "containers": [{"name": "main", "image": image_node.scheduler_image, "imagePullPolicy": "Never",
                                    "command": ["kube-scheduler", "--version"],
                                    "securityContext": CONTAINER_SECURITY}]}}
    image_node.bed.admin_request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"

    def refused() -> str | None:
        statuses = (image_node.bed.admin_request("GET", path).get("status") or {}).get("containerStatuses") or []
        waiting = ((statuses[0].get("state") or {}).get("waiting") or {}) if statuses else {}
        return waiting.get("message") if waiting.get("reason") == "CreateContainerConfigError" else None

    message = wait_for(refused, 120, "the kubelet to refuse an image that runs as root under runAsNonRoot")
    assert "run as root" in message or "non-root" in message, message


def test_the_kube_scheduler_image_runs_the_testbeds_kube_scheduler(image_node: ImageNode) -> None:
    """registry.k8s.io/kube-scheduler:<version>, as the chart runs it: `kube-scheduler` found on PATH, uid
    65532 (the chart's), read-only root."""
    status, log = image_node.run_pod(
        "kube-scheduler-version", image_node.scheduler_image, {"command": ["kube-scheduler", "--version"]},
        pod_security={**POD_SECURITY, "runAsUser": 65532, "runAsGroup": 65532})
    assert status["phase"] == "Succeeded", (status, log)
    assert log.strip() == f"Kubernetes {image_node.bed.server_version()}"
    assert image_node.scheduler_image == f"registry.k8s.io/kube-scheduler:{image_node.bed.server_version()}"
