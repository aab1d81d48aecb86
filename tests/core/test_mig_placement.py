"""MIG placement on A100-40GB (slices 0-7; 1g anywhere in 0-6, 2g at 0/2/4, 3g at 0/4, 4g and 7g at 0)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.mig import MODELS, layout_problems
from gpupool.core.mig_placement import (
    MigChoice,
    MigGPU,
    MigInstance,
    MigRefusal,
    choose,
    fragmentation,
    observed_demand,
    options,
)

A100 = "A100-40GB"


def chosen(result: MigChoice | MigRefusal) -> MigChoice:
    assert isinstance(result, MigChoice), result
    return result


def test_prefers_the_start_that_keeps_a_larger_profile_possible() -> None:
    gpu = MigGPU(A100, (MigInstance("3g.20gb", 0, used=True),))
    # 1g at 4 or 5 would block the only free 2g start (4); at 6 it leaves 2g@4 possible
    c = chosen(choose([gpu], "1g.5gb", {"2g.10gb": 1.0}))
    assert (c.gpu, c.option.start, c.option.reuse) == (0, 6, False)
    # first fit takes the lowest free start instead
    assert chosen(choose([gpu], "1g.5gb", {"2g.10gb": 1.0}, first_fit=True)).option.start == 4


def test_keeps_the_4g_start_free_when_4g_is_expected() -> None:
    # 4g.20gb can only start at 0, so a 1g anywhere in 0-3 would make it impossible on this GPU
    c = chosen(choose([MigGPU(A100)], "1g.5gb", observed_demand(["4g.20gb", "1g.5gb"])))
    assert c.option.start >= 4


def test_fragmentation_counts_idle_slices_the_demand_cannot_use() -> None:
    gpu = MigGPU(A100, (MigInstance("1g.5gb", 6, used=True),))
    # idle slices 0-5 and 7 (7 of them); 4g can use 0-3 -> 3 slices are a fragment for it
    assert fragmentation(gpu, {"4g.20gb": 1.0}) == 3
    # 7g can use none of them
    assert fragmentation(gpu, {"7g.40gb": 1.0}) == 7
    assert fragmentation(gpu, {"4g.20gb": 0.5, "7g.40gb": 0.5}) == 5


def test_reuses_an_idle_instance_of_the_profile() -> None:
    gpu = MigGPU(A100, (MigInstance("3g.20gb", 0, used=True), MigInstance("2g.10gb", 4, used=False)))
    assert [(o.start, o.reuse) for o in options(gpu, "2g.10gb")] == [(4, True)]  # slots 6-7 admit no 2g
    c = chosen(choose([gpu], "2g.10gb", {"2g.10gb": 1.0}))
    assert (c.option.start, c.option.reuse) == (4, True)


def test_a_full_gpu_refuses_with_a_reason() -> None:
    full = MigGPU(A100, (MigInstance("7g.40gb", 0, used=True),))
    r = choose([full], "1g.5gb", {"1g.5gb": 1.0})
    assert isinstance(r, MigRefusal) and "no GPU" in r.reason
    assert isinstance(choose([full], "3g.40gb", {}), MigRefusal)


def test_a_partly_used_gpu_goes_before_an_empty_one_when_whole_gpus_are_expected() -> None:
    empty = MigGPU(A100)
    partly = MigGPU(A100, (MigInstance("4g.20gb", 0, used=True),))
    # on the empty GPU a 3g would spoil a future 7g (8 slices lost to it); on the other, nothing is lost
    c = chosen(choose([empty, partly], "3g.20gb", {"7g.40gb": 0.5, "3g.20gb": 0.5}))
    assert (c.gpu, c.option.start) == (1, 4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([p.name for p in MODELS[A100].profiles]), st.booleans(),
                          st.integers(0, 2)), max_size=30),
       st.booleans())
def test_every_planned_instance_is_valid_and_none_overlap(steps: list[tuple[str, bool, int]], first_fit: bool) -> None:
    gpus = [MigGPU(A100), MigGPU(A100), MigGPU(A100)]
    demand = observed_demand(s[0] for s in steps)
    for profile, release, k in steps:
        if release and gpus[k].instances:  # a pod ends: its instance becomes idle (kept for reuse)
            i = gpus[k].instances[0]
            gpus[k] = gpus[k].with_instance(i.profile, i.start, used=False)
            continue
        c = choose(gpus, profile, demand, first_fit)
        if isinstance(c, MigChoice):
            before = gpus[c.gpu]
            assert not any(i.start == c.option.start and i.used for i in before.instances)
            gpus[c.gpu] = before.with_instance(c.option.profile, c.option.start)
    for g in gpus:
        assert layout_problems(MODELS[A100], g.layout) == []


def test_a_claim_takes_its_slices_and_drops_idle_instances_in_its_way() -> None:
    # idle 1g.5gb at 4 and 5 lie under a new 2g.10gb@4; the used 3g at 0 and the idle 1g at 6 stay
    gpu = MigGPU("A100-40GB", (MigInstance("3g.20gb", 0, True), MigInstance("1g.5gb", 4), MigInstance("1g.5gb", 5),
                               MigInstance("1g.5gb", 6)))
    after = gpu.with_claim("2g.10gb", 4)
    assert after.instances == (MigInstance("1g.5gb", 6), MigInstance("2g.10gb", 4, True),
                               MigInstance("3g.20gb", 0, True))
    # an idle instance of the claimed profile at that start is taken, not replaced
    assert gpu.with_claim("1g.5gb", 6).instances[1:] == (MigInstance("1g.5gb", 5), MigInstance("1g.5gb", 6, True),
                                                         MigInstance("3g.20gb", 0, True))


def test_first_fit_from_the_highest_start_takes_the_top_slot_as_gpupools_dra_order_lists_it() -> None:
    """An empty A100-40GB: first fit puts a 1g.5gb at slice 0 (blocking the 4g and 7g starts), the DRA
    device order at slice 6; a 3g.20gb at 0 and at 4 respectively."""
    gpu = MigGPU("A100-40GB")
    assert chosen(choose([gpu], "1g.5gb", {}, first_fit=True)).option.start == 0
    assert chosen(choose([gpu], "1g.5gb", {}, first_fit=True, highest_start=True)).option.start == 6
    assert chosen(choose([gpu], "3g.20gb", {}, first_fit=True, highest_start=True)).option.start == 4
