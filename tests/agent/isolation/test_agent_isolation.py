"""Isolation modes as strategies on the node: one protocol (check, prepare, grant, release), used by
Allocate, the watchdog and the inventory."""

from __future__ import annotations

from pathlib import Path

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.devices.mps import MpsSupervisor
from gpupool.agent.isolation.base import ISOLATION_MODES, GrantRequest, Isolation, Refused, merged_inventory
from gpupool.agent.isolation.grant import ContainerGrant, answer, grant_request
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.state.hookdir import (
    NvmlScales,
    accounting_dir,
    container_dir,
    hook_paths,
    limits_dir,
    read_limits,
)
from gpupool.api.allocation import AllocationDoc, GrantDoc
from tests.agent.agent_helpers import RESOURCE, answering_mps, eventually, pod_object, rig, scheduler_binds

DEVICES = {"G0": DeviceInfo(uuid="G0", index=0, model="A100", memory_mib=40960)}


def _doc(isolation: str, memory: int = 1024, cores: float = 10.0) -> AllocationDoc:
    return AllocationDoc(pod_uid="u-1", node="n", isolation=isolation,
                         gpus=[GrantDoc(uuid="G0", index=0, memory_mib=memory, cores=cores)])


def _request(config: AgentConfig, strategies: dict[str, Isolation], isolation: str,
             memory: int = 1024, cores: float = 10.0) -> tuple[Isolation, GrantRequest]:
    found = grant_request(_doc(isolation, memory, cores), "main", DEVICES, {}, config, "ns/p", strategies)
    assert not isinstance(found, Refused), found
    return found


def test_one_strategy_per_mode_and_only_the_hook_has_a_second_line() -> None:
    strategies = node_strategies(AgentConfig(node_name="n"))
    assert sorted(strategies) == sorted(ISOLATION_MODES)
    assert {name for name, s in strategies.items() if s.second_line} == {"hook"}
    refused = grant_request(_doc("magic"), "main", DEVICES, {}, AgentConfig(node_name="n"), "ns/p", strategies)
    assert isinstance(refused, Refused) and "unknown isolation 'magic' (use hook, mig, mps, none)" in refused.reason


async def test_mps_prepare_refuses_without_a_daemon_and_asks_for_a_retry_while_it_restarts(tmp_path: Path) -> None:
    config = AgentConfig(node_name="n")
    strategy, request = _request(config, node_strategies(config), "mps")
    no_daemons = await strategy.prepare(request)
    assert isinstance(no_daemons, Refused) and not no_daemons.retry and "runs no MPS daemons" in no_daemons.reason
    supervisor: MpsSupervisor = answering_mps(tmp_path, ["G0"])
    strategy, request = _request(config, node_strategies(config, mps=supervisor), "mps")
    down = await strategy.prepare(request)
    assert isinstance(down, Refused) and down.retry  # not started yet: it will be
    supervisor.start_all()
    prepared = await strategy.prepare(request)
    assert not isinstance(prepared, Refused)
    grant = answer(strategy, request, prepared)
    assert isinstance(grant, ContainerGrant) and grant.mps_gpu == "G0"
    inventory = merged_inventory(node_strategies(config, mps=supervisor).values())
    assert inventory == {"G0": {"mps": "up", "mps_restarts": 0}}
    # a whole GPU needs no daemon
    strategy, whole = _request(config, node_strategies(config), "mps", memory=40960, cores=100.0)
    assert not isinstance(await strategy.prepare(whole), Refused)


async def test_mig_prepare_refuses_where_the_node_has_no_mig_manager() -> None:
    config = AgentConfig(node_name="n")
    strategy, request = _request(config, node_strategies(config), "mig")
    refused = await strategy.prepare(request)
    assert isinstance(refused, Refused) and "manages no MIG devices" in refused.reason


async def test_hook_release_removes_the_directories_of_pods_gone_from_the_node_only(tmp_path: Path) -> None:
    config = AgentConfig(node_name="n", hook_root=tmp_path)
    pods = hook_paths(tmp_path).pods
    for uid in ("running", "terminating", "gone"):
        (pods / uid / "main").mkdir(parents=True)
    listed = [{"metadata": {"uid": "running"}, "spec": {"nodeName": "n"}},
              {"metadata": {"uid": "terminating", "deletionTimestamp": "2026-11-27T06:00:00Z"},
               "spec": {"nodeName": "n"}}]  # its container may still run: its directories stay
    await node_strategies(config)["hook"].release(listed, "n")
    assert sorted(p.name for p in pods.iterdir()) == ["running", "terminating"]


async def test_the_agent_releases_a_deleted_pods_hook_directory_without_waiting_for_an_allocate() -> None:
    async with rig(mig_interval_s=0.05) as r:
        pods_dir = hook_paths(r.config.hook_root).pods
        pods_dir.mkdir(parents=True)  # as `gpupool agent` leaves it after installing the library
        p = await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 8192, 25.0)])
        await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        uid = p["metadata"]["uid"]
        assert (pods_dir / uid / "main").is_dir()
        await r.cluster.delete_pod("default", "a")
        await eventually(lambda: not (pods_dir / uid).exists())


async def test_allocate_writes_the_containers_limits_file_before_answering_and_mounts_it_read_only() -> None:
    async with rig() as r:
        pods_dir = hook_paths(r.config.hook_root).pods
        pods_dir.mkdir(parents=True)  # as `gpupool agent` leaves it after installing the library
        p = await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-2", 2, 8192, 25.0)])
        served = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-2::0"])
        directory = pods_dir / p["metadata"]["uid"] / "main"
        mounts = {m.container_path: (m.host_path, m.read_only) for m in served.mounts}
        assert mounts["/run/gpupool/limits"] == (str(limits_dir(directory)), True)
        assert mounts["/run/gpupool/hook"] == (str(accounting_dir(directory)), False)
        written = read_limits(limits_dir(directory))
        assert written is not None
        # 8192 MiB in bytes; 25 % in parts per million; mode 0 = hard; one GPU
        got = (written["limit"][0], written["cores"][0], written["mode"], written["ndev"])
        assert got == (8192 << 20, 250_000, 0, 1)


async def test_a_hook_containers_limits_carry_the_nvml_scale_measured_on_its_own_gpu(tmp_path: Path) -> None:
    config = AgentConfig(node_name="n", hook_root=tmp_path)
    hook_paths(tmp_path).pods.mkdir(parents=True)  # where `gpupool agent` installed the library
    scales = NvmlScales({"G1": 1_250_000})  # measured on another GPU only: nothing for G0
    strategy, request = _request(config, node_strategies(config, nvml_scales=scales), "hook")
    assert not isinstance(await strategy.prepare(request), Refused)
    written = read_limits(limits_dir(container_dir(tmp_path, "u-1", "main")))
    assert written is not None and written["nvml_scale"] == [0] * 16
    scales.by_gpu = {"G1": 1_250_000, "G0": 1_600_000}  # a later probe measured G0 (the whole map replaced)
    assert not isinstance(await strategy.prepare(request), Refused)
    written = read_limits(limits_dir(container_dir(tmp_path, "u-1", "main")))
    assert written is not None and written["nvml_scale"] == [1_600_000] + [0] * 15
