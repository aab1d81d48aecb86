"""MIG geometry: hand-checked layouts from the reference tables (§1.3), and invariants of every layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.mig import MODELS, PlacedInstance, can_add, layout_problems, maximal_layouts, mig_model, occupied

A100 = MODELS["A100-40GB"]


def lay(*items: tuple[str, int]) -> tuple[PlacedInstance, ...]:
    return tuple(PlacedInstance(p, s) for p, s in items)


def test_4g_beside_3g_is_valid() -> None:
    # 4g.20gb takes slices 0-3 (its only start), 3g.20gb takes 4-7: no overlap, 4+3 = 7 compute slices
    assert layout_problems(A100, lay(("4g.20gb", 0), ("3g.20gb", 4))) == []


def test_4g_cannot_start_at_slot_4() -> None:
    problems = layout_problems(A100, lay(("4g.20gb", 4)))
    assert problems == ["4g.20gb cannot start at slot 4 (allowed: 0)"]


def test_seven_1g_leave_slot_7_empty_and_nothing_else_fits() -> None:
    seven = lay(*(("1g.5gb", s) for s in range(7)))
    assert layout_problems(A100, seven) == []
    assert occupied(A100, seven) == 0b0111_1111  # slots 0-6 taken, slot 7 free
    # slot 7 cannot be used: no 1-slice profile may start there, every wider one overlaps slot 6
    assert all(not can_add(A100, seven, p, s) for p in A100.profiles for s in p.starts)
    assert tuple(sorted(seven)) in {tuple(sorted(x)) for x in maximal_layouts("A100-40GB")}


def test_user_guide_3_2_1_1_layout_is_valid() -> None:
    # 3g at 4-7, 2g at 0-1, 1g at 2 and 3: the table admits each start, and the runs are disjoint
    assert layout_problems(A100, lay(("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3))) == []


def test_invalid_layouts_say_why() -> None:
    assert layout_problems(A100, lay(("1g.5gb", 7))) == ["1g.5gb cannot start at slot 7 (allowed: 0, 1, 2, 3, 4, 5, 6)"]
    assert layout_problems(A100, lay(("3g.20gb", 0), ("4g.20gb", 0))) == ["4g.20gb at slot 0 overlaps another instance"]
    assert layout_problems(A100, lay(("1g.5gb+me", 0), ("1g.5gb+me", 1))) == [
        "more than one +me instance (the GPU has one set of media engines)", "more than 1 instance(s) of 1g.5gb+me"]
    assert layout_problems(A100, lay(("3g.40gb", 0))) == ["3g.40gb: not a profile of A100-40GB"]


def test_reference_example_layouts_are_maximal() -> None:
    found = {tuple(sorted(x)) for x in maximal_layouts("A100-40GB")}
    for example in (
        lay(("4g.20gb", 0), ("3g.20gb", 4)),
        lay(("3g.20gb", 0), ("3g.20gb", 4)),
        lay(("2g.10gb", 4), ("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3), ("1g.5gb", 6)),
        lay(("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6)),
        lay(("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6)),
        lay(("7g.40gb", 0)),
    ):
        assert tuple(sorted(example)) in found, example


def test_every_maximal_layout_is_valid_and_cannot_grow() -> None:
    for name, model in MODELS.items():
        layouts = maximal_layouts(name)
        assert len(set(layouts)) == len(layouts) > 0
        for layout in layouts:
            assert layout_problems(model, layout) == [], (name, layout)
            assert not any(can_add(model, layout, p, s) for p in model.profiles for s in p.starts), (name, layout)


def test_models_have_the_reference_geometry() -> None:
    for name in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200", "GH200-96GB", "GH200-144GB", "B200"):
        m = MODELS[name]
        assert (m.memory_slices, m.compute_slices) == (8, 7)
        shape = [(p.compute_slices, p.memory_slices, p.starts, p.max_count) for p in m.profiles]
        assert shape == [(1, 1, (0, 1, 2, 3, 4, 5, 6), 7), (1, 1, (0, 1, 2, 3, 4, 5, 6), 1), (1, 2, (0, 2, 4, 6), 4),
                         (2, 2, (0, 2, 4), 3), (3, 4, (0, 4), 2), (4, 4, (0,), 1), (7, 8, (0,), 1)]
    assert [p.name for p in MODELS["H100-80GB"].profiles] == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert MODELS["H100-80GB"].profile("3g.40gb").memory_mib == 40448  # type: ignore[union-attr]  # 39.50 GiB
    # what the reference marks as inferred is marked here too
    assert MODELS["H200"].inferred and MODELS["B200"].inferred and MODELS["A30-24GB"].inferred
    assert "inferred" in MODELS["B200"].profile("3g.90gb").inferred  # type: ignore[union-attr]
    assert MODELS["H100-80GB"].inferred == ""


def test_nvml_names_map_to_models() -> None:
    assert mig_model("NVIDIA H100 80GB HBM3") is MODELS["H100-80GB"]
    assert mig_model("a100-40gb") is MODELS["A100-40GB"]
    assert mig_model("NVIDIA T4") is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(MODELS)), st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7)), max_size=20))
def test_instances_added_one_by_one_stay_valid_and_disjoint(model_name: str, steps: list[tuple[int, int]]) -> None:
    model = MODELS[model_name]
    layout: tuple[PlacedInstance, ...] = ()
    for k, start in steps:
        profile = model.profiles[k % len(model.profiles)]
        if can_add(model, layout, profile, start):
            layout = (*layout, PlacedInstance(profile.name, start))
    # checked independently of layout_problems: explicit slice sets, allowed starts, compute budget
    seen: set[int] = set()
    compute = 0
    for inst in layout:
        p = model.profile(inst.profile)
        assert p is not None and inst.start in p.starts
        cells = set(range(inst.start, inst.start + p.memory_slices))
        assert not cells & seen and max(cells) < model.memory_slices
        seen |= cells
        compute += p.compute_slices
    assert compute <= model.compute_slices
