"""Three vendors in one pool on real kubelets (issue 40): a node of fake NVIDIA cards (L40S), one of fake AMD
cards (MI300X) and one of fake Ascend cards (Ascend910B), each with `gpupool agent --backend fake` and the
file's `vendor:`. Pods created with kubectl say the runtime their image needs (`gpupool.io/runtime`): each lands
on a node whose cards run it, and its container holds what that vendor's node hands out (read back from the
container's environment): NVIDIA_VISIBLE_DEVICES on NVIDIA; on AMD and Ascend the fake's environment-only
devices (GPUPOOL_FAKE_DEVICE_NODES, ASCEND_VISIBLE_DEVICES; the testbed host has no /dev/kfd or /dev/davinci*)
and no NVIDIA variable. A `rocm` pod that names an Ascend model stays unschedulable with the reason.

AMD hook shares (when the package carries libgpupool_hip.so): each share's container reads, from inside, its
limits file (its memory cap) and its cu_masks.v1 (exactly the CUs gpupool.core.cu_masks gives it: consecutive
mask bits from 0 on an otherwise empty MI300X, disjoint from the other share's on a shared card).

Not here: carving AMD partitions / Ascend vNPUs for claims (the fake backend has no partition library; the
agents over the fake vendor libraries carve them in test_e2e_vendor_partitions.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.api.pod import ANN_RUNTIME
from gpupool.hook import hip_library_path
from tests.e2e.conftest import Extender, Identities
from tests.e2e.kubectl_tool import kubectl_binary
from tests.e2e.real_node_fixtures import (
    NAMESPACE,
    SPLIT,
    NodeAgent,
    RealCluster,
    _ensure_tools,
    describe_pod,
    parse_grant,
    realnode,  # scripts/k8s/realnode.py, which real_node_fixtures puts on the path
    wait_for,
)
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e
Obj = dict[str, Any]
CARDS = 2  # per node
# node index -> (vendor, model, MiB as the vendor library reports it)
VENDORS = {0: ("nvidia", "L40S", 46068), 1: ("amd", "MI300X", 196_592), 2: ("ascend", "Ascend910B", 65_536)}
# Prints the container's grant (its variables, then the mount points gpupool added), then waits to be stopped.
PRINT_GRANT = ["sh", "-c", "env | grep -E '^(NVIDIA_|GPUPOOL_|ASCEND_)' | sort | sed 's/^/env /'; "
               "awk '$5 ~ \"^/run/gpupool\" || $5 ~ \"^/usr/local/lib/gpupool\" || $5 == \"/etc/ld.so.preload\" "
               "{print \"mount \" $5}' /proc/self/mountinfo | sort; exec sleep 1000000"]
HOOK_MOUNTS = {"/etc/ld.so.preload", "/run/gpupool/hook", "/run/gpupool/limits"}
ASCEND_SHARED = "/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"
CUDA_LIBRARY = "/usr/local/lib/gpupool/libgpupool_hook.so"
HIP_LIBRARY = "/usr/local/lib/gpupool/libgpupool_hip.so"
SHARE_MIB = 65536  # a third of an MI300X
MI300X_CUS = 304  # the catalogue's (the fake file gives no sm_count)
CU_MASKS = "/run/gpupool/limits/cu_masks.v1"


@dataclass
class VendorAgent(NodeAgent):
    """`gpupool agent --backend fake` whose file describes one vendor's cards (no MPS daemons: none serve here)."""

    vendor: str = "nvidia"
    model: str = "L40S"
    memory_mib: int = 46068

    @property
    def gpu_uuids(self) -> list[str]:
        return [f"{self.vendor}-{self.node.name.replace('.', '-')}-{i}" for i in range(CARDS)]

    def start(self) -> None:
        gpus = [{"uuid": u, "model": self.model, "memory_mib": self.memory_mib} for u in self.gpu_uuids]
        self.fake_file.write_text(json.dumps({"vendor": self.vendor, "gpus": gpus}))
        argv = [*tb.gpupool_argv(), "agent", "--node-name", self.node.name, "--backend", "fake",
                "--fake-file", str(self.fake_file), "--split", str(SPLIT),
                "--device-plugin-dir", str(self.node.device_plugin_dir), "--kubeconfig", str(self.kubeconfig),
                "--inventory-interval-s", "2"]
        env = {**os.environ, "GPUPOOL_AGENT_HOOK_ROOT": str(self.hook_root), "GPUPOOL_AGENT_WATCHDOG": "false"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=tb.die_with_parent)
        self.starts += 1


@pytest.fixture(scope="module")
def cluster(testbed: tb.Testbed, extender: Extender, kube_scheduler: object,
            identities: Identities) -> Iterator[RealCluster]:
    _ensure_tools()
    nodes = realnode.RealNodes(testbed, len(VENDORS), keep=os.environ.get("GPUPOOL_E2E_KEEP") == "1", taint=True)
    try:
        nodes.start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    real = RealCluster(testbed, extender, nodes, kubectl_path=kubectl_binary())
    try:
        testbed.tenant_namespace(NAMESPACE)
        for i, node in enumerate(nodes.nodes):
            vendor, model, mib = VENDORS[i]
            started = VendorAgent(node, identities.agent, tb.free_port(), vendor=vendor, model=model, memory_mib=mib)
            real.agents[node.name] = started
            started.start()
        for i, node in enumerate(nodes.nodes):
            wait_for(lambda i=i: real.gpu_slots(i) == CARDS * SPLIT, 90,  # type: ignore[misc]
                     f"node {node.name} advertising {CARDS * SPLIT} slots", real.agents[node.name].tail)
        yield real
    finally:
        pods = [p["metadata"]["name"] for p in real.pods()]
        if pods:
            real.delete_pods(pods, force=True)
        for agent in real.agents.values():
            agent.stop()
        nodes.stop()


def pod(name: str, runtime: str, tag: str, annotations: dict[str, str] | None = None,
        limits: dict[str, str] | None = None) -> Obj:
    """A one-card pod that asks for its runtime, may go to any of this module's nodes (their label and taint),
    and prints what it was handed."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"e2e/real": "1"},
                     "annotations": {ANN_RUNTIME: runtime, **(annotations or {})}},
        "spec": {
            "schedulerName": "gpupool-scheduler", "terminationGracePeriodSeconds": 1, "enableServiceLinks": False,
            "nodeSelector": {realnode.REAL_NODE_LABEL: tag},
            "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": realnode.images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": PRINT_GRANT,
                            "resources": {"limits": {RESOURCE_GPU: "1", **(limits or {})}}}],
        },
    }


def expected_grant(vendor: str, uuid: str, index: int, memory_mib: int, cores: int,
                   isolation: str) -> tuple[dict[str, str], set[str]]:
    """What the container of a card must hold, from the agent's documented contract (docs/agent.md, "Other
    vendors' cards"): NVIDIA's variable on NVIDIA; the fake's would-be nodes elsewhere; on AMD the HIP memory
    cap in place of the CUDA library when the package carries it, else a whole card is served as `none`."""
    env = {"GPUPOOL_MEMORY_LIMIT_MIB": str(memory_mib), "GPUPOOL_CORES_PERCENT": str(cores)}
    hook = {"GPUPOOL_ISOLATION": "hook", "GPUPOOL_HOOK_DIR": "/run/gpupool/hook", "GPUPOOL_CORES_MODE": "hard"}
    if vendor == "nvidia":
        assert isolation == "hook"
        return {**env, **hook, "NVIDIA_VISIBLE_DEVICES": uuid}, {*HOOK_MOUNTS, CUDA_LIBRARY}
    if vendor == "amd":
        env["GPUPOOL_FAKE_DEVICE_NODES"] = f"/dev/kfd,/dev/dri/renderD{128 + index}"
        if hip_library_path().is_file():
            return {**env, **hook}, {*HOOK_MOUNTS, HIP_LIBRARY}
        return {**env, "GPUPOOL_ISOLATION": "none"}, set()
    # Ascend: whole cards only, so nothing is held and no library is loaded
    return ({**env, "GPUPOOL_ISOLATION": "none", "ASCEND_VISIBLE_DEVICES": str(index),
             "GPUPOOL_FAKE_DEVICE_NODES": f"/dev/davinci{index},{ASCEND_SHARED}"}, set())


def cu_mask_seen(cluster: RealCluster, pod: str) -> tuple[int, frozenset[int]]:
    """What the container reads from its cu_masks.v1 (hookdir's layout: u64 magic, u32 version, u32 devices,
    then per device u32 CUs, u32 reserved, u32 bits[32]): its first card's CU count and the CUs it may use."""
    words = [int(w) for w in cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "main", "--", "od", "-v", "-A", "n",
                                             "-t", "u4", "-N", str(16 + 136), CU_MASKS).split()]
    assert words[2:4] == [1, 1], words[:6]  # version 1, one device
    ncu, bits = words[4], words[6:38]
    return ncu, frozenset(32 * w + b for w, word in enumerate(bits) for b in range(32) if word >> b & 1)


def test_each_runtime_lands_on_its_vendor_and_gets_that_vendors_devices(cluster: RealCluster) -> None:
    tag = cluster.nodes.nodes[0].labels[realnode.REAL_NODE_LABEL]
    vendor_of_node = {n.name: VENDORS[i] for i, n in enumerate(cluster.nodes.nodes)}
    wanted = {"cuda": "nvidia", "rocm": "amd", "cann": "ascend"}
    pods = [pod(f"p-{runtime}", runtime, tag) for runtime in (*wanted, "any")]
    shares = hip_library_path().is_file()
    if shares:  # two AMD shares held by the HIP library: memory cap and CU mask
        pods.append(pod("p-rocm-share", "rocm", tag, limits={RESOURCE_MEMORY: str(SHARE_MIB), RESOURCE_CORES: "50"}))
        pods.append(pod("p-rocm-quarter", "rocm", tag,
                        limits={RESOURCE_MEMORY: str(SHARE_MIB // 2), RESOURCE_CORES: "25"}))
    # a ROCm image asking for an Ascend card: no node can run it
    wrong = pod("p-rocm-on-ascend", "rocm", tag, {"gpupool.io/gpu-model": "Ascend910B"})
    cluster.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                             "items": [*pods, wrong]}))
    running = {p["metadata"]["name"]: p for p in cluster.wait_running([p["metadata"]["name"] for p in pods])}
    for name, got in running.items():
        runtime = name.split("-")[1]
        vendor, model, mib = vendor_of_node[got["spec"]["nodeName"]]
        assert runtime == "any" or vendor == wanted[runtime], f"{name} on {vendor}: {describe_pod(got)}"
        doc = decode_allocation(got["metadata"]["annotations"][ANN_ALLOCATION])
        [card] = doc.gpus
        agent = cluster.agents[got["spec"]["nodeName"]]
        assert card.uuid in agent.gpu_uuids  # the granted card is one of that node's (that vendor's) cards
        index = agent.gpu_uuids.index(card.uuid)
        grant = parse_grant(cluster.kubectl("logs", "-n", NAMESPACE, name))
        assert grant == expected_grant(vendor, card.uuid, index, card.memory_mib, int(card.cores),
                                       doc.isolation or "hook"), name
        if name == "p-rocm-share":  # the limits file the HIP cap reads: exactly the share's memory
            assert card.memory_mib == SHARE_MIB and cluster.limits_seen(name)[0] == SHARE_MIB
    if shares:
        check_cu_masks(cluster, running)

    def unschedulable() -> str:
        got = cluster.pod("p-rocm-on-ascend") or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        return next((str(c.get("message")) for c in conditions
                     if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"), "")

    message = wait_for(unschedulable, 60, "the rocm pod naming an Ascend model marked unschedulable")
    # the AMD node has no Ascend910B; the NVIDIA and Ascend nodes have no card that runs rocm
    assert "1 no GPU of an allowed model" in message and "2 needs 1 GPU(s) that run rocm" in message, message
    still = cluster.pod("p-rocm-on-ascend")
    assert still is not None and not still["spec"].get("nodeName"), describe_pod(still)


def check_cu_masks(cluster: RealCluster, running: dict[str, Obj]) -> None:
    """Each AMD share's container holds exactly its CUs: floor(p x 304 / 100) of them (50 % = 152, 25 % = 76).
    Alone on a card, a share gets the lowest bits (KFD spreads those evenly over the XCCs and engines). On one
    card the two are disjoint and together the lowest 228 bits, whichever was prepared first: bits 0-151 then
    152-227, or 0-75 then 76-227 (tests/core/test_cu_masks.py works such sequences out by hand)."""
    seen = {name: cu_mask_seen(cluster, name) for name in ("p-rocm-share", "p-rocm-quarter")}
    assert {ncu for ncu, _ in seen.values()} == {MI300X_CUS}, seen
    half, quarter = seen["p-rocm-share"][1], seen["p-rocm-quarter"][1]
    assert (len(half), len(quarter)) == (152, 76)
    card = {name: decode_allocation(running[name]["metadata"]["annotations"][ANN_ALLOCATION]).gpus[0].uuid
            for name in seen}
    if card["p-rocm-share"] != card["p-rocm-quarter"]:
        assert half == frozenset(range(152)) and quarter == frozenset(range(76))
        return
    assert not half & quarter and half | quarter == frozenset(range(228))
    for got in (half, quarter):  # each a run of consecutive bits
        assert got == frozenset(range(min(got), max(got) + 1)), sorted(got)
