from __future__ import annotations

from gpupool.agent.devices.slots import preferred, slot_gpu, slot_id


def ids(uuid: str, n: int) -> list[str]:
    return [slot_id(uuid, i) for i in range(n)]


def test_slot_ids_round_trip() -> None:
    assert slot_id("GPU-1", 3) == "GPU-1::3"
    assert slot_gpu("GPU-1::3") == "GPU-1"
    assert slot_gpu("GPU-1") is None and slot_gpu("GPU-1::x") is None and slot_gpu("::1") is None


def test_prefers_one_slot_on_each_granted_gpu() -> None:
    available = ids("A", 4) + ids("B", 4) + ids("C", 4)
    assert preferred(available, [], 1, ["C"]) == ["C::0"]
    assert preferred(available, [], 2, ["C", "A"]) == ["C::0", "A::0"]


def test_must_include_first_then_granted_then_anything() -> None:
    available = ids("A", 2) + ids("B", 2)
    assert preferred(available, ["A::1"], 2, ["B"]) == ["A::1", "B::0"]
    # granted GPU has no free slot left: fall back to other free slots, never return fewer than asked
    assert preferred(ids("A", 2), [], 1, ["B"]) == ["A::0"]
    assert preferred(available, [], 3, []) == ["A::0", "A::1", "B::0"]
