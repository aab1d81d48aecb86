"""The chart's values for moves the scheduler starts itself (scheduler.moves: makeRoom and the background
defragmenter) reach the scheduler's configuration; off by default; the defragmenter only with one replica."""

from __future__ import annotations

from pathlib import Path

from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config import load_config as scheduler_config
from tests.deploy.conftest import CHART, Render, run_helm
from tests.deploy.test_chart_render import container, env_of


def test_the_default_render_leaves_moves_off(render: Render) -> None:
    sched = scheduler_config(env=env_of(container(render(), "scheduler", "extender")))
    defaults = SchedulerConfig()
    assert (sched.make_room_moves, sched.defrag_moves) == (0, 0)
    assert (sched.defrag_threshold, sched.defrag_interval_s, sched.defrag_gib) == \
        (defaults.defrag_threshold, defaults.defrag_interval_s, defaults.defrag_gib)


def test_the_values_reach_the_scheduler_s_config(render: Render) -> None:
    values = {"scheduler": {"moves": {"makeRoom": 2, "defrag": {"moves": 6, "threshold": 0.35,
                                                                 "intervalSeconds": 45, "gib": 12.5}}}}
    sched = scheduler_config(env=env_of(container(render(values), "scheduler", "extender")))
    assert (sched.make_room_moves, sched.defrag_moves, sched.defrag_threshold, sched.defrag_interval_s,
            sched.defrag_gib) == (2, 6, 0.35, 45.0, 12.5)


def test_the_defragmenter_with_several_replicas_is_refused(helm: Path) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), "--set", "scheduler.moves.defrag.moves=4",
                   "--set", "scheduler.replicas=2")
    assert out.returncode != 0 and "scheduler.moves.defrag.moves needs scheduler.replicas 1" in out.stderr
    ok = run_helm(helm, "template", "gp", str(CHART), "--set", "scheduler.moves.makeRoom=2",
                  "--set", "scheduler.replicas=2")
    assert ok.returncode == 0, ok.stderr


def test_out_of_range_values_are_refused(helm: Path) -> None:
    for setting, where in (("scheduler.moves.makeRoom=9", "/scheduler/moves/makeRoom"),
                           ("scheduler.moves.defrag.moves=-1", "/scheduler/moves/defrag/moves"),
                           ("scheduler.moves.defrog.moves=1", "additional properties 'defrog' not allowed")):
        out = run_helm(helm, "template", "gp", str(CHART), "--set", setting)
        assert out.returncode != 0 and where in out.stderr, (setting, out.stderr)
