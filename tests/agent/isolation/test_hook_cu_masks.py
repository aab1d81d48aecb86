"""AMD compute shares held by CU masks (gpupool.agent.isolation.hook's AMD path and .vendors.amd_cu_masks): the
bits each share's cu_masks.v1 gets, released with its directory, rebuilt from the files after a restart.

Expected bits come from gpupool.core.cu_masks's rule, worked out by hand in tests/core/test_cu_masks.py: on an
empty MI300X (304 CUs) consecutive 25 % shares (76 CUs) get bits 0-75, 76-151, 152-227, 228-303."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.isolation.base import GrantRequest, Prepared, Refused
from gpupool.agent.isolation.grant import grant_request
from gpupool.agent.isolation.hook import HookIsolation
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.state.hookdir import (
    CU_MASKS_FILE,
    CuMask,
    claim_dir,
    container_dir,
    hook_paths,
    install_hip_library,
    limits_dir,
    read_cu_masks,
)
from gpupool.api.allocation import AllocationDoc, ContainerDoc, GrantDoc

MI300X_MIB = 196_592  # as the vendor library reports it
DEVICES = {
    "A0": DeviceInfo(uuid="A0", index=0, model="MI300X", memory_mib=MI300X_MIB, vendor="amd", sm_count=304),
    "A1": DeviceInfo(uuid="A1", index=1, model="MI300X", memory_mib=MI300X_MIB, vendor="amd"),  # CUs: catalogue
    "M0": DeviceInfo(uuid="M0", index=2, model="MI210", memory_mib=65_536, vendor="amd", sm_count=104),
    "N0": DeviceInfo(uuid="N0", index=0, model="L40S", memory_mib=46068),
}
Q1, Q2, Q3, Q4 = (frozenset(range(s, s + 76)) for s in (0, 76, 152, 228))


@pytest.fixture
def cfg(tmp_path: Path) -> AgentConfig:
    """An agent whose hook root has the HIP library and the pods' directory (what `gpupool agent` installs)."""
    root = tmp_path / "hook"
    source = tmp_path / "libgpupool_hip.so"
    source.write_bytes(b"\x7fELF")
    assert install_hip_library(root, source) is None
    hook_paths(root).pods.mkdir(parents=True)
    return AgentConfig(node_name="n", backend="fake", fake_file=tmp_path / "gpus.yaml", hook_root=root)


def pod_obj(uid: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns"}, "status": {"phase": phase}}


def share(uid: str, *cards: tuple[str, float], containers: dict[str, list[tuple[str, float]]] | None = None
          ) -> AllocationDoc:
    def grant(uuid: str, cores: float) -> GrantDoc:  # the same fraction of the card's memory
        return GrantDoc(uuid=uuid, index=DEVICES[uuid].index, memory_mib=int(DEVICES[uuid].memory_mib * cores / 100),
                        cores=cores)

    gpus = [grant(u, c) for u, c in cards]
    parts = [ContainerDoc(name=n, gpus=[grant(u, c) for u, c in held]) for n, held in (containers or {}).items()]
    return AllocationDoc(pod_uid=uid, node="n", gpus=gpus, containers=parts, version=2 if parts else 1)


async def prepare(cfg: AgentConfig, doc: AllocationDoc, pods: list[dict[str, Any]], container: str = "main",
                  claim: bool = False, strategy: HookIsolation | None = None) -> Prepared | Refused:
    """One Allocate's (or a claim's) hook prepare, as the device plugin and the DRA driver run it."""
    strategies = node_strategies(cfg)
    if strategy is not None:
        strategies["hook"] = strategy
    found = grant_request(doc, container, DEVICES, {}, cfg, f"ns/{doc.pod_uid}", strategies, pods_on_node=pods,
                          claim=claim)
    assert not isinstance(found, Refused), found
    hook, request = found
    assert isinstance(request, GrantRequest) and hook.name == "hook"
    return await hook.prepare(request)


def masks_of(cfg: AgentConfig, uid: str, container: str = "main") -> tuple[CuMask | None, ...]:
    return read_cu_masks(limits_dir(container_dir(cfg.hook_root, uid, container)) / CU_MASKS_FILE)


def cus(mask: CuMask | None) -> frozenset[int]:
    assert mask is not None and mask.card_cus == 304
    return mask.cus


async def test_two_shares_of_one_card_get_disjoint_consecutive_cus(cfg: AgentConfig) -> None:
    pods = [pod_obj("u1"), pod_obj("u2")]
    assert isinstance(await prepare(cfg, share("u1", ("A0", 25)), pods), Prepared)
    assert isinstance(await prepare(cfg, share("u2", ("A0", 25)), pods), Prepared)
    [first], [second] = masks_of(cfg, "u1"), masks_of(cfg, "u2")
    assert cus(first) == Q1 and cus(second) == Q2


async def test_another_card_is_counted_on_its_own_and_uses_the_catalogues_cus(cfg: AgentConfig) -> None:
    pods = [pod_obj("u1"), pod_obj("u2")]
    await prepare(cfg, share("u1", ("A0", 25)), pods)
    # A1 reports no CU count: the catalogue's 304; nothing held there, so the lowest 152 bits
    assert isinstance(await prepare(cfg, share("u2", ("A1", 50), ("M0", 50)), pods), Prepared)
    on_a1, on_m0 = masks_of(cfg, "u2")
    assert cus(on_a1) == frozenset(range(152))
    assert on_m0 == CuMask(104, frozenset(range(52)))  # half an MI210, its own 104 bits


async def test_a_removed_directory_frees_its_cus_for_the_next_share(cfg: AgentConfig) -> None:
    pods = [pod_obj("u1"), pod_obj("u2")]
    await prepare(cfg, share("u1", ("A0", 25)), pods)
    await prepare(cfg, share("u2", ("A0", 25)), pods)
    hook = node_strategies(cfg)["hook"]
    await hook.release([pod_obj("u2")], "n")  # u1 has left the node: its directory goes, and its CUs with it
    assert not container_dir(cfg.hook_root, "u1", "main").exists()
    await prepare(cfg, share("u3", ("A0", 25)), [pod_obj("u2"), pod_obj("u3")])
    [third] = masks_of(cfg, "u3")
    assert cus(third) == Q1


async def test_a_pod_that_left_the_node_holds_nothing_even_before_its_directory_is_swept(cfg: AgentConfig) -> None:
    await prepare(cfg, share("u1", ("A0", 25)), [pod_obj("u1")])
    await prepare(cfg, share("u3", ("A0", 25)), [pod_obj("u3")])  # u1 is gone from the node's pods
    [third] = masks_of(cfg, "u3")
    assert cus(third) == Q1


async def test_a_finished_pod_holds_no_cus_as_the_ledger_counts_it_no_more(cfg: AgentConfig) -> None:
    await prepare(cfg, share("u1", ("A0", 75)), [pod_obj("u1")])
    # u1 Succeeded but is still bound (its directory stays until it is deleted): a new 75 % share fits
    got = await prepare(cfg, share("u2", ("A0", 75)), [pod_obj("u1", "Succeeded"), pod_obj("u2")])
    assert isinstance(got, Prepared), got
    [second] = masks_of(cfg, "u2")
    assert cus(second) == frozenset(range(228))


async def test_a_restarted_agent_knows_the_holders_from_the_files(cfg: AgentConfig) -> None:
    pods = [pod_obj("u1"), pod_obj("u2"), pod_obj("u3")]
    await prepare(cfg, share("u1", ("A0", 25)), pods)
    await prepare(cfg, share("u2", ("A0", 25)), pods)
    fresh = HookIsolation(cfg)  # a new agent process: nothing in memory, the directories on disk
    assert isinstance(await prepare(cfg, share("u3", ("A0", 25)), pods, strategy=fresh), Prepared)
    [third] = masks_of(cfg, "u3")
    assert cus(third) == Q3


async def test_two_containers_of_one_pod_each_get_their_own_share(cfg: AgentConfig) -> None:
    doc = share("u1", ("A0", 50), containers={"a": [("A0", 25)], "b": [("A0", 25)]})
    pods = [pod_obj("u1")]
    await prepare(cfg, doc, pods, container="a")
    await prepare(cfg, doc, pods, container="b")
    [a], [b] = masks_of(cfg, "u1", "a"), masks_of(cfg, "u1", "b")
    assert cus(a) == Q1 and cus(b) == Q2


async def test_a_claim_holds_cus_beside_pods_and_keeps_its_mask_when_prepared_again(cfg: AgentConfig) -> None:
    await prepare(cfg, share("u1", ("A0", 25)), [pod_obj("u1")])
    claim = share("c1", ("A0", 25))
    assert isinstance(await prepare(cfg, claim, [], container="claim", claim=True), Prepared)
    path = limits_dir(claim_dir(cfg.hook_root, "c1")) / CU_MASKS_FILE
    [held] = read_cu_masks(path)
    assert cus(held) == Q2
    # a pod share now skips both the pod's and the claim's CUs
    await prepare(cfg, share("u2", ("A0", 25)), [pod_obj("u1"), pod_obj("u2")])
    [second] = masks_of(cfg, "u2")
    assert cus(second) == Q3
    # u1 leaves, then kubelet prepares the claim again (an agent restart): its own file does not count against
    # it, and it keeps the bits its processes run on, though a fresh choice would now be bits 0-75
    await node_strategies(cfg)["hook"].release([pod_obj("u2")], "n")
    assert isinstance(await prepare(cfg, claim, [], container="claim", claim=True), Prepared)
    assert read_cu_masks(path) == (held,)


async def test_a_whole_card_has_no_mask_and_nvidia_shares_get_no_file(cfg: AgentConfig) -> None:
    await prepare(cfg, share("u1", ("A0", 100)), [pod_obj("u1")])
    assert masks_of(cfg, "u1") == (None,)
    await prepare(cfg, share("u2", ("N0", 25)), [pod_obj("u2")])
    assert not (limits_dir(container_dir(cfg.hook_root, "u2", "main")) / CU_MASKS_FILE).exists()


async def test_a_share_the_card_has_no_cus_left_for_is_refused_for_a_retry(cfg: AgentConfig) -> None:
    pods = [pod_obj(f"u{i}") for i in range(1, 6)]
    for i in range(1, 5):
        await prepare(cfg, share(f"u{i}", ("A0", 25)), pods)
    got = await prepare(cfg, share("u5", ("A0", 25)), pods)
    assert isinstance(got, Refused) and got.retry
    assert "card A0: a share of 25.0 % needs 76 of the card's 304 CUs, and only 0 are free" in got.reason


async def test_a_garbled_mask_file_on_the_node_refuses_rather_than_guess(cfg: AgentConfig) -> None:
    await prepare(cfg, share("u1", ("A0", 25)), [pod_obj("u1")])
    path = limits_dir(container_dir(cfg.hook_root, "u1", "main")) / CU_MASKS_FILE
    path.write_bytes(b"garbage")
    got = await prepare(cfg, share("u2", ("A0", 25)), [pod_obj("u1"), pod_obj("u2")])
    assert isinstance(got, Refused) and got.retry and str(path) in got.reason

async def test_a_memory_only_share_gets_no_mask_and_holds_no_cus(cfg: AgentConfig) -> None:
    """gpu-memory alone is granted 0.1 % (1 milli-GPU) and competes for compute: one CU would starve it."""
    pods = [pod_obj("u1"), pod_obj("u2")]
    await prepare(cfg, share("u1", ("A0", 0.1)), pods)
    assert masks_of(cfg, "u1") == (None,)
    await prepare(cfg, share("u2", ("A0", 25)), pods)
    [second] = masks_of(cfg, "u2")
    assert cus(second) == Q1
