"""DRA claims through the Helm chart's own pods (`dra.enabled=true`), on two real nodes: a tenant writes a
ResourceClaimTemplate of the class gpu.gpupool.io and a pod using it, as docs/claims.md writes them, and
creates them with kubectl. The webhook pod gates the pod (gpupool places the claims of its classes), the
scheduler pod's extender allocates the claim (field manager `gpupool`) and removes the gate, the cluster's
kube-scheduler binds the pod, and the agent pod of the pod's node, registered with its kubelet through the
kubelet's own plugin directories (mounted into the agent pod as the chart mounts them), prepares the claim:
the CDI spec it writes in the node's CDI directory is what containerd applies. From inside the container:
its variables and mounts, the memory cap and the GPU in the limits file equal the claim's allocation, the
limits file cannot be written, and a CUDA program (the interception library's fake driver) is held to the
claim's memory, also when it sets its own limit variables. Deleting the pods unprepares the claims.

Remote shares (`dra.remote.enabled`, docs/remote.md) through the same pods: each agent pod runs its node's
GPU server over the fake CUDA driver (ChartRelease(remote=True)); a pod pinned to a node whose GPUs are full
gets a claim of the class remote.gpu.gpupool.io on the other node's GPU, its node's agent pod prepares it with
the forwarding library and the server's address, and the server in the other node's agent pod holds the CUDA
program in the container to the claim's memory.

The fixtures are test_e2e_chart_pods.py's (one control plane that serves pods per machine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.real_node_fixtures import GRANT_COMMAND, images, parse_grant, wait_for
from tests.e2e.test_e2e_chart_pods import Cluster, chart_cluster, release

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "cc", "gpupool-cc", "e2e-chart-claims"
DRIVER = release.DRA_DRIVER
GATE = "gpu.gpupool.io/allocate"  # the webhook's scheduling gate on pods with claims (docs/claims.md)
HOOK_MOUNTS = {"/usr/local/lib/gpupool/libgpupool_hook.so", "/etc/ld.so.preload", "/run/gpupool/hook",
               "/run/gpupool/limits"}
LIMITS = "/run/gpupool/limits/limits.v1"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with chart_cluster(RELEASE, NAMESPACE) as c:
        c.release.remote = True  # every agent pod runs its node's GPU server (the remote test)
        c.release.install()
        c.release.wait_ready(timeout_s=420)
        c.bed.tenant_namespace(TENANT)
        yield c


def template(name: str, memory: str, cores: str, device_class: str = DRIVER) -> Obj:
    """docs/claims.md's share: a ResourceClaimTemplate of the class gpu.gpupool.io (or `device_class`)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}}


def claim_pod(name: str, claim_template: str, image: str = images.BUSYBOX_IMAGE,
              command: list[str] | None = None, node: str = "") -> Obj:
    """A pod as a tenant writes it: no schedulerName, no gate, no toleration; the claim from `claim_template`
    (and, with `node`, a nodeSelector on that node's hostname label)."""
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
                         "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                         "command": command or GRANT_COMMAND,
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def mib(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, scale in units.items():
        if quantity.endswith(suffix):
            return int(quantity[:-2]) * scale >> 20
    return int(quantity) >> 20


class Tenant:
    def __init__(self, c: Cluster) -> None:
        self.c = c

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = self.c.kubectl(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def get(self, kind: str, name: str) -> Obj:
        return json.loads(self.kubectl("-n", TENANT, "get", kind, name, "-o", "json",  # type: ignore[no-any-return]
                                       "--show-managed-fields"))

    def events(self, name: str) -> str:
        return self.c.kubectl("-n", TENANT, "get", "events", "--field-selector", f"involvedObject.name={name}").stdout

    def running(self, name: str, timeout_s: float = 240) -> Obj:
        def check() -> Obj | None:
            pod = self.get("pod", name)
            return pod if (pod.get("status") or {}).get("phase") == "Running" else None

        return wait_for(check, timeout_s, f"pod {name} Running",  # type: ignore[no-any-return]
                        lambda: self.c.kubectl("-n", TENANT, "get", "pod", name, "-o", "wide").stdout
                        + self.events(name) + self.c.release.describe_pods())

    def claim_of(self, pod: Obj) -> Obj:
        (status,) = pod["status"]["resourceClaimStatuses"]
        return self.get("resourceclaim", status["resourceClaimName"])

    def exec(self, pod: str, *argv: str) -> str:
        return self.kubectl("-n", TENANT, "exec", pod, "-c", "main", "--", *argv)


def allocation_writers(claim: Obj) -> set[str]:
    return {m["manager"] for m in claim["metadata"].get("managedFields") or []
            if "f:allocation" in ((m.get("fieldsV1") or {}).get("f:status") or {})}


def test_a_claim_pod_is_gated_placed_and_served_by_the_charts_pods(cluster: Cluster) -> None:
    c, t = cluster, Tenant(cluster)
    objects = [template("share-8g-30", "8Gi", "30"), claim_pod("train", "share-8g-30")]
    assert "schedulerName" not in objects[1]["spec"] and "schedulingGates" not in objects[1]["spec"]
    t.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    pod = t.running("train")
    assert not pod["spec"].get("schedulingGates"), pod["spec"]  # the gate the webhook put was removed
    claim = t.claim_of(pod)
    assert allocation_writers(claim) == {"gpupool"}, claim["metadata"].get("managedFields")  # the scheduler pod
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    node = pod["spec"]["nodeName"]
    assert (result["driver"], result["pool"]) == (DRIVER, node), result
    consumed = result["consumedCapacity"]
    assert (mib(consumed["memory"]), int(consumed["cores"])) == (8192, 30), consumed
    uuid = f"GPU-{node}-{int(result['device'].removeprefix('gpu-'))}"  # the fake GPUs' UUIDs (release.FAKE_GPUS)

    # What the container holds is exactly the allocation: the grant it sees ...
    env, mounts = wait_for(lambda: (g := parse_grant(c.kubectl("-n", TENANT, "logs", "train").stdout))[0] and g,
                           60, "train's grant")
    assert env == {"NVIDIA_VISIBLE_DEVICES": uuid, "GPUPOOL_MEMORY_LIMIT_MIB": "8192", "GPUPOOL_CORES_PERCENT": "30",
                   "GPUPOOL_ISOLATION": "hook", "GPUPOOL_HOOK_DIR": "/run/gpupool/hook",
                   "GPUPOOL_CORES_MODE": "hard"}, env
    assert mounts == HOOK_MOUNTS, mounts
    # ... the limits file its library reads (memory cap at offset 16 of struct gp_limits, native/gp.h; the
    # GPU's UUID among its strings), which it cannot write.
    cap = int(t.exec("train", "od", "-A", "n", "-t", "u8", "-j", "16", "-N", "8", LIMITS).split()[0])
    assert cap == 8192 << 20, cap
    assert uuid in t.exec("train", "strings", LIMITS).split()
    tamper = t.exec("train", "sh", "-c", f"echo 0 > {LIMITS} && echo written || echo refused")
    assert tamper.strip() == "refused", tamper

    # The agent pod wrote the claim's CDI spec where the node's containerd reads it (the chart's
    # /var/run/cdi, the node's own directory), and its hook directory under the chart's hook root.
    uid = claim["metadata"]["uid"]
    real = next(n for n in c.nodes.nodes if n.name == node)
    specs = [p for p in (real.dir / "cdi").iterdir() if uid in p.read_text()]
    assert len(specs) == 1, list((real.dir / "cdi").iterdir())
    assert json.loads(specs[0].read_text())["devices"][0]["name"] == uid
    claim_dir = real.dir / "local" / "hook" / "claims" / uid
    assert claim_dir.is_dir()

    # Deleting the pod unprepares the claim on its node: CDI spec and hook directory gone.
    t.kubectl("-n", TENANT, "delete", "pod", "train", "--wait=true")
    wait_for(lambda: not specs[0].exists() and not claim_dir.exists(), 90, "train's claim unprepared",
             c.release.describe_pods)


def test_the_library_in_a_claim_container_holds_the_claims_memory(cluster: Cluster) -> None:
    """The cuda-probe image (the library's fake CUDA driver, 80 GiB) with a 1 GiB claim: with the library the
    agent pod's CDI spec mounts and preloads, 768 MiB are allocated, the next 768 MiB refused
    (CUDA_ERROR_OUT_OF_MEMORY, 2), 16 bytes still fit; the same from a process that asks for 64 GiB and its
    own accounting directory through its environment."""
    c, t = cluster, Tenant(cluster)
    mb = 1 << 20
    asks = f"printf 'alloc mem {768 * mb}\\nalloc mem {768 * mb}\\nalloc mem 16\\n'"
    script = (f"{asks} | probe direct; {asks} | env GPUPOOL_MEMORY_LIMIT_MIB=65536 GPUPOOL_HOOK_DIR=/tmp "
              "probe direct; exec sleep 1000000")
    objects = [template("probe-1g", "1Gi", "20"),
               claim_pod("capped", "probe-1g", image=images.PROBE_IMAGE, command=["sh", "-c", script])]
    t.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    t.running("capped")

    def answers() -> list[str] | None:
        out = [line for line in c.kubectl("-n", TENANT, "logs", "capped").stdout.splitlines()
               if line.strip() and not line.startswith("gpupool-hook")]
        return out if len(out) >= 6 else None

    lines = wait_for(answers, 60, "the probe's answers", lambda: c.kubectl("-n", TENANT, "logs", "capped").stdout)
    assert [int(line.split()[0]) for line in lines[:6]] == [0, 2, 0] * 2, lines
    t.kubectl("-n", TENANT, "delete", "pod", "capped", "--wait=true")


def gpu_servers() -> list[str]:
    """The cgroup of each GPU server listening on TCP among this host's processes (their workers, one per
    connection, end with it)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue  # gone meanwhile
        if argv and Path(argv[0]).name == "gpupool-gpu-server" and "tcp:0.0.0.0:7070" in argv:
            out.append(cgroup)
    return out


def test_a_remote_share_runs_on_another_nodes_gpu_through_the_agent_pods(cluster: Cluster) -> None:
    """Node 1's three GPUs are filled by three 44 GiB claims (46068 MiB each: 1012 MiB left, less than the
    remote claim's 1 GiB). A pod pinned to node 1 with a 1 GiB claim of the remote class gets a GPU of node 0:
    its claim's device is in node 0's pool, node 1's agent pod prepared it with the forwarding library and
    node 0's server at the address node 0's devices publish (its agent pod's own, `dra.remote.address:
    podIP`), and the CUDA program in the container is held to 1 GiB by that server: 768 MiB fit, 768 MiB more
    do not (2 = CUDA_ERROR_OUT_OF_MEMORY), 16 bytes do. Each GPU server runs in its node's agent pod.
    Deleting the pod revokes the share on node 0 (its token line goes)."""
    c, t = cluster, Tenant(cluster)
    (n0, real0), (n1, real1) = ((n.name, n) for n in c.nodes.nodes)
    agent0 = c.release.agent_pod(n0)
    assert agent0 is not None, c.release.describe_pods()
    server = f"tcp:{agent0['status']['podIP']}:7070"  # the chart's dra.remote.port

    def published(node: str) -> set[str]:
        slices = c.kubectl("get", "resourceslices", "--field-selector", f"spec.nodeName={node}", "-o", "json")
        return {d["attributes"]["remoteServer"]["string"] for s in json.loads(slices.stdout)["items"]
                if s["spec"]["driver"] == DRIVER for d in s["spec"].get("devices") or []
                if "remoteServer" in d.get("attributes", {})}

    wait_for(lambda: published(n0) == {server}, 120, "node 0's devices publish its GPU server",
             lambda: f"{published(n0)}\n" + c.release.describe_pods())

    fillers = [claim_pod(f"filler-{i}", "fill-44g", node=n1) for i in range(release.FAKE_GPU_COUNT)]
    t.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": [template("fill-44g", "44Gi", "10"), *fillers]}))
    held = {t.claim_of(t.running(f["metadata"]["name"]))["status"]["allocation"]["devices"]["results"][0]["device"]
            for f in fillers}
    assert len(held) == release.FAKE_GPU_COUNT, held  # one per GPU of node 1

    mb = 1 << 20
    asks = f"printf 'alloc mem {768 * mb}\\nalloc mem {768 * mb}\\nalloc mem 16\\n'"
    far = claim_pod("far", "remote-1g", image=images.PROBE_IMAGE, node=n1,
                    command=["sh", "-c", f"{asks} | probe direct; exec sleep 1000000"])
    t.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        template("remote-1g", "1Gi", "20", device_class=f"remote.{DRIVER}"), far]}))
    pod = t.running("far")
    assert pod["spec"]["nodeName"] == n1
    claim = t.claim_of(pod)
    assert allocation_writers(claim) == {"gpupool"}
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == n0, result  # node 0's GPU: node 1's are full
    uid = claim["metadata"]["uid"]

    # Node 1's agent pod prepared it: the forwarding library as libcuda.so.1, node 0's server, no device.
    (spec_file,) = [p for p in (real1.dir / "cdi").iterdir() if uid in p.read_text()]
    (device,) = json.loads(spec_file.read_text())["devices"]
    env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
    assert (env["GPUPOOL_REMOTE_SERVER_FILE"], env["LD_LIBRARY_PATH"]) == (
        "/run/gpupool/remote/claim/server", "/usr/lib/gpupool/remote"), env
    assert not device["containerEdits"].get("deviceNodes")
    assert (real1.dir / "local" / "hook" / "claims" / uid / "remote" / "server").read_text() == server + "\n"
    assert t.exec("far", "cat", "/run/gpupool/remote/claim/server").strip() == server

    def answers() -> list[str] | None:
        out = [line for line in c.kubectl("-n", TENANT, "logs", "far").stdout.splitlines()
               if line.strip() and not line.startswith("gpupool-")]
        return out if len(out) >= 3 else None

    lines = wait_for(answers, 90, "the probe's answers through node 0's server",
                     lambda: c.kubectl("-n", TENANT, "logs", "far").stdout + c.kubectl(
                         "-n", NAMESPACE, "logs", agent0["metadata"]["name"], "--tail=30").stdout)
    assert [int(line.split()[0]) for line in lines[:3]] == [0, 2, 0], lines
    # The server that held it is a process of node 0's agent pod (its cgroup names the pod): one TCP
    # listener per agent pod, none outside them.
    pods = [p["metadata"]["uid"] for p in c.release.component_pods("agent")]
    owners = sorted(next((u for u in pods if u in cg or u.replace("-", "_") in cg), "") for cg in gpu_servers())
    assert owners == sorted(pods) and agent0["metadata"]["uid"] in owners, (owners, pods)

    tokens = real0.dir / "local" / "hook" / "remote" / "tokens"
    assert uid in tokens.read_text()
    t.kubectl("-n", TENANT, "delete", "pod", "far", *(f["metadata"]["name"] for f in fillers), "--wait=true")
    wait_for(lambda: uid not in tokens.read_text(), 90, "node 0's server forgot the share", c.release.describe_pods)
