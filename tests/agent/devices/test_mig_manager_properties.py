"""Property: under random allocate / end / process / idle-time / crash sequences on the fake MIG driver,
the manager never destroys an instance a live pod was given, every instance on the GPUs is valid for its
model and none overlap, and after a restart the checkpoint and NVML agree."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import MigGranted, MigManager
from gpupool.core.mig import MODELS, layout_problems

GPUS = {"GPU-prop0001": "A100-40GB", "GPU-prop0002": "H100-80GB"}
MUTATING = ("create_gpu_instance", "create_compute_instance", "destroy_compute_instance", "destroy_gpu_instance")


class Crash(BaseException):
    """The agent process dies (BaseException: nothing in the manager may swallow it)."""


class Watched:
    """The fake driver, plus: a crash after the n-th mutating call (the call itself took effect), and a
    check on every destroy that no live pod holds the instance."""

    def __init__(self, driver: FakeMigDriver, held: dict[str, str]) -> None:
        self.driver, self.held = driver, held
        self.crash_in: int | None = None

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.driver, name)
        if name not in MUTATING:
            return real

        def call(*args: Any) -> Any:
            if name.startswith("destroy"):
                gpu, gi = args
                uuid = next((i.uuid for i in self.driver.instances(gpu) if i.gi_id == gi), None)
                assert uuid is None or uuid not in self.held.values(), f"destroyed {uuid} held by a live pod"
            result = real(*args)
            if self.crash_in is not None:
                self.crash_in -= 1
                if self.crash_in <= 0:
                    self.crash_in = None
                    raise Crash()
            return result

        return call


ops = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 7), st.sampled_from(sorted(GPUS)), st.integers(0, 6),
              st.one_of(st.none(), st.integers(0, 6))),
    st.tuples(st.just("end"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([10, 30, 61, 300])),
    st.tuples(st.just("crash"), st.integers(1, 3)),
    st.tuples(st.just("restart")),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=40))
def test_manager_never_destroys_a_held_instance(steps: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        driver = FakeMigDriver(dict(GPUS))
        held: dict[str, str] = {}  # live pod -> MIG UUID it was given
        live: set[str] = set()  # pods bound to the node (given a device or still waiting for one)
        backend = Watched(driver, held)
        now = [0.0]
        path = Path(tmp) / "mig.json"

        def fresh() -> MigManager:
            mgr = MigManager(backend, path, lambda: now[0], idle_after_s=60)  # type: ignore[arg-type]
            mgr.reconcile({p: held.get(p) for p in live})
            return mgr

        mgr = fresh()
        for step in steps:
            try:
                if step[0] == "alloc":
                    _, k, gpu, prof, start = step
                    pod = f"pod-{k}"
                    model = MODELS[GPUS[gpu]]
                    profile = model.profiles[prof % len(model.profiles)].name
                    if pod in held:
                        continue
                    live.add(pod)
                    r = mgr.ensure(pod, gpu, profile, start)
                    if isinstance(r, MigGranted):
                        assert r.uuid not in held.values()
                        held[pod] = r.uuid
                    else:
                        live.discard(pod)  # the scheduler moves the pod elsewhere
                        mgr.release(pod)
                elif step[0] == "end":
                    _, k, linger = step
                    pod = f"pod-{k}"
                    if pod in held and linger:
                        driver.start_process(held[pod])  # a process outlives the pod for a while
                    held.pop(pod, None)
                    live.discard(pod)
                    mgr.release(pod)
                elif step[0] == "tick":
                    now[0] += step[1]
                    for gpu in GPUS:  # lingering processes end after a tick
                        for inst in driver.instances(gpu):
                            if inst.uuid and inst.uuid not in held.values():
                                driver.clear_processes(inst.uuid)
                    mgr.reap()
                elif step[0] == "crash":
                    backend.crash_in = step[1]
                else:
                    mgr = fresh()
            except Crash:
                event("agent crashed")
                mgr = fresh()
            for gpu, model in GPUS.items():
                assert layout_problems(MODELS[model], driver.layout(gpu)) == []
            on_gpus = {i.uuid for g in GPUS for i in driver.instances(g)}
            assert set(held.values()) <= on_gpus  # nobody's device vanished
        backend.crash_in = None
        mgr = fresh()
        # after a clean restart the checkpoint and NVML describe the same instances
        for gpu in GPUS:
            nvml = sorted((i.profile, i.start, i.uuid) for i in driver.instances(gpu))
            mine = sorted((e.profile, e.start, e.uuid) for e in mgr.entries if e.gpu == gpu)
            assert nvml == mine
        for pod, uuid in held.items():
            assert mgr.holder(pod) is not None and mgr.holder(pod).uuid == uuid  # type: ignore[union-attr]
