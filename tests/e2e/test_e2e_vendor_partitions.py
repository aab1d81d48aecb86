"""AMD partitions and Ascend vNPUs carved for claims on real kubelets (issue 40): a node whose agent runs
`--backend amdsmi --dra` (the real amdsmi binding over the fake libamd_smi.so, two MI300X) and a node whose
agent runs `--backend dcmi --dra` (the fake libdcmi.so, two Ascend 910B chips), both labelled
gpupool.io/mig-mode-switch=allowed, so each card is published as its partitions. A tenant's pod uses a
ResourceClaimTemplate of the MIG class naming a profile (docs/claims.md: `CPX/NPS4`, `vir08`); gpupool's
allocator places the claim (the pod carries the webhook's scheduling gate), kube-scheduler binds it, kubelet
asks the agent to prepare it, the agent carves the partition (the fake library's state file shows it) and
containerd starts the container from the agent's CDI spec: what the container sees from inside is that
partition's devices and environment only. Deleting the pod releases the partition (the agent's claim
checkpoint empties, the idle partition is destroyed in the fake library's state).

The device nodes the vendors hand out do not exist on the testbed host, and containerd refuses a CDI device
node whose host path is missing: each node gets stand-ins (character devices 1:3) inside its own mount
namespace only (realnode.RealNode.stand_in_devices), so the host's /dev is never touched.

The chart's identities, rules and DeviceClasses, the claim helpers and the plain kube-scheduler are
tests/e2e/test_e2e_dra.py's (release `gpd`, namespace e2e-dra).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.devices.mig import MODE_SWITCH_LABEL
from gpupool.api.dra import DRIVER
from tests.agent.fakes import ascend as dcmi_fake
from tests.agent.fakes.amd import amd_fake
from tests.e2e.conftest import Extender
from tests.e2e.kubectl_tool import kubectl_binary
from tests.e2e.real_node_fixtures import realnode, wait_for
from tests.e2e.test_e2e_dra import (
    AGENT_ACCOUNT,
    MANAGER,
    RELEASE_NAMESPACE,
    DraAgent,
    DraCluster,
    allocation_writers,
    chart_objects,
    claim_allocator,
    claim_template,
    dra_cluster,
    gated_pod,
    scheduler_config,
    stop_dra_cluster,
)
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e
Obj = dict[str, Any]
CARDS = 2  # per node
AMD_NODE, ASCEND_NODE = 0, 1
MIG_CLASS = f"mig.{DRIVER}"
# Prints the container's vendor variables, then the character devices it holds of the vendors' kinds.
PRINT_GRANT = ["sh", "-c", "env | grep -E '^(ASCEND_|GPUPOOL_|NVIDIA_)' | sort | sed 's/^/env /'; "
               "for f in /dev/kfd /dev/dri/* /dev/davinci* /dev/vdavinci* /dev/devmm_svm /dev/hisi_hdc; do "
               "[ -c \"$f\" ] && echo \"dev $f\"; done; exec sleep 1000000"]
ASCEND_SHARED = {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}


def amd_render(card: int, xcc: int) -> str:
    """The render node of partition `xcc` of card `card` as the fake reports it (128 + 8 per card, + XCC)."""
    return f"/dev/dri/renderD{128 + 8 * card + xcc}"


def vnpu_id(chip: int, slot: int) -> int:
    """DCMI's vNPU id: 100 + 16 per physical chip + the vNPU index (fake_dcmi.c's id_base)."""
    return 100 + 16 * chip + slot


@dataclass
class VendorDraAgent(DraAgent):
    """`gpupool agent --dra` over a vendor's real backend (`amdsmi`, `dcmi`) and that vendor's fake library:
    `library_env` says where the library is and its state file."""

    backend: str = "amdsmi"
    library_env: dict[str, str] = field(default_factory=dict)
    state: Path = Path()

    def start(self, broken: tuple[int, ...] = (), mig: tuple[int, ...] = (), serve: str | None = None) -> None:
        argv = [*tb.gpupool_argv(), "agent", "--node-name", self.node.name, "--backend", self.backend, "--dra",
                "--kubelet-root", str(self.node.kubelet_root), "--cdi-dir", str(self.cdi_dir),
                "--device-plugin-dir", str(self.node.device_plugin_dir), "--no-device-plugin-with-dra",
                "--kubeconfig", str(self.kubeconfig), "--inventory-interval-s", "2", "--log-level", "info"]
        # Idle partitions are destroyed a second after their claim is gone (the release checked here); the
        # watchdog reads NVML, which these nodes do not have.
        env = {"GPUPOOL_AGENT_HOOK_ROOT": str(self.hook_root),
               "GPUPOOL_AGENT_CHECKPOINT_DIR": str(self.checkpoint_file.parent),
               "GPUPOOL_AGENT_MIG_INTERVAL_S": "1", "GPUPOOL_AGENT_MIG_IDLE_AFTER_S": "1",
               "GPUPOOL_AGENT_WATCHDOG": "false", **self.library_env}
        self.proc = tb.spawn(f"agent@{self.node.name}", argv, self.log, env).popen


def partitions_published(c: DraCluster, i: int) -> bool:
    """Node i publishes its cards as partitions: partition devices (named gpu-<i>-<profile>-<start>) and
    the counter sets they consume, in slices of their own."""
    items = (c.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
    mine = [s for s in items if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == c.node(i).name]
    names = [d["name"] for s in mine for d in s["spec"].get("devices") or []]
    counters = [x for s in mine for x in s["spec"].get("sharedCounters") or []]
    return bool(names) and all(n.count("-") >= 2 for n in names) and len(counters) == CARDS


def host_dev() -> set[str]:
    return {str(p) for p in Path("/dev").rglob("*") if not str(p).startswith(("/dev/pts/", "/dev/shm/"))}


HOST_DEV_BEFORE: list[set[str]] = []  # the host's /dev before the stand-ins were made


def start_cluster(bed: tb.Testbed, keep: bool) -> DraCluster:
    objects = chart_objects(bed.server_version())
    bed.ensure("/api/v1/namespaces", {"metadata": {"name": RELEASE_NAMESPACE}})
    # read by the agents at their start: the node lets them partition idle cards
    nodes = realnode.RealNodes(bed, 2, labels={MODE_SWITCH_LABEL: "allowed"}, keep=keep, taint=True)
    c = DraCluster(bed, nodes, objects, kubectl_path=kubectl_binary())
    try:
        c.apply(objects)
        nodes.start()
        bed.tenant_namespace("e2e-dra")
        amd, ascend = nodes.nodes
        rocm = amd.dir / "rocm"
        amd_fake.build(rocm)
        amd_state = amd_fake.write_state(amd.dir / "amdsmi.json", [amd_fake.card("MI300X", i) for i in range(CARDS)])
        dcmi_dir = ascend.dir / "dcmi"
        dcmi_dir.mkdir(exist_ok=True)
        library = dcmi_fake.build(dcmi_dir)
        dcmi_state = dcmi_fake.write_state(ascend.dir / "dcmi.json", [{"card_id": i, "chips": [dcmi_fake.card_910b(i)]}
                                                                      for i in range(CARDS)])
        for node, backend, env, state in (
                (amd, "amdsmi", {"ROCM_PATH": str(rocm), amd_fake.STATE_ENV: str(amd_state)}, amd_state),
                (ascend, "dcmi", {"GPUPOOL_DCMI_LIBRARY": str(library), dcmi_fake.STATE_ENV: str(dcmi_state)},
                 dcmi_state)):
            kubeconfig = bed.service_account_kubeconfig(RELEASE_NAMESPACE, AGENT_ACCOUNT, node=node.name)
            started = VendorDraAgent(node, kubeconfig, gpus=CARDS, device_plugin=False, backend=backend,
                                   library_env=env, state=state)
            c.agents.append(started)
            started.start()
        HOST_DEV_BEFORE[:] = [host_dev()]
        # every device node either agent may hand out, present in the node's own mount namespace only
        amd.stand_in_devices(["/dev/kfd", *(amd_render(card, x) for card in range(CARDS) for x in range(8))])
        ascend.stand_in_devices([*sorted(ASCEND_SHARED), *(f"/dev/davinci{chip}" for chip in range(CARDS)),
                                 *(f"/dev/vdavinci{vnpu_id(chip, s)}" for chip in range(CARDS) for s in range(16))])
        bed.start_scheduler(scheduler_config(), name="kube-scheduler-dra")
        for i, agent in enumerate(c.agents):
            wait_for(lambda a=agent: a.registrations() >= 1, 90,  # type: ignore[misc]
                     f"agent {agent.node.name} registered", agent.tail)
            wait_for(lambda i=i: partitions_published(c, i), 90, f"partition slices of {agent.node.name}",  # type: ignore[misc]
                     agent.tail)
    except BaseException:
        stop_dra_cluster(c)
        raise
    return c


@pytest.fixture(scope="module")
def parts(testbed: tb.Testbed) -> Iterator[DraCluster]:
    with dra_cluster(testbed, start_cluster) as c:
        yield c


@pytest.fixture(scope="module")
def allocator(parts: DraCluster) -> Iterator[Extender]:
    """`gpupool scheduler` placing the claims of gated pods, as in test_e2e_dra.py."""
    with claim_allocator(parts, "gpupool-scheduler-parts.log") as ext:
        yield ext


def seen(c: DraCluster, pod: str) -> tuple[dict[str, str], set[str]]:
    """The container's vendor variables and the device nodes it holds, as it printed them."""
    env: dict[str, str] = {}
    devices: set[str] = set()
    for line in c.kubectl("logs", "-n", "e2e-dra", pod).stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "env":
            key, _, value = rest.partition("=")
            env[key] = value
        elif kind == "dev":
            devices.add(rest)
    return env, devices


def run_claim(c: DraCluster, allocator: Extender, name: str, profile: str) -> tuple[Obj, Obj, str]:
    """A gated pod whose claim (from its template) names `profile`; returns the running pod, its claim and
    the partition device allocated."""
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    c.apply([claim_template(name, device_class=MIG_CLASS, selector=selector),
             gated_pod(name, template=name, command=PRINT_GRANT)])
    try:
        (pod,) = c.wait_running([name])
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- gpupool scheduler:\n{allocator.tail()}") from None
    claim_obj = c.pod_claim(pod)
    assert allocation_writers(claim_obj) == {MANAGER}, claim_obj["metadata"].get("managedFields")
    (result,) = claim_obj["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, pod["spec"]["nodeName"]), result
    return pod, claim_obj, str(result["device"])


def release(c: DraCluster, names: list[str], agent: DraAgent) -> None:
    """Delete the pods (their claims go with them): the agent unprepares the claims (its checkpoint empties)."""
    c.delete_pods(names)
    wait_for(lambda: not any(c.pod(n) for n in names), 90, f"{names} deleted")
    wait_for(lambda: not c.claims(), 90, "the pods' claims deleted")
    wait_for(lambda: not agent.prepared(), 90, "the claims unprepared", agent.tail)


@pytest.fixture(autouse=True)
def nothing_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "parts" in request.fixturenames:
        request.getfixturevalue("parts").clear()


def test_cpx_nps4_claims_get_their_partitions_render_nodes_on_one_card_and_release_them(
        parts: DraCluster, allocator: Extender) -> None:
    """Two CPX/NPS4 claims: the first cuts an idle MI300X into eight partitions, the second takes another of
    that card's partitions (docs/claims.md: a CPX/NPS4 claim lands on a card already in CPX/NPS4) and the other
    card stays whole; each container holds /dev/kfd and its own partition's render node only."""
    c = parts
    agent = c.agents[AMD_NODE]
    assert isinstance(agent, VendorDraAgent)
    held: list[tuple[int, int]] = []
    for name in ("amd-cpx", "amd-cpx-2"):
        pod, claim_obj, device = run_claim(c, allocator, name, "CPX/NPS4")
        assert pod["spec"]["nodeName"] == c.node(AMD_NODE).name  # only the AMD node publishes CPX/NPS4
        match = re.fullmatch(r"gpu-(\d)-cpx-nps4-(\d)", device)
        assert match, device
        card, xcc = int(match[1]), int(match[2])
        held.append((card, xcc))
        state = amd_fake.read_state(agent.state)["cards"]
        assert (state[card]["compute"], state[card]["memory"]) == ("CPX", "NPS4"), state  # carved at prepare
        assert claim_obj["metadata"]["uid"] in agent.prepared()
        env, devices = seen(c, name)
        # the partition's own render node and /dev/kfd, none of the card's seven other partitions'
        assert devices == {"/dev/kfd", amd_render(card, xcc)}, devices
        # 196,592 MiB over 8 partitions, rounded down; 38 of the card's 304 CUs = 12.5 %
        assert {k: env.get(k) for k in ("GPUPOOL_ISOLATION", "GPUPOOL_MIG_PROFILE", "GPUPOOL_MEMORY_LIMIT_MIB",
                                        "GPUPOOL_CORES_PERCENT")} == {
            "GPUPOOL_ISOLATION": "mig", "GPUPOOL_MIG_PROFILE": "CPX/NPS4", "GPUPOOL_MEMORY_LIMIT_MIB": "24574",
            "GPUPOOL_CORES_PERCENT": "12.5"}, env
        assert not any(k.startswith(("NVIDIA_", "ASCEND_")) for k in env), env
    (first_card, first_xcc), (second_card, second_xcc) = held
    assert first_card == second_card and first_xcc != second_xcc, held
    other = amd_fake.read_state(agent.state)["cards"][1 - first_card]
    assert (other["compute"], other["memory"]) == ("SPX", "NPS1"), other

    release(c, ["amd-cpx", "amd-cpx-2"], agent)
    # idle partitions are destroyed: the card is whole again (SPX/NPS1)
    wait_for(lambda: [(x["compute"], x["memory"]) for x in amd_fake.read_state(agent.state)["cards"]]
             == [("SPX", "NPS1")] * CARDS, 60, "the AMD card back in SPX/NPS1", agent.tail)


def test_a_vir08_claim_gets_its_vnpu_and_releases_it(parts: DraCluster, allocator: Extender) -> None:
    c = parts
    agent = c.agents[ASCEND_NODE]
    assert isinstance(agent, VendorDraAgent)
    pod, claim_obj, device = run_claim(c, allocator, "ascend-vir08", "vir08")
    assert pod["spec"]["nodeName"] == c.node(ASCEND_NODE).name
    match = re.fullmatch(r"gpu-(\d)-vir08-(\d+)", device)
    assert match, device
    chip, slot = int(match[1]), int(match[2])
    vnpu = vnpu_id(chip, slot)
    vnpus = dcmi_fake.chip_state(agent.state, chip).get("vnpus", [])
    assert [(v["vdev_id"], v["template"]) for v in vnpus] == [(vnpu, "vir08")], vnpus  # carved at prepare
    assert claim_obj["metadata"]["uid"] in agent.prepared()
    env, devices = seen(c, "ascend-vir08")
    # the vNPU's node under the name the Ascend runtime gives it, and the chip-wide management nodes
    assert devices == {f"/dev/davinci{vnpu}", *ASCEND_SHARED}, devices
    # 8 of the catalogue's 30 AI Cores: 26.6 %; 65,536 MiB x 17,476 / 65,536 = 17,476 MiB
    assert {k: env.get(k) for k in ("ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS", "GPUPOOL_ISOLATION",
                                    "GPUPOOL_MIG_PROFILE", "GPUPOOL_MEMORY_LIMIT_MIB", "GPUPOOL_CORES_PERCENT")} == {
        "ASCEND_VISIBLE_DEVICES": str(vnpu), "ASCEND_RUNTIME_OPTIONS": "VIRTUAL", "GPUPOOL_ISOLATION": "mig",
        "GPUPOOL_MIG_PROFILE": "vir08", "GPUPOOL_MEMORY_LIMIT_MIB": "17476", "GPUPOOL_CORES_PERCENT": "26.6"}, env
    assert not any(k.startswith("NVIDIA_") for k in env), env

    release(c, ["ascend-vir08"], agent)
    wait_for(lambda: not dcmi_fake.chip_state(agent.state, chip).get("vnpus"), 60, "the vNPU destroyed", agent.tail)


def test_the_stand_in_devices_never_reach_the_hosts_dev(parts: DraCluster) -> None:
    """The stand-ins live in the nodes' mount namespaces: the host's /dev (this process's) is as it was
    before they were made, and a node's containerd sees them."""
    assert host_dev() == HOST_DEV_BEFORE[0]
    node = parts.node(ASCEND_NODE)
    assert node.containerd is not None
    inside = Path(f"/proc/{node.containerd.popen.pid}/root/dev/vdavinci100")
    assert inside.is_char_device() and not Path("/dev/vdavinci100").exists()
