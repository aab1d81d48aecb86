"""The MIG manager carving Ascend vNPUs and AMD partitions through PartitionMigBackend (gpupool.agent.devices
.partitions), over the fake DCMI and AMD SMI libraries: a crash between any two steps is finished or undone
by `reconcile`, a partition held by a claim or running work is never destroyed, and an AMD card changes its
mode only when none of its partitions is in use."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.agent.devices.amd import AmdBackend, AmdPartitions
from gpupool.agent.devices.ascend import AscendBackend, AscendPartitions
from gpupool.agent.devices.mig import MigGranted, MigManager, MigRefused, agent_mig_manager
from gpupool.agent.devices.partitions import PartitionMigBackend, vendor_partition_grant
from gpupool.agent.devices.vendor import PartitionBackend
from gpupool.core.model import MigSlot
from tests.agent.fakes import ascend as dcmi_fake
from tests.agent.fakes.amd import amd_fake

CLAIM = "claim-uid-1"


class Crash(BaseException):
    """The agent dying at this point (not an Exception: nothing in the manager catches it)."""


class Crashing(PartitionMigBackend):
    """The adapter, dying at the named step (before it is taken)."""

    def __init__(self, discovery: Any, partitions: PartitionBackend, at: str) -> None:
        super().__init__(discovery, partitions, partition_mode=True)
        self.at = at

    def create_gpu_instance(self, gpu: str, profile: str, start: int) -> int:
        if self.at == "create":
            raise Crash
        made = super().create_gpu_instance(gpu, profile, start)
        if self.at == "after-create":
            raise Crash
        return made

    def destroy_gpu_instance(self, gpu: str, gi_id: int) -> None:
        if self.at == "destroy":
            raise Crash
        super().destroy_gpu_instance(gpu, gi_id)


@pytest.fixture
def ascend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AscendBackend, Path]]:
    state = tmp_path / "dcmi.json"
    monkeypatch.setenv(dcmi_fake.STATE_ENV, str(state))
    dcmi_fake.write_state(state, [{"card_id": 0, "chips": [dcmi_fake.card_910b(0)]}])
    yield AscendBackend(str(dcmi_fake.library()), numa_reader=lambda bus: 0), state


def vnpus(state: Path) -> list[tuple[int, str]]:
    return [(v["vdev_id"], v["template"]) for v in dcmi_fake.chip_state(state, 0).get("vnpus", [])]


def manager(backend: PartitionMigBackend, path: Path, idle_after_s: float = 0) -> MigManager:
    return MigManager(backend, path / "mig.json", lambda: 1000.0, idle_after_s=idle_after_s)


def card(backend: AscendBackend) -> str:
    return backend.discover().devices[0].uuid


@pytest.mark.parametrize(("at", "claim_alive", "left"), [
    ("create", True, []),  # intent recorded, nothing made: forgotten (kubelet's retry carves it again)
    ("create", False, []),
    ("after-create", True, [(102, "vir08")]),  # made before the crash: the claim still there keeps it
    ("after-create", False, [(102, "vir08")]),  # claim gone: idle, destroyed by the next reap
])
def test_a_crash_while_carving_is_finished_or_undone_by_reconcile(
        ascend: tuple[AscendBackend, Path], tmp_path: Path, at: str, claim_alive: bool,
        left: list[tuple[int, str]]) -> None:
    backend, state = ascend
    gpu = card(backend)
    crashing = manager(Crashing(backend, AscendPartitions(backend), at), tmp_path)
    with pytest.raises(Crash):
        crashing.ensure(CLAIM, gpu, "vir08", 2)
    assert json.loads((tmp_path / "mig.json").read_text())["instances"][0]["state"] == "creating"

    restarted = manager(PartitionMigBackend(backend, AscendPartitions(backend), True), tmp_path)
    restarted.reconcile({CLAIM: None} if claim_alive else {})
    assert vnpus(state) == left
    held = restarted.holder(CLAIM)
    if left and claim_alive:
        assert held is not None and (held.profile, held.start, held.uuid) == ("vir08", 2, "102")
        assert restarted.ensure(CLAIM, gpu, "vir08", 2) == MigGranted("102", gpu, "vir08", 2, created=False)
    else:
        assert held is None
    restarted.reap()
    assert vnpus(state) == (left if claim_alive else [])


def test_a_crash_while_destroying_is_finished_by_reconcile(ascend: tuple[AscendBackend, Path], tmp_path: Path) -> None:
    backend, state = ascend
    gpu = card(backend)
    first = manager(Crashing(backend, AscendPartitions(backend), "destroy"), tmp_path)
    assert isinstance(first.ensure(CLAIM, gpu, "vir04", 0), MigGranted)
    first.release(CLAIM)
    with pytest.raises(Crash):
        first.reap()
    assert vnpus(state) == [(100, "vir04")]
    restarted = manager(PartitionMigBackend(backend, AscendPartitions(backend), True), tmp_path)
    report = restarted.reconcile({})
    assert report.destroyed == [f"{gpu} vir04@0"] and vnpus(state) == [] and restarted.entries == []


def test_a_held_vnpu_is_never_destroyed_and_a_busy_one_is_kept(ascend: tuple[AscendBackend, Path],
                                                               tmp_path: Path) -> None:
    backend, state = ascend
    gpu = card(backend)
    m = manager(PartitionMigBackend(backend, AscendPartitions(backend), True), tmp_path)
    assert isinstance(m.ensure(CLAIM, gpu, "vir16", 0), MigGranted)
    assert m.reap().destroyed == []  # held by the claim, idle time 0 of 0 or not
    # another template at the held vNPU's index: refused, the held one untouched
    refused = m.ensure("other", gpu, "vir02", 0)
    assert isinstance(refused, MigRefused) and "no free slices for vir02" in refused.reason
    m.release(CLAIM)
    data = dcmi_fake.read_state(state)
    data["cards"][0]["chips"][0]["vnpus"][0]["in_use"] = True  # a container still runs on it
    state.write_text(json.dumps(data))
    report = m.reap()
    assert report.kept_in_use == [f"{gpu} vir16@0"] and vnpus(state) == [(100, "vir16")]
    dcmi_fake.update_chip(state, 0, vnpus=[{**v, "in_use": False} for v in dcmi_fake.chip_state(state, 0)["vnpus"]])
    assert m.reap().destroyed == [f"{gpu} vir16@0"] and vnpus(state) == []


def test_the_agents_manager_on_an_ascend_node_needs_vnpus_or_the_label(ascend: tuple[AscendBackend, Path],
                                                                      tmp_path: Path) -> None:
    backend, _ = ascend
    assert agent_mig_manager(backend, tmp_path, idle_after_s=60) is None  # no vNPU, no label: whole cards
    made = agent_mig_manager(backend, tmp_path, idle_after_s=60, allow_mode_switch=True)
    assert made is not None and isinstance(made.backend, PartitionMigBackend)
    assert made.backend.gpu_uuids() == [card(backend)]


def test_a_claims_partition_grant_holds_its_share_of_the_card() -> None:
    from gpupool.agent.devices.discovery import DeviceInfo

    mi300x = DeviceInfo(uuid="A0", index=1, model="MI300X", memory_mib=196_592, vendor="amd")
    g = vendor_partition_grant(mi300x, MigSlot("QPX/NPS4", 4))
    # 76 of 304 CUs = 25 %; 196,592 MiB / 4 = 49,148 MiB
    assert not isinstance(g, str) and (g.memory_mib, g.cores, g.mig and g.mig.start) == (49_148, 25.0, 4)
    assert vendor_partition_grant(mi300x, MigSlot("QPX/NPS4", 3)) == "MI300X has no partition QPX/NPS4 at 3"
    assert "no partition geometry" in str(vendor_partition_grant(
        DeviceInfo(uuid="A1", index=0, model="MI210", memory_mib=65_520, vendor="amd"), MigSlot("CPX/NPS1", 0)))


# --- AMD: one mode per card -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return amd_fake.load_binding(tmp_path_factory.mktemp("rocm"))


@pytest.fixture
def amd(tmp_path: Path, smi: Any) -> Iterator[tuple[AmdBackend, Path]]:
    state = tmp_path / "amd.json"
    amd_fake.write_state(state, [amd_fake.card("MI300X", 0)])
    before = os.environ.get(amd_fake.STATE_ENV)
    os.environ[amd_fake.STATE_ENV] = str(state)
    backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: -1)
    try:
        yield backend, state
    finally:
        backend.close()
        if before is None:
            del os.environ[amd_fake.STATE_ENV]
        else:
            os.environ[amd_fake.STATE_ENV] = before


def mode(state: Path) -> tuple[str, str]:
    c = amd_fake.read_state(state)["cards"][0]
    return c["compute"], c["memory"]


def test_an_amd_card_changes_mode_only_when_no_partition_is_in_use(amd: tuple[AmdBackend, Path],
                                                                   tmp_path: Path) -> None:
    backend, state = amd
    gpu = backend.discover().devices[0].uuid
    m = manager(PartitionMigBackend(backend, AmdPartitions(backend), True), tmp_path, idle_after_s=600)
    assert isinstance(m.ensure(CLAIM, gpu, "QPX/NPS1", 4), MigGranted)
    assert mode(state) == ("QPX", "NPS1")
    assert sorted((e.start, e.pod) for e in m.entries) == [(0, None), (2, None), (4, CLAIM), (6, None)]
    # an idle partition of the mode is reused rather than a new carving
    reused = m.ensure("second", gpu, "QPX/NPS1", 2)
    assert isinstance(reused, MigGranted) and not reused.created
    refused = m.ensure("third", gpu, "CPX/NPS4", 0)
    assert isinstance(refused, MigRefused) and mode(state) == ("QPX", "NPS1")
    m.release(CLAIM)
    m.release("second")  # all idle now (not yet reaped): the card may change mode for the next claim
    got = m.ensure("third", gpu, "CPX/NPS4", 5)
    assert isinstance(got, MigGranted) and got.created and mode(state) == ("CPX", "NPS4")
    assert sorted((e.profile, e.start, e.pod) for e in m.entries) == [
        ("CPX/NPS4", k, "third" if k == 5 else None) for k in range(8)]


# --- property: random claims, releases, reaps and restarts on an Ascend card ------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("ensure"), st.integers(0, 3), st.sampled_from(["vir02", "vir04", "vir08", "vir16"]),
              st.integers(0, 14)),
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("reap")),
    st.tuples(st.just("restart")),
), max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_random_claims_never_lose_a_held_vnpu_and_the_card_stays_a_valid_layout(ops: list[tuple[Any, ...]]) -> None:
    from gpupool.core.mig import PlacedInstance
    from gpupool.core.partitions import layout_problems

    with tempfile.TemporaryDirectory(prefix="gpp-prop-") as tmp:
        state = Path(tmp) / "dcmi.json"
        dcmi_fake.write_state(state, [{"card_id": 0, "chips": [dcmi_fake.card_910b(0)]}])
        before = os.environ.get(dcmi_fake.STATE_ENV)
        os.environ[dcmi_fake.STATE_ENV] = str(state)
        try:
            backend = AscendBackend(str(dcmi_fake.library()), numa_reader=lambda bus: 0)
            gpu = card(backend)

            def make() -> MigManager:
                return manager(PartitionMigBackend(backend, AscendPartitions(backend), True), Path(tmp))

            m = make()
            held: dict[str, tuple[str, int, str]] = {}  # claim -> (template, slot, vNPU id) it was given
            for op in ops:
                if op[0] == "ensure":
                    claim = f"c{op[1]}"
                    got = m.ensure(claim, gpu, op[2], op[3])
                    if isinstance(got, MigGranted):
                        if claim in held:  # asked again: the same vNPU, whatever this ask named
                            assert got.uuid == held[claim][2]
                        held[claim] = (got.profile, got.start, got.uuid)
                elif op[0] == "release":
                    m.release(f"c{op[1]}")
                    held.pop(f"c{op[1]}", None)
                elif op[0] == "reap":
                    m.reap()
                else:
                    m = make()
                    m.reconcile({c: v[2] for c, v in held.items()})
                on_card = {v["vdev_id"] - 100: v["template"] for v in dcmi_fake.chip_state(state, 0).get("vnpus", [])}
                for claim, (profile, start, uuid) in held.items():
                    assert on_card.get(start) == profile and uuid == str(100 + start), (claim, on_card)
                    holder = m.holder(claim)
                    assert holder is not None and holder.uuid == uuid
                layout = [PlacedInstance(p, s) for s, p in on_card.items()]
                assert layout_problems("Ascend910B", layout) == []
                assert sorted((e.profile, e.start) for e in m.entries) == sorted((p, s) for s, p in on_card.items())
        finally:
            if before is None:
                del os.environ[dcmi_fake.STATE_ENV]
            else:
                os.environ[dcmi_fake.STATE_ENV] = before
