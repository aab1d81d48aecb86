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

The fixtures are test_e2e_chart_pods.py's (one control plane that serves pods per machine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
    with chart_cluster(RELEASE, NAMESPACE, install=True) as c:
        c.bed.tenant_namespace(TENANT)
        yield c


def template(name: str, memory: str, cores: str) -> Obj:
    """docs/claims.md's share: a ResourceClaimTemplate of the class gpu.gpupool.io."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}}


def claim_pod(name: str, claim_template: str, image: str = images.BUSYBOX_IMAGE,
              command: list[str] | None = None) -> Obj:
    """A pod as a tenant writes it: no schedulerName, no gate, no toleration; the claim from `claim_template`."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": command or GRANT_COMMAND,
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


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
