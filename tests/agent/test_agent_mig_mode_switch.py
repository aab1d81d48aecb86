"""MIG mode is switched by the agent only where the node's label allows it, only on an idle GPU, and never
off: on the fake MIG driver (one A100-80GB, MIG mode off) through the agent's MIG housekeeping pass and
its inventory."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import MODE_SWITCH_ALLOWED, MODE_SWITCH_LABEL, MigManager, agent_mig_manager
from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_INVENTORY
from tests.agent.agent_helpers import NODE, Rig, rig
from tests.agent.test_agent_mig_wiring import eventually_async

GPU = "GPU-aaaa-0"


class Node:
    def __init__(self, directory: Path) -> None:
        self.driver = FakeMigDriver({GPU: "A100-80GB"}, mig_enabled=False)
        self.checkpoint = directory / "mig.json"

    def manager(self) -> MigManager:
        return MigManager(self.driver, self.checkpoint, lambda: 1000.0, idle_after_s=600)


async def inventory_mig(r: Rig) -> tuple[bool, list[object]]:
    text = (await r.cluster.get_node(NODE))["metadata"]["annotations"][ANN_INVENTORY]
    (gpu,) = [g for g in decode_inventory(text).gpus if g.uuid == GPU]
    return gpu.mig, list(gpu.mig_instances)


async def housekeeping(r: Rig) -> bool:
    service = r.agent.service
    assert service is not None
    return await service.housekeeping()


async def test_without_the_label_no_gpu_is_switched(tmp_path: Path) -> None:
    node = Node(tmp_path)
    async with rig(mig=node.manager) as r:
        assert await housekeeping(r) is False
        assert node.driver.mig_enabled(GPU) is False and node.driver.calls == []
        assert (await inventory_mig(r))[0] is False


async def test_with_the_label_an_idle_gpu_is_switched_and_reported(tmp_path: Path) -> None:
    node = Node(tmp_path)
    async with rig(mig=node.manager) as r:
        await r.cluster.patch_node_labels(NODE, {MODE_SWITCH_LABEL: MODE_SWITCH_ALLOWED})
        assert await housekeeping(r) is True
        assert node.driver.mig_enabled(GPU) is True
        # MIG mode, no instances yet: the scheduler can plan on it
        await eventually_async(lambda: inventory_mig(r), (True, []))
        # the label removed later: MIG mode stays on (never switched off)
        await r.cluster.patch_node_labels(NODE, {MODE_SWITCH_LABEL: None})
        assert await housekeeping(r) is False and node.driver.mig_enabled(GPU) is True
        assert node.driver.calls == [f"set_mig_mode {GPU} True"]


async def test_a_busy_gpu_is_switched_on_a_later_pass_once_idle(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path)
    async with rig(mig=node.manager) as r:
        await r.cluster.patch_node_labels(NODE, {MODE_SWITCH_LABEL: MODE_SWITCH_ALLOWED})
        node.driver.start_process(GPU)
        with caplog.at_level(logging.INFO):
            assert await housekeeping(r) is False
        assert node.driver.mig_enabled(GPU) is False
        assert f"{GPU}: processes are running" in caplog.text
        node.driver.stop_process(GPU)
        assert await housekeeping(r) is True and node.driver.mig_enabled(GPU) is True


def test_switch_idle_gpus_returns_the_refusal_and_needs_the_label(tmp_path: Path) -> None:
    node = Node(tmp_path)
    manager = node.manager()
    assert manager.switch_idle_gpus() == ([], [])  # label absent
    manager.allow_mode_switch = True
    node.driver.start_process(GPU)
    switched, refused = manager.switch_idle_gpus()
    assert switched == [] and [why.reason.split(":")[0] for why in refused] == [GPU]
    node.driver.stop_process(GPU)
    assert manager.switch_idle_gpus() == ([GPU], [])


def test_the_agent_gets_a_mig_manager_where_the_label_allows_switching(tmp_path: Path) -> None:
    class Source:
        def mig_backend(self) -> FakeMigDriver:
            return FakeMigDriver({GPU: "A100-80GB"}, mig_enabled=False)

    assert agent_mig_manager(Source(), tmp_path, idle_after_s=600) is None
    manager = agent_mig_manager(Source(), tmp_path, idle_after_s=600, allow_mode_switch=True)
    assert manager is not None and manager.allow_mode_switch is True
