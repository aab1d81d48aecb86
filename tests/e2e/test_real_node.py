"""gpupool on real nodes: kube-scheduler + the extender place share pods, the real kubelet 1.20 calls the
gpupool agent over its device-plugin socket, containerd starts the containers, and what each container
sees from inside (its logs, `kubectl exec`) is exactly its own pod's allocation."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.agent.devices.slots import slot_gpu
from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION, ANN_UUID, RESOURCE_CORES, RESOURCE_MEMORY
from tests.e2e.e2e_checks import allocation_problems
from tests.e2e.real_node_fixtures import (
    GPUS_PER_NODE,
    SPLIT,
    RealCluster,
    describe_pod,
    expected_grant,
    images,
    no_pods_left,  # noqa: F401  (autouse: each test leaves empty nodes)
    parse_grant,
    phase,
    real_cluster,  # noqa: F401  (module fixture)
    share_pod,
    wait_for,
)
from tests.exporter.test_exporter_prometheus import dashboard_queries, prometheus, query  # noqa: F401

pytestmark = pytest.mark.e2e


def _gpus(pod: dict) -> list[str]:
    return [g.uuid for g in decode_allocation(pod["metadata"]["annotations"][ANN_ALLOCATION]).gpus]


def test_containers_get_exactly_their_allocation(real_cluster: RealCluster) -> None:  # noqa: F811
    c = real_cluster
    n0, n1 = c.node(0).name, c.node(1).name
    g0, g1 = c.agent(0).gpu_uuids[:2]
    # Two shares on one GPU in both orders: the big one first on g0, the small one first on g1. Each pod is
    # created only once the previous one runs, so the second always lands beside a running first.
    order = [
        share_pod("a-big", n0, 20480, 60, annotations={ANN_UUID: g0}),
        share_pod("a-small", n0, 8192, 30, annotations={ANN_UUID: g0}),
        share_pod("b-small", n0, 8192, 30, annotations={ANN_UUID: g1}),
        share_pod("b-big", n0, 20480, 60, annotations={ANN_UUID: g1}),
    ]
    for pod in order:
        c.apply([pod])
        c.wait_running([pod["metadata"]["name"]])
    # On the other node: an MPS share (pipe directory mounted), two whole GPUs, and a pod without GPUs.
    others = [
        share_pod("mps", n1, 10240, 25, annotations={"gpupool.io/isolation": "mps"}),
        share_pod("pair", n1, None, 100, gpus=2),
        share_pod("plain", n1, None, None, gpus=0),
    ]
    for pod in others:  # one at a time: a bind waiting for the node's previous pod could park a pod for a minute
        c.apply([pod])
        c.wait_running([pod["metadata"]["name"]])
    names = [p["metadata"]["name"] for p in order + others]
    pods = {p["metadata"]["name"]: p for p in c.wait_running(names)}

    assert _gpus(pods["a-big"]) == _gpus(pods["a-small"]) == [g0]
    assert _gpus(pods["b-big"]) == _gpus(pods["b-small"]) == [g1]
    assert len(set(_gpus(pods["pair"]))) == 2 and not set(_gpus(pods["pair"])) & set(_gpus(pods["mps"]))
    for name in names[:-1]:
        want_env, want_mounts = expected_grant(pods[name])
        got_env, got_mounts = c.grant(name)
        assert (got_env, got_mounts) == (want_env, want_mounts), name
    assert c.grant("plain") == ({}, set())  # no GPU asked, nothing of gpupool's in the container
    assert pods["mps"]["metadata"]["annotations"].get("gpupool.io/isolation") == "mps"
    assert expected_grant(pods["mps"])[1] == {"/run/gpupool/mps"}  # the case really has a mount
    # ... and behind it the GPU's MPS daemon (the agent's, a stand-in control program): its control socket
    seen = c.kubectl("exec", "-n", "e2e-real", "mps", "--", "ls", "/run/gpupool/mps").split()
    assert "control" in seen, seen
    # The limits a container's library reads are its own grant's, in a file the container cannot write.
    for name, mib in (("a-big", 20480), ("a-small", 8192)):
        cap, strings = c.limits_seen(name)
        assert cap == mib and _gpus(pods[name])[0] in strings and "/run/gpupool/hook" in strings, (name, cap)
        tamper = c.kubectl("exec", "-n", "e2e-real", name, "--", "sh", "-c",
                           "echo 0 > /run/gpupool/limits/limits.v1 && echo written || echo refused")
        assert tamper.strip() == "refused", (name, tamper)
    # From inside with exec as well (the same variables, read by a second process in the container).
    exec_env = parse_grant("\n".join("env " + line for line in c.kubectl(
        "exec", "-n", "e2e-real", "a-small", "--", "env").splitlines()))[0]
    assert {k: v for k, v in exec_env.items() if k.startswith(("GPUPOOL_", "NVIDIA_"))} == expected_grant(
        pods["a-small"])[0]

    # GetPreferredAllocation honoured: the device IDs the real kubelet assigned (its checkpoint) are slots
    # of exactly the GPUs each pod was granted, and no slot went to two pods.
    for i in (0, 1):
        assigned = c.checkpoint(i)
        for pod in pods.values():
            if pod["spec"]["nodeName"] != c.node(i).name or pod["metadata"]["name"] == "plain":
                continue
            ids = assigned[pod["metadata"]["uid"]]
            assert sorted({slot_gpu(d) for d in ids}) == sorted(_gpus(pod)), pod["metadata"]["name"]
        every = [d for ids in assigned.values() for d in ids]
        assert len(every) == len(set(every))

    assert allocation_problems(list(pods.values()), [c.node_obj(0), c.node_obj(1)]) == []
    ledger = c.extender.ledger()
    entries = {e["pod"]: e for e in ledger["ledger"]["entries"]}
    for name in names[:-1]:
        entry = entries[f"e2e-real/{name}"]
        assert entry["uid"] == pods[name]["metadata"]["uid"] and entry["node"] == pods[name]["spec"]["nodeName"]
    assert not any(ledger["diff"].values()), ledger["diff"]  # the ledger equals what the API says

    c.delete_pods(names)
    c.wait_pods_gone()


def _containers(pod: dict) -> list[tuple[str, int, str]]:
    """(container ID, restart count, start time) of each container: what changes if a pod is touched."""
    return [(s.get("containerID", ""), int(s.get("restartCount", 0)),
             ((s.get("state") or {}).get("running") or {}).get("startedAt", ""))
            for s in (pod.get("status") or {}).get("containerStatuses") or []]


def _check_own_grant(c: RealCluster, pods: list[dict]) -> None:
    for pod in pods:
        assert c.grant(pod["metadata"]["name"]) == expected_grant(pod), pod["metadata"]["name"]


def test_kubelet_restarted_ten_times_while_pods_come_and_go(real_cluster: RealCluster) -> None:  # noqa: F811
    c = real_cluster
    node, agent, n0 = c.node(0), c.agent(0), c.node(0).name
    residents = [share_pod(f"stay-{i}", n0, 4096, 20) for i in range(2)]
    c.apply(residents)
    before = {p["metadata"]["name"]: p for p in c.wait_running([p["metadata"]["name"] for p in residents])}
    came: list[str] = []
    refusals = 0
    for i in range(10):
        registrations = agent.registrations()
        node.stop_kubelet(kill=i % 2 == 1)  # SIGTERM and SIGKILL in turn
        if len(came) >= 2:  # a pod leaves while kubelet is down: deleted in the API, stopped once it is back
            c.delete_pods([came.pop(0)])
        node.start_kubelet()
        wait_for(lambda n=registrations: agent.registrations() > n, 90,  # type: ignore[misc]
                 f"agent re-registered after restart {i + 1}", agent.tail)
        # A restarted kubelet zeroes the node's extended resources until the plugin's devices are back in its
        # status. kube-scheduler 1.37 can leave a pod it found unschedulable in that window parked (seen:
        # not retried for minutes after the allocatable returned), so the next pod waits for the status.
        wait_for(lambda: c.gpu_slots(0) == GPUS_PER_NODE * SPLIT, 90, f"slots back after restart {i + 1}")
        name = f"come-{i}"
        refusals += c.run_pod(share_pod(name, n0, 2048, 5))[1]
        came.append(name)
    assert agent.registrations() >= 11  # the first registration and one after each restart
    after = {p["metadata"]["name"]: p for p in c.wait_running([*before, *came])}
    for name, pod in before.items():
        assert after[name]["metadata"]["uid"] == pod["metadata"]["uid"]
        assert _containers(after[name]) == _containers(pod), f"{name} was touched by a kubelet restart"
    _check_own_grant(c, list(after.values()))
    assigned = c.checkpoint(0)
    every = [d for uid, ids in assigned.items() for d in ids]
    assert len(every) == len(set(every))  # no slot held by two pods after all the restarts
    for pod in after.values():
        assert {slot_gpu(d) for d in assigned[pod["metadata"]["uid"]]} == set(_gpus(pod))
    c.delete_pods([*before, *came])
    c.wait_pods_gone()
    print(f"kubelet restarts: {refusals} pod(s) refused at admission right after a restart and created again")


def test_agent_restarted_mid_burst(real_cluster: RealCluster) -> None:  # noqa: F811
    c = real_cluster
    agent, n1 = c.agent(1), c.node(1).name
    first = [f"burst-a{i}" for i in range(3)]
    c.apply([share_pod(n, n1, 2048, 10) for n in first])
    wait_for(lambda: sum(phase(p) == "Running" for p in c.pods()) >= 1, 120, "a first burst pod running")
    running = {p["metadata"]["name"]: p for p in c.wait_running(first)}
    registrations = agent.registrations()
    agent.kill()  # SIGKILL: no clean-up
    # The rest of the burst arrives while the agent is down, and is bound and admitted meanwhile.
    second = [f"burst-b{i}" for i in range(3)]
    c.apply([share_pod(n, n1, 2048, 10) for n in second])
    agent.start()
    wait_for(lambda: agent.registrations() > registrations, 90, "the restarted agent registered", agent.tail)

    def settled() -> list[dict] | None:
        pods = c.pods()
        done = len(pods) == len(first + second) and all(phase(p) in ("Running", "Failed") for p in pods)
        return pods if done else None

    pods = wait_for(settled, 180, "every burst pod running or refused",
                    lambda: "; ".join(describe_pod(p) for p in c.pods()))
    ran = [p for p in pods if phase(p) == "Running"]
    refused = [p for p in pods if phase(p) == "Failed"]
    # A pod admitted while the agent was away is refused by kubelet before any container starts; none runs
    # without its own grant, and the pods that were running are untouched.
    for pod in refused:
        assert pod["metadata"]["name"] in second, describe_pod(pod)
        assert pod["status"].get("reason") == "UnexpectedAdmissionError", describe_pod(pod)
        assert not any(cid for cid, _, _ in _containers(pod))
    _check_own_grant(c, ran)
    by_name = {p["metadata"]["name"]: p for p in pods}
    for name, pod in running.items():
        assert _containers(by_name[name]) == _containers(pod)
    # Once registered again, the agent serves new pods: once kubelet 1.37 lists the devices healthy again (a
    # pod that meets the zero allocatable of the window before would be parked by kube-scheduler).
    wait_for(lambda: c.gpu_slots(1) == GPUS_PER_NODE * SPLIT, 330, "the node's slots back after the agent restart")
    _check_own_grant(c, [c.run_pod(share_pod("after-agent", n1, 2048, 10))[0]])
    c.delete_pods([p["metadata"]["name"] for p in c.pods()])
    c.wait_pods_gone()
    print(f"agent restart mid-burst: {len(ran)} ran, {len(refused)} refused at admission")


def test_agent_metrics_scraped_while_real_pods_run(real_cluster: RealCluster, prometheus: Any) -> None:  # noqa: F811
    c = real_cluster
    agent, n0 = c.agent(0), c.node(0).name
    c.apply([share_pod("m-0", n0, 4096, 20), share_pod("m-1", n0, 2048, 10)])
    pods = {p["metadata"]["name"]: p for p in c.wait_running(["m-0", "m-1"])}
    # The agent's own endpoint: one FB_USED series per pod, on exactly the GPUs of its allocation.
    want = {(name, g) for name, pod in pods.items() for g in _gpus(pod)}
    families: dict[str, Any] = {}

    def per_pod() -> set[tuple[str, str]]:
        """(pod, GPU) of the per-pod series; the agent refreshes its list of the node's pods in the
        background, so a pod appears a moment after it runs."""
        text = httpx.get(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10).text
        families.update({f.name: f for f in text_string_to_metric_families(text)})
        return {(s.labels["pod"], s.labels["UUID"]) for s in families["DCGM_FI_DEV_FB_USED"].samples
                if s.labels["pod"]}

    wait_for(lambda: per_pod() == want, 60, "one series per pod and granted GPU", lambda: str(per_pod()))
    free = families["DCGM_FI_DEV_FB_FREE"].samples
    assert sorted(s.labels["UUID"] for s in free) == sorted(agent.gpu_uuids)
    assert {s.labels["Hostname"] for s in free} == {n0}
    # A real Prometheus scrapes it: every device query of the Grafana dashboard returns series.
    prom = prometheus(f"127.0.0.1:{agent.metrics_port}")
    device_queries = [q for q in dashboard_queries() if "DCGM_" in q]
    assert device_queries
    for q in device_queries:
        wait_for(lambda q=q: _prom_series(prom, q), 90, f"series for the dashboard query {q}")  # type: ignore[misc]
    c.delete_pods(list(pods))
    c.wait_pods_gone()


def _prom_series(prom: str, promql: str) -> list[dict]:
    try:
        return query(prom, promql)
    except httpx.HTTPError:
        return []  # Prometheus still starting


def test_pod_with_two_gpu_containers_runs_and_each_prints_its_own_grant(real_cluster: RealCluster) -> None:  # noqa: F811
    """Kubelet calls Allocate once per GPU container; each container receives exactly its own part of the
    pod's allocation (the annotation's `containers`), and kubelet's slots for both are on the pod's GPU."""
    c = real_cluster
    pod = share_pod("two-c", c.node(0).name, 2048, 10)
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second["name"] = "second"
    second["resources"]["limits"].update({RESOURCE_MEMORY: "4096", RESOURCE_CORES: "30"})
    pod["spec"]["containers"].append(second)
    c.apply([pod])
    running = c.wait_running(["two-c"])[0]
    doc = decode_allocation(running["metadata"]["annotations"][ANN_ALLOCATION])
    # main asks for 2048 MiB / 10 %, second for 4096 MiB / 30 %: one GPU, each container its own share
    parts = {p.name: [(g.uuid, g.memory_mib, g.cores) for g in p.gpus] for p in doc.containers}
    (gpu,) = _gpus(running)
    assert parts == {"main": [(gpu, 2048, 10.0)], "second": [(gpu, 4096, 30.0)]}
    for name in ("main", "second"):
        assert c.grant("two-c", name) == expected_grant(running, container=name), name
        # each container has its own limits (held to its own share, not the pod's sum)
        cap, strings = c.limits_seen("two-c", name)
        assert (cap, gpu in strings) == ({"main": 2048, "second": 4096}[name], True), name
    slots = c.checkpoint(0)[running["metadata"]["uid"]]
    assert len(slots) == 2 and {slot_gpu(d) for d in slots} == {gpu}
    # The node goes on serving: the next pod runs with its own grant.
    c.apply([share_pod("after-two-c", c.node(0).name, 2048, 10)])
    _check_own_grant(c, c.wait_running(["after-two-c"]))
    c.delete_pods(["two-c", "after-two-c"])
    c.wait_pods_gone()


def test_container_is_stopped_at_its_memory_cap(real_cluster: RealCluster) -> None:  # noqa: F811
    """The interception library, mounted and preloaded by the agent, caps a CUDA program in a real container
    (the fake driver reports 80 GiB, so a refusal at 1 GiB is the cap's)."""
    c = real_cluster
    mib = 1 << 20
    # 768 MiB fits the 1024 MiB share; another 768 MiB does not; 16 bytes still do. Then the same again from a
    # second process whose environment asks for 64 GiB and its own accounting directory, as a tenant would
    # (the first process has exited and freed its memory): the read-only limits file still holds it.
    asks = f"printf 'alloc mem {768 * mib}\\nalloc mem {768 * mib}\\nalloc mem 16\\n'"
    script = (f"{asks} | probe direct; {asks} | env GPUPOOL_MEMORY_LIMIT_MIB=65536 GPUPOOL_HOOK_DIR=/tmp "
              "probe direct; exec sleep 1000000")
    c.apply([share_pod("capped", c.node(0).name, 1024, 20, image=images.PROBE_IMAGE, command=["sh", "-c", script])])
    c.wait_running(["capped"])

    def answers() -> list[str] | None:
        # The library's own diagnostics (gpupool-hook[pid]: ..., on stderr) share the log with the probe's
        # answers; they are kept for the message below, not counted as answers.
        out = [line for line in c.kubectl("logs", "-n", "e2e-real", "capped").splitlines()
               if line.strip() and not line.startswith("gpupool-hook")]
        return out if len(out) >= 6 else None

    lines = wait_for(answers, 60, "the probe's answers", lambda: c.kubectl("logs", "-n", "e2e-real", "capped"))
    codes = [int(line.split()[0]) for line in lines[:6]]
    assert codes == [0, 2, 0] * 2, c.kubectl("logs", "-n", "e2e-real", "capped")  # 2 = CUDA_ERROR_OUT_OF_MEMORY
    c.delete_pods(["capped"])
    c.wait_pods_gone()


def test_stopped_kubelet_node_leaves_the_ledger_only_as_kubernetes_says(real_cluster: RealCluster) -> None:  # noqa: F811
    """Runs last: it stops node 1's kubelet for good and deletes the node."""
    c = real_cluster
    node, n0, n1 = c.node(1), c.node(0).name, c.node(1).name
    c.apply([share_pod("d-0", n1, 4096, 20), share_pod("d-1", n1, 4096, 20)])
    c.wait_running(["d-0", "d-1"])
    node.stop_kubelet()

    def entries() -> dict[str, dict]:
        return {e["pod"]: e for e in c.extender.ledger()["ledger"]["entries"]}

    barriers = iter(range(100))

    def barrier() -> dict[str, dict]:
        """A pod placed on node 0 now: once the ledger holds it, it has seen every change made before."""
        name = f"barrier-{next(barriers)}"
        c.apply([share_pod(name, n0, 2048, 5)])
        return wait_for(lambda: (e := entries()) and f"e2e-real/{name}" in e and e, 90,  # type: ignore[no-any-return]
                        f"{name} in the ledger")

    # Nothing says the pods are gone: the ledger keeps them and their GPUs.
    assert {"e2e-real/d-0", "e2e-real/d-1"} <= set(barrier())
    # A graceful deletion only marks the pod (its kubelet would stop the containers and confirm): kept.
    c.delete_pods(["d-0"])
    wait_for(lambda: (c.pod("d-0") or {}).get("metadata", {}).get("deletionTimestamp"), 60, "d-0 terminating")
    assert "e2e-real/d-0" in barrier()
    # A forced deletion removes the pod object: now Kubernetes says it is gone, and so does the ledger.
    c.delete_pods(["d-0"], force=True)
    wait_for(lambda: "e2e-real/d-0" not in entries(), 60, "d-0 out of the ledger")
    assert "e2e-real/d-1" in entries()
    # Deleting the node object takes its GPUs out of the pool; d-1 leaves only with its pod object.
    gpus = c.extender.ledger()["ledger"]["gpus"]
    c.kubectl("delete", "node", n1, "--wait=false")
    wait_for(lambda: c.extender.ledger()["ledger"]["gpus"] == gpus - 3, 60, "node 1's GPUs out of the pool")
    c.delete_pods(["d-1"], force=True)

    def d1_gone() -> bool:
        led = c.extender.ledger()["ledger"]
        return all(e["pod"] != "e2e-real/d-1" for e in led["entries"] + led["stranded"])

    wait_for(d1_gone, 60, "d-1 out of the ledger")
