"""gpupool on real nodes: kube-scheduler + the extender place share pods, the real kubelet 1.20 calls the
gpupool agent over its device-plugin socket, containerd starts the containers, and what each container
sees from inside (its logs, `kubectl exec`) is exactly its own pod's allocation."""

from __future__ import annotations

import pytest

from gpupool.agent.slots import slot_gpu
from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION, ANN_UUID
from tests.e2e.e2e_checks import allocation_problems
from tests.e2e.real_node_fixtures import (
    RealCluster,
    expected_grant,
    parse_grant,
    real_cluster,  # noqa: F401  (module fixture)
    share_pod,
    wait_for,
)

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
    c.apply(others)
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
    # The hook directory a container sees is its own pod's (the agent writes the pod's identity there).
    for name in ("a-big", "a-small", "pair"):
        seen = c.kubectl("exec", "-n", "e2e-real", name, "--", "cat", "/run/gpupool/hook/pod.json")
        assert pods[name]["metadata"]["uid"] in seen, (name, seen)
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
    wait_for(lambda: not c.pods(), 60, "pods gone (kubelet confirmed each deletion)")
