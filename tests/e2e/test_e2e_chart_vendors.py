"""Three vendors served by the chart's own pods (issue 40): `helm install` with `agent.vendors: [nvidia, amd,
ascend]` on three real nodes (test_e2e_chart_pods.py's control plane that serves pods, the images of
scripts/image), each vendor's DaemonSet on fake cards of its vendor (`agent.backend`, `agent.amd.backend`,
`agent.ascend.backend: fake`, each with its own fake-card document): node 0 NVIDIA (three L40S, the testbed's
usual cards), node 1 AMD (two MI300X), node 2 Ascend (two Ascend910B), told apart as an administrator does,
by the vendor label (`gpupool.io/gpu-vendor=amd|ascend`; the NVIDIA node needs none).

Checked: each DaemonSet's one pod runs on its vendor's node and nowhere else; each node's inventory
annotation and ResourceSlice list exactly its vendor's cards; a `cuda`, a `rocm`, a `cann` and an `any` pod
(gpupool.io/runtime), written as a tenant writes them (no schedulerName: the webhook pod sets it), are placed
by the chart's scheduler pod on a node whose cards run them and start with that vendor's environment
(NVIDIA_VISIBLE_DEVICES on NVIDIA; the fake's would-be device nodes and ASCEND_VISIBLE_DEVICES elsewhere: the
testbed host has no /dev/kfd or /dev/davinci*); `gpupool doctor` passes the release. And what a device node
needs to be opened by a container with the agent's security settings as the chart renders them (uid 0, no
capabilities, not privileged): a node owned by another group (as Ascend's HwHiAiUser owns its nodes) opens
only with that group in supplementalGroups (agent.ascend.supplementalGroups), and a node the container's
allowed devices lack is refused even to its owner, which is why the chart takes the vendors' device nodes
from their container runtimes (agent.amd/ascend.runtimeClassName) rather than relying on hostPath mounts.

Not here: real AMD or Ascend libraries (the fake backend stands for the cards; test_e2e_vendor_partitions.py
runs the agents over the fake vendor libraries, outside the chart) and the vendors' container runtimes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY, ANN_RUNTIME
from tests.e2e.conftest import ROOT
from tests.e2e.real_node_fixtures import parse_grant, wait_for
from tests.e2e.test_e2e_chart_pods import Cluster, chart_cluster
from tests.harness import testbed as tb

sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import realnode  # noqa: E402
import release  # noqa: E402

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "cv", "gpupool-cv", "e2e-chart-vendors-tenant"
VENDOR_LABEL = "gpupool.io/gpu-vendor"  # the chart's agent.vendorNodes.label
VENDORS = ("nvidia", "amd", "ascend")  # node i is VENDORS[i]'s
COMPONENT = {"nvidia": "agent", "amd": "agent-amd", "ascend": "agent-ascend"}
# AMD's and Ascend's fake cards: two per node, UUIDs naming the node ({node}), as the vendor library reports them
FAKE = {"amd": ("amd-{node}", "MI300X", 196_592), "ascend": ("npu-{node}", "Ascend910B", 65_536)}
CARDS = {"nvidia": release.FAKE_GPU_COUNT, "amd": 2, "ascend": 2}
SPLIT = 10  # the chart's splitCount
RUNTIME_VENDOR = {"cuda": "nvidia", "rocm": "amd", "cann": "ascend"}
ASCEND_SHARED = "/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"
# The container's vendor variables (the testbed's /gpupool/grant prints NVIDIA_ and GPUPOOL_ ones only)
PRINT_VENDOR_ENV = ["sh", "-c", "env | grep -E '^(NVIDIA_|GPUPOOL_|ASCEND_|AMD_)' | sort | sed 's/^/env /'; "
                    "exec sleep 1000000"]
Obj = dict[str, Any]


def fake_cards(vendor: str) -> Obj:
    prefix, model, mib = FAKE[vendor]
    return {"gpus": [{"count": CARDS[vendor], "uuid_prefix": prefix, "model": model, "memory_mib": mib}]}


def expected_cards(vendor: str, node: str) -> list[tuple[str, str]]:
    """(uuid, model) of a node's cards, from the documents this module hands the chart."""
    if vendor == "nvidia":
        return [(g["uuid"].replace("{node}", node), g["model"]) for g in release.FAKE_GPUS["gpus"]]
    prefix, model, _ = FAKE[vendor]
    return [(f"{prefix.replace('{node}', node)}-{i}", model) for i in range(CARDS[vendor])]


class VendorRelease(release.ChartRelease):
    """The chart with every vendor's DaemonSet on fake cards, and the nodes labelled by vendor."""

    def testbed_values(self) -> list[str]:
        return [*super().testbed_values(), "--set-json", f"agent.vendors={json.dumps(list(VENDORS))}",
                "--set", "agent.amd.backend=fake", "--set-json", f"agent.amd.fakeGpus={json.dumps(fake_cards('amd'))}",
                "--set", "agent.ascend.backend=fake",
                "--set-json", f"agent.ascend.fakeGpus={json.dumps(fake_cards('ascend'))}"]

    def label_nodes(self) -> None:
        super().label_nodes()
        for vendor, node in zip(VENDORS, self.nodes.nodes, strict=True):
            if vendor != "nvidia":  # an NVIDIA node needs no vendor label
                realnode.api_request(self.bed, "PATCH", f"/api/v1/nodes/{node.name}",
                                     {"metadata": {"labels": {VENDOR_LABEL: vendor}}})

    def not_ready(self) -> list[str]:
        """ChartRelease's, with each vendor's DaemonSet Ready on exactly one node (its vendor's)."""
        out = [p for p in super().not_ready() if not p.startswith("daemonset agent:")]
        for vendor in VENDORS:
            ds = self._get(f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.fullname}-"
                           f"{COMPONENT[vendor]}").get("status") or {}
            if ds.get("numberReady", 0) != 1 or ds.get("desiredNumberScheduled") != 1:
                out.append(f"daemonset {COMPONENT[vendor]}: {ds.get('numberReady', 0)}/"
                           f"{ds.get('desiredNumberScheduled', 0)} ready, want 1")
        return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """test_e2e_chart_pods.chart_cluster's, with a node per vendor and the vendors' release, installed and Ready."""
    with chart_cluster(RELEASE, NAMESPACE, install=True, node_count=len(VENDORS), chart=VendorRelease) as c:
        c.bed.tenant_namespace(TENANT)
        yield c


def vendor_of(c: Cluster) -> dict[str, str]:
    return {n.name: v for v, n in zip(VENDORS, c.nodes.nodes, strict=True)}


def test_each_vendors_agent_runs_on_its_node_and_publishes_its_cards(cluster: Cluster) -> None:
    c, rel = cluster, cluster.release
    vendors = vendor_of(c)
    # each DaemonSet's one pod on its vendor's node, and no pod of it elsewhere
    placed = {(p["metadata"]["labels"]["app.kubernetes.io/component"], p["spec"].get("nodeName"))
              for p in rel.pods() if p["metadata"]["labels"]["app.kubernetes.io/component"].startswith("agent")}
    assert placed == {(COMPONENT[v], n) for n, v in vendors.items()}, rel.describe_pods()
    for name, vendor in vendors.items():
        # the inventory the agent wrote (what the scheduler and webhook read): this vendor's cards only
        node = realnode.api_request(c.bed, "GET", f"/api/v1/nodes/{name}") or {}
        inventory = decode_inventory(node["metadata"]["annotations"][ANN_INVENTORY])
        assert sorted((g.uuid, g.model) for g in inventory.gpus) == expected_cards(vendor, name), name
        assert {g.vendor for g in inventory.gpus} == {vendor}, name
        assert release.gpu_slots(c.bed, name) == CARDS[vendor] * SPLIT, name
    # the ResourceSlice of each node (DRA): the same cards
    slices = realnode.api_request(c.bed, "GET", "/apis/resource.k8s.io/v1/resourceslices"
                                  f"?fieldSelector=spec.driver={release.DRA_DRIVER}") or {}
    published: dict[str, list[tuple[str, str]]] = {}
    for s in slices.get("items") or []:
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes") or {}
            if attrs.get("type", {}).get("string") == "gpu":
                published.setdefault(s["spec"]["nodeName"], []).append(
                    (attrs["uuid"]["string"], attrs["model"]["string"]))
    assert {n: sorted(cards) for n, cards in published.items()} == {
        n: expected_cards(v, n) for n, v in vendors.items()}


def tenant_pod(runtime: str) -> Obj:
    """A one-card pod for `runtime`, as a tenant writes it (no schedulerName; the webhook sets it)."""
    pod = release.example_pod(f"p-{runtime}", TENANT)
    pod["metadata"]["annotations"] = {ANN_RUNTIME: runtime}
    main = pod["spec"]["containers"][0]
    main["command"] = PRINT_VENDOR_ENV
    main["resources"] = {"limits": {"gpupool.io/gpu": "1"}}  # a whole card: every vendor has them
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    return pod


def expected_env(vendor: str, uuid: str, index: int) -> dict[str, str]:
    """The vendor variables a whole card's container holds (docs/agent.md, "Other vendors' cards"): NVIDIA's
    variable on NVIDIA; on AMD and Ascend the fake's would-be device nodes and Ascend's own variable, and no
    NVIDIA_ variable."""
    if vendor == "nvidia":
        return {"NVIDIA_VISIBLE_DEVICES": uuid}
    if vendor == "amd":
        return {"GPUPOOL_FAKE_DEVICE_NODES": f"/dev/kfd,/dev/dri/renderD{128 + index}"}
    return {"ASCEND_VISIBLE_DEVICES": str(index), "GPUPOOL_FAKE_DEVICE_NODES": f"/dev/davinci{index},{ASCEND_SHARED}"}


def test_each_runtime_lands_on_a_node_that_runs_it_with_that_vendors_environment(cluster: Cluster) -> None:
    c = cluster
    vendors = vendor_of(c)
    runtimes = [*RUNTIME_VENDOR, "any"]
    for runtime in runtimes:
        created = c.kubectl("create", "-f", "-", stdin=json.dumps(tenant_pod(runtime)))
        assert created.returncode == 0, created.stderr

    def env_of(name: str) -> dict[str, str] | None:
        logs = c.kubectl("-n", TENANT, "logs", name)
        return parse_grant(logs.stdout)[0] if "GPUPOOL_" in logs.stdout else None

    for runtime in runtimes:
        name = f"p-{runtime}"
        def state(name: str = name) -> str:
            return c.kubectl("-n", TENANT, "get", "pod", name, "-o", "wide").stdout + c.release.describe_pods()

        env = wait_for(lambda name=name: env_of(name), 180, f"{name}'s environment", state)  # type: ignore[misc]
        pod: Obj = json.loads(c.kubectl("-n", TENANT, "get", "pod", name, "-o", "json").stdout)
        assert pod["spec"]["schedulerName"] == "gpupool-scheduler", name  # the webhook pod wrote it
        vendor = vendors[pod["spec"]["nodeName"]]
        assert runtime == "any" or vendor == RUNTIME_VENDOR[runtime], f"{name} on {vendor}'s node"
        [card] = decode_allocation(pod["metadata"]["annotations"][ANN_ALLOCATION]).gpus
        uuids = [u for u, _ in expected_cards(vendor, pod["spec"]["nodeName"])]
        assert card.uuid in uuids, (name, card.uuid)  # one of that node's (that vendor's) cards
        want = expected_env(vendor, card.uuid, uuids.index(card.uuid))
        assert {k: v for k, v in env.items() if k in want} == want, (name, env)
        if vendor != "nvidia":
            assert not [k for k in env if k.startswith("NVIDIA_")], (name, env)
    deleted = c.kubectl("-n", TENANT, "delete", "pod", *(f"p-{r}" for r in runtimes), "--wait=true")
    assert deleted.returncode == 0, deleted.stderr


def test_gpupool_doctor_passes_the_three_vendor_release(cluster: Cluster) -> None:
    c = cluster

    def run() -> tuple[int, Obj]:
        done = subprocess.run(
            [*tb.gpupool_argv(), "doctor", "--kubeconfig", str(c.bed.kubeconfig()), "-n", NAMESPACE,
             "--release", RELEASE, "--json"], capture_output=True, text=True, timeout=120, check=False)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout)

    def passes() -> Obj | None:
        rc, report = run()
        return report if rc == 0 and report["ok"] else None

    def failing() -> str:
        return json.dumps([f for f in run()[1]["findings"] if f["status"] == "fail"])

    report = wait_for(passes, 120, "a passing doctor", failing, step_s=2)
    # it looked at every node's agent, AMD's and Ascend's included
    subjects = " ".join(f["subject"] for f in report["findings"])
    assert all(n.name in subjects for n in c.nodes.nodes), report["findings"]


# --- device access as the chart runs the agent ------------------------------------------------------------
STANDIN_GROUP = 1000  # the group owning the stand-in, as HwHiAiUser (often 1000) owns Ascend's nodes
# Opens the node read-write (what the vendor libraries do) in a subshell (a failed redirection of a special
# built-in would end the shell itself) and says how that went, then waits.
TRY_OPEN = "exec 2>&1; if (: <> {path}); then echo OPEN-OK; else echo OPEN-REFUSED; fi; exec sleep 1000000"


def device_pod(ds: Obj, name: str, host_path: str, inside: str, groups: list[int] | None) -> Obj:
    """A pod with the agent container's and pod's security settings of DaemonSet `ds` (the chart's render),
    `host_path` mounted as the chart mounts a vendor's device node, on node 0, in the release's namespace
    (where the agent runs; tenants' namespaces forbid hostPath)."""
    template = ds["spec"]["template"]["spec"]
    pod_sc = dict(template.get("securityContext") or {})
    if groups is not None:
        pod_sc["supplementalGroups"] = groups
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": "", "terminationGracePeriodSeconds": 1, "restartPolicy": "Never", "securityContext": pod_sc,
            "containers": [{"name": "main", "image": realnode.images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", TRY_OPEN.format(path=inside)],
                            "securityContext": template["containers"][0]["securityContext"],
                            "volumeMounts": [{"name": "dev", "mountPath": inside}]}],
            "volumes": [{"name": "dev", "hostPath": {"path": host_path, "type": "CharDevice"}}],
        },
    }


def test_a_device_node_opens_for_the_agent_only_through_its_group_and_its_allowed_devices(
        cluster: Cluster) -> None:
    c = cluster
    assert c.nodes.root is not None
    # A stand-in for /dev/davinci0: /dev/null's numbers (every container's allowed devices have it), owned
    # by another group, mode 0660 (Ascend's driver makes its nodes HwHiAiUser:HwHiAiUser 0660).
    standin = c.nodes.root / "davinci0-standin"
    os.mknod(standin, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
    os.chown(standin, STANDIN_GROUP, STANDIN_GROUP)
    os.chmod(standin, 0o660)  # mknod's mode is masked by the umask
    ds = json.loads(c.kubectl("-n", NAMESPACE, "get", "daemonset", f"{c.release.fullname}-agent-ascend",
                              "-o", "json").stdout)
    sc = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged"), sc
    pods = [device_pod(ds, "dev-no-group", str(standin), "/dev/davinci0", None),
            device_pod(ds, "dev-group", str(standin), "/dev/davinci0", [STANDIN_GROUP])]
    expected = {"dev-no-group": "OPEN-REFUSED", "dev-group": "OPEN-OK"}
    # A node the container's allowed devices lack: root's own, so only the device cgroup refuses it
    # (/dev/loop-control, 10:237, root:disk 0660 on this host; mounted where AMD SMI opens /dev/kfd).
    loop = Path("/dev/loop-control")
    if loop.exists() and loop.stat().st_uid == 0 and stat.S_ISCHR(loop.stat().st_mode):
        pods.append(device_pod(ds, "dev-not-allowed", str(loop), "/dev/kfd", None))
        expected["dev-not-allowed"] = "OPEN-REFUSED"
    node = c.nodes.nodes[0].name
    for pod in pods:
        pod["spec"]["nodeName"] = node
        created = c.kubectl("create", "-f", "-", stdin=json.dumps(pod))
        assert created.returncode == 0, created.stderr

    def said(name: str) -> str:
        out = c.kubectl("-n", NAMESPACE, "logs", name).stdout
        return out if "OPEN-" in out else ""

    try:
        for name, want in expected.items():
            def state(name: str = name) -> str:
                got = c.kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "json")
                status = (json.loads(got.stdout).get("status") or {}) if got.returncode == 0 else got.stderr
                events = c.kubectl("-n", NAMESPACE, "get", "events", "--field-selector",
                                   f"involvedObject.name={name}", "-o", "custom-columns=R:.reason,M:.message")
                return f"{name}: {json.dumps(status)}\n{events.stdout}"

            out = wait_for(lambda name=name: said(name), 120, f"{name} trying its device node",  # type: ignore[misc]
                           state)
            assert want in out, (name, out)
            if name == "dev-no-group":
                assert "Permission denied" in out, out  # the file's mode: EACCES
            if name == "dev-not-allowed":
                assert "Operation not permitted" in out, out  # the device cgroup: EPERM, owner or not
    finally:
        c.kubectl("-n", NAMESPACE, "delete", "pod", *expected, "--grace-period=1", "--wait=true")
        standin.unlink()
