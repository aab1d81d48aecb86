"""A hostile tenant inside a pod capped by the HIP library: the memory parts of test_hook_tamper.py on the HIP
entry points. The pod is granted as the agent grants it (limits.v1 from the agent's writer, handed to the
process read-only at the library's fixed limits path, the accounting in its own directory) and the tenant
rewrites what it can write: the environment, the accounting directory's path, the accounting file, the
lookups. None of it widens the cap. Every test runs on the plain build and on the ASan/UBSan build, each pod in PID
and mount namespaces of its own with a fresh /proc, as a production container runs."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, MIB, Built, Pod, Probe
from tests.native.test_hip_memory import KINDS, OOM, SHARE, build_hip
from tests.native.test_hook_sanitizers import SANITIZE, runtime

SLOTS = 256


@pytest.fixture(scope="module", params=["plain", "asan"])
def flavour(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str | None]:
    if request.param == "plain":
        return build_hip(tmp_path_factory.mktemp("hip-tamper")), None
    return build_hip(tmp_path_factory.mktemp("hip-tamper-asan"), SANITIZE), runtime()


@pytest.fixture
def tenants(flavour: tuple[Built, str | None], device: Path, tmp_path: Path) -> Iterator[PodFactory]:
    built, asan = flavour
    factory = PodFactory(built, device, tmp_path)
    yield factory
    factory.close_all(kill=asan is None, check_reports=True)


def granted(tenants: PodFactory, flavour: tuple[Built, str | None], **kwargs: object) -> Pod:
    extra = dict(kwargs.pop("extra", {}) or {})  # type: ignore[call-overload]
    if flavour[1] is not None:
        extra.update(ASAN_OPTIONS="halt_on_error=1:detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    # as in a production container: PID and mount namespaces of its own, with a fresh /proc
    kwargs.setdefault("namespaces", True)
    return tenants.pod(granted=True, asan_runtime=flavour[1], extra=extra, **kwargs)


def fill(app: Probe, kind: str = "mem", total: int = SHARE, piece: int = GIB) -> None:
    for _ in range(total // piece):
        assert app.alloc(kind, piece)[0] == 0


# ---- the environment ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tamper", [{"unset": ("GPUPOOL_MEMORY_LIMIT_MIB",)},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": "65536"}},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": ""}},
                                    {"extra": {"GPUPOOL_MEMORY_LIMIT_MIB": "ten"}}])
def test_unsetting_or_raising_the_memory_variable_keeps_the_grant(
        tenants: PodFactory, flavour: tuple[Built, str | None], tamper: dict[str, object]) -> None:
    app = tenants.start(granted(tenants, flavour, memory_mib="10240", **tamper))
    fill(app)
    assert app.alloc("mem", 1)[0] == OOM
    assert app.ask("info") == [0, 0, SHARE]


def test_the_variable_may_lower_the_cap(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    app = tenants.start(granted(tenants, flavour, memory_mib="10240", extra={"GPUPOOL_MEMORY_LIMIT_MIB": "4096"}))
    assert app.alloc("mem", 4 * GIB)[0] == 0
    assert app.alloc("mem", 1)[0] == OOM
    assert app.ask("info") == [0, 0, 4 * GIB]


def test_redirecting_the_hook_dir_does_not_give_a_fresh_share(
        tenants: PodFactory, flavour: tuple[Built, str | None], tmp_path: Path) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    a = tenants.start(pod)
    assert a.alloc("mem", 6 * GIB)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pod.extra["GPUPOOL_HOOK_DIR"] = str(elsewhere)
    b = tenants.start(pod)
    assert b.alloc("ext", 5 * GIB)[0] == OOM  # 6 + 5 > 10: both are in the pod's one accounting
    assert b.alloc("ext", 4 * GIB)[0] == 0
    assert b.alloc("mem", 1)[0] == OOM
    assert not list(elsewhere.iterdir())


def test_a_limits_file_that_is_not_one_refuses_everything(
        tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    path = pod.write_limits()
    path.write_bytes(b"\0" * 2048)  # fail closed: a garbled grant is never "no limit"
    app = tenants.start(pod)
    for kind in KINDS:
        assert app.alloc(kind, MIB)[0] == OOM, kind


def test_a_forged_limits_file_in_a_writable_directory_grants_nothing(
        tenants: PodFactory, flavour: tuple[Built, str | None], tmp_path: Path) -> None:
    """The tenant writes a limits.v1 of its own (the agent's writer, 64 GiB) where it can write, and points
    the one path variable the library knows there: the library reads its limits at its compiled-in path
    only."""
    from gpupool.agent.state.hookdir import HookLimits, limits_dir, write_limits

    forged = tmp_path / "forged"
    (forged / "hook").mkdir(parents=True)
    write_limits(limits_dir(forged), HookLimits(memory_mib=(65536,), cores=(100.0,), mode="hard",
                                                accounting_dir=str(forged / "hook")))
    pod = granted(tenants, flavour, memory_mib="10240",
                  extra={"GPUPOOL_HOOK_DIR": str(forged), "GPUPOOL_MEMORY_LIMIT_MIB": "65536"})
    app = tenants.start(pod)
    fill(app)
    assert app.alloc("mem", 1)[0] == OOM
    assert app.ask("info") == [0, 0, SHARE]
    assert not (forged / "hook" / "usage.v1").exists()


def test_a_limits_file_rewritten_under_a_running_process_grants_it_nothing(
        tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    """The limits file rewritten in place after the process read it: the process holds the grant it started
    with. (A process started after it would read the file afresh: the agent mounts it read-only.)"""
    pod = granted(tenants, flavour, memory_mib="10240")
    app = tenants.start(pod)
    assert app.alloc("mem", GIB)[0] == 0
    path = pod.hook_dir / "limits" / "limits.v1"
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, 16, 64 * GIB)  # limit[0]
    path.write_bytes(bytes(data))
    fill(app, total=9 * GIB)
    assert app.alloc("mem", 1)[0] == OOM


# ---- lookup paths ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["dlvsym", "dlsym_libc", "gpa"])
def test_a_resolver_fetched_around_dlsym_still_reaches_the_wrappers(
        tenants: PodFactory, flavour: tuple[Built, str | None], path: str) -> None:
    app = tenants.start(granted(tenants, flavour, memory_mib="10240"), path)
    fill(app)
    for kind in KINDS:
        assert app.alloc(kind, GIB)[0] == OOM, kind


# ---- the writable accounting file -----------------------------------------------------------------------
def _pin_slots(usage: Path, first: int, count: int) -> int:
    """Be `count` live processes of the pod from slot `first` on, holding nothing: hold their liveness bytes
    (1 + slot) and give each slot a pid, as a process that claimed it does."""
    fd = os.open(usage, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 1 + first, count, 0))
    for slot in range(first, first + count):
        os.pwrite(fd, struct.pack("<q", 4_000_000 + slot), 2048 + 264 * slot)
    return fd


def test_the_257th_process_is_refused_not_uncounted(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    first = tenants.start(pod)  # slot 0, and the file made
    assert first.alloc("mem", MIB)[0] == 0
    fd = _pin_slots(pod.accounting / "usage.v1", 1, SLOTS - 1)
    try:
        app = tenants.start(pod)
        assert app.alloc("mem", MIB)[0] == OOM
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, SLOTS, 1, 0))
        os.pwrite(fd, struct.pack("<q", 0), 2048 + 264 * (SLOTS - 1))  # that process exited
        late = tenants.start(pod)  # one slot free again: the next process runs
        assert late.alloc("mem", SHARE - MIB)[0] == 0
        assert late.alloc("mem", 1)[0] == OOM
    finally:
        os.close(fd)


def test_zeroing_the_accounting_file_gains_nothing(tenants: PodFactory, flavour: tuple[Built, str | None]) -> None:
    pod = granted(tenants, flavour, memory_mib="10240")
    a = tenants.start(pod)
    assert a.alloc("mem", 6 * GIB)[0] == 0
    usage = pod.accounting / "usage.v1"
    usage.write_bytes(b"\0" * usage.stat().st_size)  # the tenant wipes the pod's accounting in place
    assert a.alloc("mem", 5 * GIB)[0] == OOM  # the wiping process is held by its own bookkeeping
    b = tenants.start(pod)
    assert b.alloc("mem", 5 * GIB)[0] == OOM  # a's wiped slot is live: its usage is not zero, it is unknown
    assert a.ask("info") == [0, 4 * GIB, SHARE]  # a writes its usage back at its next call
    assert b.alloc("mem", 5 * GIB)[0] == OOM
    assert b.alloc("mem", 4 * GIB)[0] == 0
    assert a.alloc("mem", 1)[0] == OOM
