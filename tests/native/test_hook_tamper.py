"""A hostile tenant inside a `hook` pod (issue 26): every way it tried to get more than its grant is refused
or counted. The pod is granted as the agent grants it: limits.v1 from the agent's writer, handed to the
process read-only at the library's fixed limits path, the accounting in its own directory, and the same
values in the environment as today's grant puts there (that environment is what the tenant rewrites).

Each test was run against the library as it was before these changes (GPUPOOL_TEST_NATIVE_SRC, see
native_helpers) and failed there. Every test runs on the plain build and on the ASan/UBSan build."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, MIB, Built, Probe, active_window, build_all, busy_share
from tests.native.test_hook_compute import finish, run
from tests.native.test_hook_sanitizers import SANITIZE, runtime

OOM = 2
SHARE = 10 * GIB
S = 1_000_000_000
SLOTS = 256


@pytest.fixture(scope="module", params=["plain", "asan"])
def flavour(request: pytest.FixtureRequest, built: Built,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str | None]:
    if request.param == "plain":
        return built, None
    return build_all(tmp_path_factory.mktemp("tamper-asan"), SANITIZE), runtime()


@pytest.fixture
def tenants(flavour: tuple[Built, str | None], device: Path, tmp_path: Path) -> Iterator[PodFactory]:
    built, asan = flavour
    factory = PodFactory(built, device, tmp_path)
    yield factory
    factory.close_all(kill=asan is None, check_reports=True)


def granted(tenants: PodFactory, flavour: tuple[Built, str | None], **kwargs: object) -> object:
    extra = dict(kwargs.pop("extra", {}) or {})  # type: ignore[call-overload]
    if flavour[1] is not None:
        extra.update(ASAN_OPTIONS="halt_on_error=1:detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    return tenants.pod(granted=True, asan_runtime=flavour[1], extra=extra, **kwargs)


def fill(probe: Probe, kind: str = "mem", total: int = SHARE, piece: int = GIB) -> None:
    for _ in range(total // piece):
        assert probe.alloc(kind, piece)[0] == 0


# ---- the environment ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tamper", [{"unset": ("GPUPOOL_MEMORY_LIMIT_MIB",)},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": "65536"}},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": ""}},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": "ten"}}])
def test_unsetting_or_raising_the_memory_variable_keeps_the_grant(
        tenants: PodFactory, flavour: tuple[Built, str | None], tamper: dict[str, object]) -> None:
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240", **tamper))  # type: ignore[arg-type]
    fill(probe)
    assert probe.alloc("mem", 1)[0] == OOM
    assert probe.ask("info") == [0, 0, SHARE]


def test_the_variable_may_lower_the_cap(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240", extra={"GPUPOOL_MEMORY_LIMIT_MIB": "4096"}))
    assert probe.alloc("mem", 4 * GIB)[0] == 0
    assert probe.alloc("mem", 1)[0] == OOM


def test_redirecting_the_hook_dir_does_not_give_a_fresh_share(
        tenants: PodFactory, flavour: tuple[Built, str | None], tmp_path: Path) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    a = tenants.start(pod)  # type: ignore[arg-type]
    assert a.alloc("mem", 6 * GIB)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pod.extra["GPUPOOL_HOOK_DIR"] = str(elsewhere)  # type: ignore[attr-defined]
    b = tenants.start(pod)  # type: ignore[arg-type]
    assert b.alloc("mem", 5 * GIB)[0] == OOM  # 6 + 5 > 10: both are in the pod's one accounting
    assert b.alloc("mem", 4 * GIB)[0] == 0
    assert b.alloc("mem", 1)[0] == OOM
    assert not list(elsewhere.iterdir())


@pytest.mark.parametrize("value", ["", "100", "95,100"])
def test_emptying_or_raising_the_cores_variable_keeps_the_compute_cap(
        tenants: PodFactory, flavour: tuple[Built, str | None], value: str) -> None:
    probe = tenants.start(granted(tenants, flavour, cores="30", extra={"GPUPOOL_CORES_PERCENT": value}))
    run(probe, 1.5)
    assert finish(probe) > 0
    window = active_window(tenants.device, [probe.pid], 4 * S // 10, S // 10)
    assert busy_share(tenants.device, {probe.pid}, *window) == pytest.approx(0.30, abs=0.05)


def test_an_elastic_mode_variable_does_not_make_a_hard_pod_elastic(
        tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    probe = tenants.start(granted(tenants, flavour, cores="30", mode="hard",
                                  extra={"GPUPOOL_CORES_MODE": "elastic"}))
    run(probe, 1.5)
    finish(probe)
    window = active_window(tenants.device, [probe.pid], 4 * S // 10, S // 10)
    assert busy_share(tenants.device, {probe.pid}, *window) == pytest.approx(0.30, abs=0.05)


def test_a_limits_file_that_is_not_one_refuses_everything(
        tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    path = pod.write_limits()  # type: ignore[attr-defined]
    path.write_bytes(b"\0" * 2048)  # fail closed: a garbled grant is never "no limit"
    probe = tenants.start(pod)  # type: ignore[arg-type]
    assert probe.alloc("mem", MIB)[0] == OOM


# ---- lookup paths ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["dlvsym", "dlsym_libc"])
def test_a_resolver_fetched_around_dlsym_still_reaches_the_wrappers(
        tenants: PodFactory, flavour: tuple[Built, str | None], path: str) -> None:
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240"), path)
    fill(probe)
    assert probe.alloc("mem", GIB)[0] == OOM
    assert probe.alloc("vmm", GIB)[0] == OOM


# ---- tables ---------------------------------------------------------------------------------------------
def test_the_65th_memory_pool_is_counted(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240"))
    assert probe.ask(f"pools 65 {150 * MIB}") == [65, 0]  # 9,750 MiB in 65 pools
    assert probe.alloc("mem", 600 * MIB)[0] == OOM  # 490 MiB are left, not 640
    assert probe.alloc("mem", 490 * MIB)[0] == 0


def test_past_the_pool_table_allocations_are_refused(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240"))
    assert probe.ask(f"pools 1100 {MIB}") == [1024, OOM]  # the table holds 1024 pools; the rest are refused
    assert probe.alloc("mem", SHARE - 1024 * MIB)[0] == 0
    assert probe.alloc("mem", 1)[0] == OOM


def _pin_slots(usage: Path, first: int, count: int) -> int:
    """Be `count` live processes of the pod from slot `first` on, holding nothing: hold their liveness bytes
    (1 + slot) and give each slot a pid, as a process that claimed it does."""
    fd = os.open(usage, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 1 + first, count, 0))
    for slot in range(first, first + count):
        os.pwrite(fd, struct.pack("<q", 4_000_000 + slot), 2048 + 264 * slot)
    return fd


def test_the_257th_process_is_refused_not_uncounted(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240", cores="50")
    first = tenants.start(pod)  # type: ignore[arg-type]  # slot 0, and the file made
    assert first.ask("info")[0] == 0
    fd = _pin_slots(pod.accounting / "usage.v1", 1, SLOTS - 1)  # type: ignore[attr-defined]
    try:
        probe = tenants.start(pod)  # type: ignore[arg-type]
        assert probe.alloc("mem", MIB)[0] == OOM
        assert probe.ask("launch kernel 100 0.05 4")[0] == OOM
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, SLOTS, 1, 0))
        os.pwrite(fd, struct.pack("<q", 0), 2048 + 264 * (SLOTS - 1))  # that process exited
        late = tenants.start(pod)  # type: ignore[arg-type]  # one slot free again: the next process runs
        assert late.alloc("mem", SHARE)[0] == 0
        assert late.alloc("mem", 1)[0] == OOM
    finally:
        os.close(fd)


# ---- the writable accounting file -----------------------------------------------------------------------
def test_zeroing_the_accounting_file_gains_nothing(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    a = tenants.start(pod)  # type: ignore[arg-type]
    assert a.alloc("mem", 6 * GIB)[0] == 0
    usage = pod.accounting / "usage.v1"  # type: ignore[attr-defined]
    usage.write_bytes(b"\0" * usage.stat().st_size)  # the tenant wipes the pod's accounting in place
    assert a.alloc("mem", 5 * GIB)[0] == OOM  # the wiping process is held by its own bookkeeping
    b = tenants.start(pod)  # type: ignore[arg-type]
    assert b.alloc("mem", 5 * GIB)[0] == OOM  # a's wiped slot is live: its usage is not zero, it is unknown
    assert a.ask("info") == [0, 4 * GIB, SHARE]  # a writes its usage back at its next call
    assert b.alloc("mem", 5 * GIB)[0] == OOM
    assert b.alloc("mem", 4 * GIB)[0] == 0
    assert a.alloc("mem", 1)[0] == OOM


def test_context_memory_still_counts_when_nvml_lists_more_than_64_processes(
        tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    """70 other processes with a context on the GPU (entries in the fake device's table, fake_state.h,
    alive as this test's own process): NVML's list no longer fits 64 entries, and this process's 300 MiB
    of context memory must still count against its share."""
    me = os.getpid()
    state = bytearray(32 + 256 * 40 + (1 << 16) * 24)
    struct.pack_into("<QqQQ", state, 0, 0x4B414647, 0, 1 << 40, 0)
    for i in range(70):
        struct.pack_into("<qqQQQ", state, 32 + 40 * i, me, 4_000_000 + i, 0, 0, 1)
    tenants.device.write_bytes(bytes(state))
    probe = tenants.start(granted(tenants, flavour, memory_mib="10240", extra={"FAKE_GPU_CTX_MIB": "300"}))
    assert probe.alloc("mem", SHARE - 300 * MIB)[0] == 0
    assert probe.alloc("mem", MIB)[0] == OOM
