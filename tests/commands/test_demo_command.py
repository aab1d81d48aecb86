"""`gpupool demo` end to end: embedded cluster, extender over HTTP, fake kube-scheduler, summary."""

from __future__ import annotations

from click.testing import CliRunner

from gpupool.commands.demo import demo
from gpupool.demo.embedded import load_scenario, node_objects

SCENARIO = """
version: 1
name: tiny
seed: 3
nodes:
  - {prefix: h100x8, count: 2, model: H100-80GB, gpus: 8, gpu_memory_mib: 81559, nvlink: true, cpu: 192}
  - {prefix: t4x1, count: 3, model: T4-16GB, gpus: 1, gpu_memory_mib: 15360, cpu: 16}
workload:
  pods: 40
  mix:
    - {weight: 3, gpu: 1, cores: 25, memory_mib: 4096}
    - {weight: 1, gpu: 8, models: [H100-80GB]}
"""


def test_demo_schedules_the_workload_and_reports_a_consistent_ledger(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    result = CliRunner().invoke(demo, ["--scenario", str(path), "--pods", "40"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "extender listening on http://127.0.0.1:" in out
    assert "pods submitted" in out and "40" in out
    assert "consistent" in out
    # 2 x 8 H100 + 3 T4 = 19 GPUs: at most 2 of the 8-GPU jobs fit, so some pods stay unschedulable or all
    # 40 are bound; either way the numbers add up.
    bound = int(out.split("bound")[1].split()[1])
    unschedulable = int(out.split("unschedulable")[1].split()[1])
    assert bound + unschedulable == 40 and bound > 0


def test_demo_rejects_a_bad_scenario_with_a_clear_message(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nnodes: []\nworkload: {mix: []}\n")
    result = CliRunner().invoke(demo, ["--scenario", str(path)])
    assert result.exit_code == 2
    assert "scenario" in result.output and "nodes" in result.output


def test_default_scenario_ships_with_the_package_and_has_nvlink_nodes():
    scenario = load_scenario()
    assert 200 <= scenario.node_count <= 1000
    models = {g.model for g in scenario.nodes if g.nvlink and g.gpus == 8}
    assert {"H100-80GB", "A100-80GB"} <= models
    scaled = scenario.scaled(1000)
    assert scaled.node_count == 1000
    assert len(node_objects(scaled)) == 1000
