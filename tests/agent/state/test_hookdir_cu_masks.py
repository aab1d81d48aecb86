"""cu_masks.v1, the CUs each GPU of an AMD container may use (gpupool.agent.state.hookdir): the bytes the HIP
library reads (native/hip/gph.h), written atomically, read back, and garbled files refused."""

from __future__ import annotations

import stat
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.state.hookdir import (
    CU_MASKS_FILE,
    CU_MASKS_SIZE,
    CuMask,
    cu_masks_bytes,
    parse_cu_masks,
    read_cu_masks,
    write_cu_masks,
)


def test_the_file_is_2192_bytes_with_the_header_and_one_136_byte_entry_per_device() -> None:
    # 25 % of an MI300X: CUs 0..75 of 304 = words 0 and 1 full, word 2 the low 12 bits (76 - 64)
    data = cu_masks_bytes([CuMask(304, frozenset(range(76))), None, CuMask(80, frozenset({0, 33, 79}))])
    assert len(data) == CU_MASKS_SIZE == 2192
    assert data[:8] == b"GPCUMSK1"
    assert struct.unpack_from("<QII", data, 0) == (0x314B534D55435047, 1, 3)
    assert struct.unpack_from("<II4I", data, 16) == (304, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFF, 0)
    assert data[16 + 136:16 + 2 * 136] == bytes(136)  # None: ncu 0, no bits
    # CU 0 -> word 0 bit 0; 33 -> word 1 bit 1; 79 -> word 2 bit 15
    assert struct.unpack_from("<II3I", data, 16 + 2 * 136) == (80, 0, 1, 2, 1 << 15)
    assert data[16 + 3 * 136:] == bytes(CU_MASKS_SIZE - 16 - 3 * 136)


def test_written_atomically_readable_by_all_writable_by_the_agent_only(tmp_path: Path) -> None:
    limits = tmp_path / "limits"
    masks = (CuMask(304, frozenset(range(76, 152))), None)
    write_cu_masks(limits, masks)
    path = limits / CU_MASKS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(limits.stat().st_mode) == 0o755
    assert sorted(p.name for p in limits.iterdir()) == [CU_MASKS_FILE]  # no temporary file left
    assert read_cu_masks(path) == masks
    inode = path.stat().st_ino
    write_cu_masks(limits, [None])
    assert path.stat().st_ino != inode  # replaced, not rewritten in place: a reader sees one file or the other
    assert read_cu_masks(path) == (None,)


@pytest.mark.parametrize(("card", "cus", "what"), [
    (0, {0}, "outside 1..1024"),
    (1025, {0}, "outside 1..1024"),
    (304, set(), "empty"),
    (304, {304}, "outside the card's 0..303"),
    (304, {-1}, "outside the card's 0..303"),
])
def test_a_mask_the_card_cannot_hold_is_refused(card: int, cus: set[int], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        CuMask(card, frozenset(cus))


def test_more_than_16_devices_is_refused() -> None:
    with pytest.raises(ValueError, match="17 GPUs"):
        cu_masks_bytes([None] * 17)


def _garble(offset: int, fmt: str, *values: int) -> bytes:
    data = bytearray(cu_masks_bytes([CuMask(304, frozenset(range(76)))]))
    struct.pack_into(fmt, data, offset, *values)
    return bytes(data)


@pytest.mark.parametrize(("data", "what"), [
    (cu_masks_bytes([None])[:-1], "2191 bytes"),
    (cu_masks_bytes([None]) + b"\0", "2193 bytes"),
    (_garble(0, "<Q", 0x314C4F4F50555047), "not a version 1"),  # limits.v1's magic
    (_garble(8, "<I", 2), "not a version 1"),
    (_garble(12, "<I", 17), "17 devices"),
    (_garble(20, "<I", 1), "reserved"),
    (_garble(16, "<I", 1025), "does not fit"),
    (_garble(16, "<I", 75), "does not fit"),  # CU 75 set on a card of 75
    (_garble(16, "<I", 0), "without a CU count"),
    (_garble(24, "<3I", 0, 0, 0), "does not fit"),  # ncu 304 with no CU at all
])
def test_a_garbled_file_is_refused_naming_the_fault(data: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        parse_cu_masks(data, "here")


def test_reading_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / CU_MASKS_FILE
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=str(path)):
        read_cu_masks(path)
    with pytest.raises(OSError):
        read_cu_masks(tmp_path / "absent")


_MASK = st.integers(1, 1024).flatmap(
    lambda n: st.builds(CuMask, st.just(n), st.frozensets(st.integers(0, n - 1), min_size=1)))


@given(st.lists(st.none() | _MASK, max_size=16))
def test_every_mask_reads_back_as_written(masks: list[CuMask | None]) -> None:
    data = cu_masks_bytes(masks)
    assert parse_cu_masks(data) == tuple(masks)
    for i, mask in enumerate(masks):  # bit j of the entry is CU j, straight from the bytes
        ncu, _, *words = struct.unpack_from("<II32I", data, 16 + 136 * i)
        assert ncu == (mask.card_cus if mask else 0)
        assert {j for j in range(1024) if words[j // 32] >> (j % 32) & 1} == (mask.cus if mask else set())
