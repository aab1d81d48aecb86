"""The HIP library, the fake runtime and the HIP program built with AddressSanitizer + UndefinedBehaviorSanitizer
(as test_hook_sanitizers.py does for the CUDA library), driven through every lookup path, every allocating
entry point the library wraps, sixteen threads and kill -9 mid-allocation; every process must end with exit
code 0 and a clean stderr (leak checking on). The first test proves the run is really sanitizing: the
library's code carries the checks, the plain build none."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.native_helpers import GIB, Built
from tests.native.test_hip_memory import KINDS, OOM, PATHS, SHARE, build_hip
from tests.native.test_hook_sanitizers import SANITIZE, Sanitized, _undefined, runtime


@pytest.fixture(scope="module")
def asan_hip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str]:
    return build_hip(tmp_path_factory.mktemp("hip-asan"), SANITIZE), runtime()


@pytest.fixture(scope="module")
def plain_hip(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_hip(tmp_path_factory.mktemp("hip-plain"))


@pytest.fixture
def sanitized(asan_hip: tuple[Built, str], tmp_path: Path) -> Iterator[Sanitized]:
    built, rt = asan_hip
    factory = Sanitized(built, rt, tmp_path)
    yield factory
    for app in factory.started:
        factory.finish(app)


def test_the_sanitized_library_carries_asan_and_ubsan_checks_and_the_plain_one_none(
        asan_hip: tuple[Built, str], plain_hip: Built) -> None:
    names = _undefined(asan_hip[0].hook)
    assert "__asan_init" in names or any(n.startswith("__asan_version_mismatch_check") for n in names), names
    assert any(n.startswith("__asan_report_load") for n in names)
    assert any(n.startswith("__asan_report_store") for n in names)
    assert any(n.startswith("__ubsan_handle_") for n in names)
    assert not any(n.startswith(("__asan_", "__ubsan_")) for n in _undefined(plain_hip.hook))


def test_the_asan_runtime_and_the_library_are_both_loaded(sanitized: Sanitized) -> None:
    app = sanitized.start(sanitized.pod(memory_mib="1024"))
    assert app.alloc("mem", 1)[0] == 0
    maps = Path(f"/proc/{app.pid}/maps").read_text()
    loaded = {os.path.realpath(p) for p in re.findall(r"\s(/\S+)$", maps, re.MULTILINE)}
    assert os.path.realpath(sanitized.runtime) in loaded
    assert str(sanitized.built.hook) in maps


@pytest.mark.parametrize("path", PATHS)
def test_every_allocation_kind_is_capped_and_clean_on_every_lookup_path(sanitized: Sanitized, path: str) -> None:
    app = sanitized.start(sanitized.pod(memory_mib="10240"), path)
    for kind in KINDS:
        rc, handle = app.alloc(kind, GIB)
        assert rc == 0, kind
        assert app.ask("info") == [0, SHARE - GIB, SHARE], kind  # counted
        assert app.ask(f"free {handle}") == [0], kind
        assert app.ask("info") == [0, SHARE, SHARE], kind  # and given back
    for kind in KINDS:  # fill the share with each kind in turn, then not one byte more of any kind
        handles = []
        for _ in range(10):
            rc, handle = app.alloc(kind, GIB)
            assert rc == 0, kind
            handles.append(handle)
        for other in KINDS:
            assert app.alloc(other, 16)[0] == OOM, (kind, other)
        for handle in handles:
            assert app.ask(f"free {handle}") == [0], kind
    assert app.ask("total") == [0, SHARE]
    assert app.ask("badfree") == [17, 1]
    assert app.ask("echo") == [1001]


def test_sixteen_threads_never_pass_the_cap_and_are_clean(sanitized: Sanitized) -> None:
    app = sanitized.start(sanitized.pod(memory_mib="1024"))
    rc, max_live, successes, failures, others = app.ask("threads 16 400 3 1048576 4194304 67108864")
    assert rc == 0 and others == 0
    assert 0 < max_live <= GIB and successes > 0 and failures > 0
    assert app.ask("info") == [0, GIB, GIB]  # every thread freed what it held


def test_kill_9_mid_allocation_leaves_a_clean_heir_the_whole_share(sanitized: Sanitized) -> None:
    pod = sanitized.pod(memory_mib="10240")
    rng = random.Random(11)
    for _ in range(4):
        victim = sanitized.start(pod)
        victim.send(f"stress {GIB}")
        assert victim.proc.stdout is not None and victim.proc.stdout.readline() == "started\n"
        time.sleep(rng.uniform(0.0, 0.05))  # where in its loop it dies: the randomness under test, not a wait
        sanitized.kill(victim)
        heir = sanitized.start(pod)
        assert heir.alloc("mem", SHARE)[0] == 0
        assert heir.alloc("mem", 1)[0] == OOM
        sanitized.finish(heir)
        sanitized.started.remove(heir)
