"""The agent's MIG manager on the fake MIG driver (A100-40GB geometry: 1g anywhere in 0-6, 2g at 0/2/4,
3g at 0/4, 4g and 7g at 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import (
    CheckpointError,
    MigGranted,
    MigManager,
    MigRefused,
    mode_switch_allowed,
)
from gpupool.core.mig import PlacedInstance

GPU = "GPU-aaaa0001"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, driver: FakeMigDriver | None = None, **kw: object) -> tuple[FakeMigDriver, MigManager, Clock]:
    drv = driver or FakeMigDriver({GPU: "A100-40GB"})
    clock = Clock()
    return drv, MigManager(drv, tmp_path / "mig.json", clock, idle_after_s=60, **kw), clock  # type: ignore[arg-type]


def granted(result: MigGranted | MigRefused) -> MigGranted:
    assert isinstance(result, MigGranted), result
    return result


def test_creates_the_planned_instance_then_its_compute_instance(tmp_path: Path) -> None:
    drv, mgr, _ = make(tmp_path)
    g = granted(mgr.ensure("pod-a", GPU, "3g.20gb", start=4))
    assert (g.profile, g.start, g.created) == ("3g.20gb", 4, True) and g.uuid.startswith("MIG-")
    assert drv.calls == [f"create_gi {GPU} 3g.20gb@4", f"create_ci {GPU} 1"]
    assert drv.layout(GPU) == [PlacedInstance("3g.20gb", 4)]
    # Allocate is retried by kubelet: the same pod gets the same device, nothing new is created
    assert granted(mgr.ensure("pod-a", GPU, "3g.20gb", start=4)).uuid == g.uuid
    assert len(drv.calls) == 2


def test_without_a_planned_start_it_keeps_room_for_larger_profiles(tmp_path: Path) -> None:
    drv, mgr, _ = make(tmp_path)
    granted(mgr.ensure("pod-a", GPU, "3g.20gb", start=0))
    # slots 4-7 free: 1g at 6 leaves 2g@4 possible, 1g at 4 or 5 would not
    g = granted(mgr.ensure("pod-b", GPU, "1g.5gb"))
    assert g.start == 6


def test_idle_instance_is_reused_then_reaped_after_the_idle_time(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    first = granted(mgr.ensure("pod-a", GPU, "2g.10gb", start=2))
    mgr.release("pod-a")
    again = granted(mgr.ensure("pod-b", GPU, "2g.10gb"))
    assert (again.uuid, again.created) == (first.uuid, False)
    mgr.release("pod-b")
    clock.now += 59
    assert mgr.reap().destroyed == []  # idle for 59 s < 60 s
    clock.now += 1
    assert mgr.reap().destroyed == [f"{GPU} 2g.10gb@2"]
    assert drv.layout(GPU) == [] and drv.destroyed == [(GPU, "2g.10gb", 2)]


def test_an_instance_in_use_is_kept_and_reported(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    g = granted(mgr.ensure("pod-a", GPU, "1g.5gb", start=0))
    drv.start_process(g.uuid)  # a process outlives the pod's record
    mgr.release("pod-a")
    clock.now += 600
    report = mgr.reap()
    assert report.kept_in_use == [f"{GPU} 1g.5gb@0"] and report.destroyed == []
    assert drv.layout(GPU) == [PlacedInstance("1g.5gb", 0)]
    drv.stop_process(g.uuid)
    assert mgr.reap().destroyed == [f"{GPU} 1g.5gb@0"]


def test_a_held_instance_is_never_reaped(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    granted(mgr.ensure("pod-a", GPU, "4g.20gb", start=0))
    clock.now += 10_000
    assert mgr.reap().destroyed == [] and drv.destroyed == []


def test_repartitions_idle_instances_to_carve_a_larger_profile(tmp_path: Path) -> None:
    drv, mgr, _ = make(tmp_path)
    for pod, start in (("a", 0), ("b", 1), ("c", 5)):
        granted(mgr.ensure(pod, GPU, "1g.5gb", start=start))
    mgr.release("a")
    mgr.release("b")
    # 4g needs slots 0-3: the idle 1g at 0 and 1 are destroyed first; c (slot 5) is untouched
    g = granted(mgr.ensure("d", GPU, "4g.20gb"))
    assert (g.start, g.created) == (0, True)
    assert sorted(drv.destroyed) == [(GPU, "1g.5gb", 0), (GPU, "1g.5gb", 1)]
    assert drv.layout(GPU) == sorted([PlacedInstance("4g.20gb", 0), PlacedInstance("1g.5gb", 5)])
    # 7g would need c's slot: refused, c kept
    r = mgr.ensure("e", GPU, "7g.40gb")
    assert isinstance(r, MigRefused) and "are in the way" in r.reason


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    drv, mgr, _ = make(tmp_path)
    assert "does not exist on A100-40GB" in mgr.ensure("p", GPU, "3g.40gb").reason  # type: ignore[union-attr]
    assert "no GPU GPU-nope" in mgr.ensure("p", "GPU-nope", "1g.5gb").reason  # type: ignore[union-attr]
    r = mgr.ensure("p", GPU, "4g.20gb", start=4)
    assert isinstance(r, MigRefused) and "start(s) [4]" in r.reason


def test_restart_finishes_an_instance_whose_compute_instance_was_never_made(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    # the agent died between the two NVML calls: intent and GPU instance recorded, no compute instance
    real = drv.create_compute_instance

    def die(gpu: str, gi: int) -> str:
        raise SystemExit("agent killed")

    drv.create_compute_instance = die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        mgr.ensure("pod-a", GPU, "2g.10gb", start=0)
    drv.create_compute_instance = real  # type: ignore[method-assign]
    again = MigManager(drv, tmp_path / "mig.json", clock, idle_after_s=60)
    # before reconciling, the half-made instance is not doubled by a retried Allocate
    r = again.ensure("pod-a", GPU, "2g.10gb", start=2)
    assert isinstance(r, MigRefused) and "reconcile first" in r.reason
    report = again.reconcile({"pod-a": None})  # the pod is still waiting for its device
    assert report.finished == [f"{GPU} 2g.10gb@0"]
    g = granted(again.ensure("pod-a", GPU, "2g.10gb", start=0))
    assert g.created is False and drv.layout(GPU) == [PlacedInstance("2g.10gb", 0)]


def test_restart_removes_a_half_made_instance_whose_pod_is_gone(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    drv.create_compute_instance = lambda gpu, gi: (_ for _ in ()).throw(SystemExit())  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        mgr.ensure("pod-a", GPU, "2g.10gb", start=0)
    again = MigManager(drv, tmp_path / "mig.json", clock, idle_after_s=60)
    report = again.reconcile({})
    assert report.destroyed == [f"{GPU} 2g.10gb@0"] and drv.layout(GPU) == []


def test_restart_adopts_unrecorded_instances_for_the_pods_that_hold_them(tmp_path: Path) -> None:
    drv, _, clock = make(tmp_path)
    gi = drv.create_gpu_instance(GPU, "3g.20gb", 4)  # made before gpupool's checkpoint existed
    uuid = drv.create_compute_instance(GPU, gi)
    gi2 = drv.create_gpu_instance(GPU, "1g.5gb", 0)
    drv.create_compute_instance(GPU, gi2)
    mgr = MigManager(drv, tmp_path / "mig.json", clock, idle_after_s=60)
    report = mgr.reconcile({"pod-x": uuid})
    assert sorted(report.adopted) == [f"{GPU} 1g.5gb@0", f"{GPU} 3g.20gb@4"]
    assert mgr.holder("pod-x").start == 4  # type: ignore[union-attr]
    clock.now += 60
    assert mgr.reap().destroyed == [f"{GPU} 1g.5gb@0"]  # the idle one goes, pod-x's stays


def test_restart_drops_what_a_gpu_reset_removed_and_reports_lost_pods(tmp_path: Path) -> None:
    drv, mgr, clock = make(tmp_path)
    granted(mgr.ensure("pod-a", GPU, "1g.5gb", start=0))
    drv.reset(GPU)
    report = MigManager(drv, tmp_path / "mig.json", clock).reconcile({"pod-a": None})
    assert report.lost == [f"{GPU} 1g.5gb@0 of pod pod-a"]


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "mig.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        MigManager(FakeMigDriver({GPU: "A100-40GB"}), tmp_path / "mig.json", Clock())


def test_mig_mode_switch_needs_the_label_and_an_idle_gpu(tmp_path: Path) -> None:
    drv = FakeMigDriver({GPU: "H100-80GB"}, mig_enabled=False)
    _, mgr, _ = make(tmp_path, drv)
    r = mgr.enable_mig(GPU)
    assert isinstance(r, MigRefused) and "gpupool.io/mig-mode-switch=allowed" in r.reason
    assert drv.calls == []
    assert isinstance(mgr.ensure("p", GPU, "1g.10gb"), MigRefused)  # not in MIG mode
    _, allowed, _ = make(tmp_path, drv, allow_mode_switch=True)
    drv.start_process(GPU)
    r = allowed.enable_mig(GPU)
    assert isinstance(r, MigRefused) and "idle GPU" in r.reason and not drv.mig_enabled(GPU)
    drv.stop_process(GPU)
    assert allowed.enable_mig(GPU) is None and drv.mig_enabled(GPU)
    assert mode_switch_allowed({"gpupool.io/mig-mode-switch": "allowed"})
    assert not mode_switch_allowed({})
