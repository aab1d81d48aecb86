"""Which profile a request gets (H100-80GB sizes: 1g.10gb 9984 MiB, 1g.20gb/2g.20gb 20090 MiB, 3g/4g 40448)."""

from __future__ import annotations

from gpupool.core.mig import mig_model
from gpupool.core.mig_request import ProfileRefusal, grant_share, profile_by_name, profile_for, smallest_profile
from gpupool.core.model import GPURequest


def name(result: object) -> str:
    assert not isinstance(result, ProfileRefusal), result
    return result.name  # type: ignore[attr-defined]


def test_memory_picks_the_fewest_slices_that_hold_it() -> None:
    assert name(smallest_profile("H100-80GB", memory_mib=9000)) == "1g.10gb"
    # 10 GiB = 10240 MiB > 9984 of 1g.10gb; 1g.20gb (2 slices, 1 compute) beats 2g.20gb (2 slices, 2 compute)
    assert name(smallest_profile("H100-80GB", memory_mib=10240)) == "1g.20gb"


def test_cores_count_in_sevenths() -> None:
    # 30 % lies between 2/7 = 28.6 % and 3/7 = 42.9 %: 3g.40gb
    assert name(smallest_profile("H100-80GB", cores_percent=30)) == "3g.40gb"
    # exactly 3/7 of the GPU must not be lost to rounding
    assert name(smallest_profile("H100-80GB", cores_percent=300 / 7)) == "3g.40gb"
    assert name(smallest_profile("H100-80GB", cores_percent=100)) == "7g.80gb"


def test_memory_and_cores_together() -> None:
    # 20000 MiB fits 1g.20gb, but 20 % needs 2 compute slices: 2g.20gb
    assert name(smallest_profile("H100-80GB", memory_mib=20000, cores_percent=20)) == "2g.20gb"


def test_media_profiles_are_never_picked_by_size() -> None:
    assert name(smallest_profile("A100-40GB", memory_mib=1)) == "1g.5gb"


def test_too_large_or_bad_requests_are_refused_with_a_reason() -> None:
    r = smallest_profile("H100-80GB", memory_mib=90000)
    assert isinstance(r, ProfileRefusal) and "7g.80gb" in r.reason
    assert isinstance(smallest_profile("H100-80GB", cores_percent=0), ProfileRefusal)
    assert isinstance(smallest_profile("H100-80GB", memory_mib=-5), ProfileRefusal)
    r = smallest_profile("T4", memory_mib=1000)
    assert isinstance(r, ProfileRefusal) and "H100-80GB" in r.reason


def test_profile_by_name_is_checked_against_the_model() -> None:
    assert name(profile_by_name("H100-80GB", "3g.40gb")) == "3g.40gb"
    r = profile_by_name("H100-80GB", "3g.20gb")
    assert isinstance(r, ProfileRefusal) and "does not exist on H100-80GB" in r.reason and "3g.40gb" in r.reason
    assert name(profile_by_name("A100-40GB", "3g.20gb")) == "3g.20gb"


def test_profile_for_a_pod_request() -> None:
    # no share = the whole GPU = 100 % = the full profile
    assert name(profile_for("A100-40GB", GPURequest(count=1))) == "7g.40gb"
    # memory only (the reader's 1 milli): the smallest by memory, 4000 MiB -> 1g.5gb (4864 MiB)
    assert name(profile_for("A100-40GB", GPURequest(count=1, milli=1, memory_mib=4000))) == "1g.5gb"
    # a named profile is what a pod without a share gets, and must hold an explicit share
    assert name(profile_for("A100-40GB", GPURequest(count=1), "3g.20gb")) == "3g.20gb"
    too_small = profile_for("A100-40GB", GPURequest(count=1, milli=500), "3g.20gb")
    assert isinstance(too_small, ProfileRefusal) and "42.9 % of the compute, less than the 50 %" in too_small.reason
    little = profile_for("A100-40GB", GPURequest(count=1, milli=1, memory_mib=12000), "2g.10gb")
    assert isinstance(little, ProfileRefusal) and "9850 MiB, less than the 12000 MiB" in little.reason
    # grant: compute slices / 7 rounded down (3g: 3000 // 7 = 428), so 4g + 3g = 999 <= 1000
    a100 = mig_model("A100-40GB")
    assert a100 is not None
    shares = {p.name: grant_share(a100, p) for p in a100.profiles}
    assert shares["3g.20gb"] == (428, 19968) and shares["4g.20gb"] == (571, 19968)
    assert shares["7g.40gb"] == (1000, 40192)
