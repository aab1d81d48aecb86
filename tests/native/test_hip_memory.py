"""The HIP memory cap (libgpupool_hip.so, native/hip/): the memory tests of the CUDA library ported to the HIP
entry points, on the fake HIP runtime (fakes/fake_hip.c) driven by the test program (fakes/hip_app.c).

Exact on every allocating entry point and every lookup path, pod-wide, robust to kill -9; hipMemGetInfo tells
the share. The library is built like the CUDA one in native_helpers (GP_LIMITS_PATH at a descriptor the
harness hands each process), so Pod and PodFactory drive it unchanged: `Built.hook` is the HIP library and
`Built.probe` the HIP program."""

from __future__ import annotations

import random
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.agent.state.hookdir import read_usage, write_squeeze
from gpupool.hook import hip_library_path, library_path
from tests.native.conftest import PodFactory
from tests.native.native_helpers import CC_FLAGS, FAKES, GIB, LIMITS_DEFINE, MIB, Built, Pod, _cc, have_cc, native_build

# The CU mask file (cu_masks.v1) is handed to the library like the limits file (native_helpers: LIMITS_FD), as a
# descriptor at a path compiled in; test_hip_compute.py's pods pass it.
CU_MASKS_FD = 202
CU_MASKS_DEFINE = f'-DGPH_CU_MASKS_PATH="/proc/self/fd/{CU_MASKS_FD}"'
OOM = 2  # hipErrorOutOfMemory
INVALID_VALUE, INVALID_DEVICE_POINTER = 1, 17
SHARE = 10 * GIB
DEVICE = 192 * GIB  # the fake's default device: an MI300X
KINDS = ["mem", "ext", "managed", "pitch", "mempitch", "async", "pool"]
PATHS = ["direct", "dlsym", "gpa"]
WRAPPED = {"hipMalloc", "hipExtMallocWithFlags", "hipMallocManaged", "hipMallocAsync", "hipMallocFromPoolAsync",
           "hipMallocPitch", "hipMemAllocPitch", "hipFree", "hipFreeAsync", "hipMemGetInfo", "hipDeviceTotalMem",
           "hipGetProcAddress", "dlsym", "dlvsym",
           "hsa_queue_create", "hsa_queue_destroy", "hsa_amd_queue_cu_set_mask", "hipExtStreamCreateWithCUMask",
           "hipExtStreamGetCUMask"}


def build_hip(out: Path, extra: list[str] | None = None) -> Built:
    """The fake HSA runtime and the fake HIP runtime over it (each linked -Bsymbolic: their own calls never come
    back through the library, as a real runtime's do not; HIP's calls into HSA go through the PLT, as ROCclr's
    do), the HIP program, and the library under test (its CU mask file at a descriptor, like its limits file:
    CU_MASKS_FD)."""
    assert have_cc(), "no C compiler: the native tests need one (set CC)"
    extra = extra or []
    out.mkdir(parents=True, exist_ok=True)
    shared = [*CC_FLAGS, *extra, "-fPIC", "-shared", "-Wl,-Bsymbolic"]
    _cc(*shared, "-o", str(out / "libhsa-runtime64.so.1"), str(FAKES / "fake_hsa.c"), "-lpthread")
    _cc(*shared, "-o", str(out / "libamdhip64.so"), str(FAKES / "fake_hip.c"), f"-L{out}",
        "-l:libhsa-runtime64.so.1", "-lpthread")
    _cc(*CC_FLAGS, *extra, "-o", str(out / "hip_app"), str(FAKES / "hip_app.c"), f"-L{out}", "-l:libamdhip64.so",
        "-l:libhsa-runtime64.so.1", "-ldl", "-lpthread")
    lib = native_build().compile_hip_library(out / "libgpupool_hip.so", [*extra, LIMITS_DEFINE, CU_MASKS_DEFINE])
    return Built(out, lib, out / "hip_app")


@pytest.fixture(scope="module")
def hip_built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_hip(tmp_path_factory.mktemp("hip"))


@pytest.fixture
def hip(hip_built: Built, device: Path, tmp_path: Path) -> Iterator[PodFactory]:
    factory = PodFactory(hip_built, device, tmp_path)
    yield factory
    factory.close_all()


@pytest.mark.parametrize(("kind", "path"), [(k, p) for k in KINDS for p in PATHS])
def test_a_10_gib_share_allocates_10_gib_in_pieces_and_not_one_byte_more(
        hip: PodFactory, kind: str, path: str) -> None:
    app = hip.start(hip.pod(memory_mib="10240"), path)
    handles = []
    for _ in range(10):
        rc, handle = app.alloc(kind, GIB)
        assert rc == 0
        handles.append(handle)
    assert app.alloc("mem", 1)[0] == OOM
    assert app.alloc(kind, 16)[0] == OOM
    assert app.ask("info") == [0, 0, SHARE]
    assert app.ask(f"free {handles.pop()}") == [0]
    assert app.ask("info") == [0, GIB, SHARE]  # the free is counted
    assert app.alloc(kind, GIB)[0] == 0
    assert app.alloc(kind, 16)[0] == OOM


def test_pitched_rows_count_with_their_padding(hip: PodFactory) -> None:
    """One row of 16 bytes is padded to 128 (the runtime's alignment): 128 bytes of the share are gone."""
    app = hip.start(hip.pod(memory_mib="1"))
    assert app.alloc("pitch", 16)[0] == 0
    assert app.ask("info") == [0, MIB - 128, MIB]
    assert app.alloc("mem", MIB - 128)[0] == 0
    assert app.alloc("mem", 1)[0] == OOM


def test_pinned_host_memory_is_not_the_devices(hip: PodFactory) -> None:
    app = hip.start(hip.pod(memory_mib="10240"))
    assert app.alloc("mem", SHARE)[0] == 0
    assert app.alloc("host", 4 * GIB)[0] == 0  # hipHostMalloc holds no device memory
    assert app.ask("info") == [0, 0, SHARE]


def test_reported_totals_are_the_share(hip: PodFactory) -> None:
    app = hip.start(hip.pod(memory_mib="10240"))
    assert app.ask("total") == [0, SHARE]
    assert app.alloc("mem", 3 * GIB)[0] == 0
    assert app.ask("info") == [0, 7 * GIB, SHARE]


def test_without_the_library_the_whole_device_shows(hip: PodFactory) -> None:
    app = hip.start(hip.pod(memory_mib="10240", preload=False))
    assert app.ask("total") == [0, DEVICE]
    assert app.alloc("mem", 20 * GIB)[0] == 0  # the fake enforces nothing by itself
    assert app.ask("info") == [0, DEVICE - 20 * GIB, DEVICE]


def test_free_memory_is_never_more_than_the_device_has(hip: PodFactory) -> None:
    """A 10 GiB share on an 8 GiB device shows 8 GiB; another process outside the pod taking 6 GiB of it
    leaves 2 GiB free to tell (the device's free memory, not the cap's)."""
    gpu = {"FAKE_HIP_MEM_MIB": "8192"}
    app = hip.start(hip.pod(memory_mib="10240", gpu=gpu))
    assert app.ask("info") == [0, 8 * GIB, 8 * GIB]
    other = hip.start(hip.pod(preload=False, gpu=gpu))
    assert other.alloc("mem", 6 * GIB)[0] == 0
    assert app.ask("info") == [0, 2 * GIB, 8 * GIB]


def test_an_allocation_the_runtime_refuses_gives_its_reservation_back(hip: PodFactory) -> None:
    gpu = {"FAKE_HIP_MEM_MIB": "16384"}
    other = hip.start(hip.pod(preload=False, gpu=gpu))
    assert other.alloc("mem", 12 * GIB)[0] == 0
    app = hip.start(hip.pod(memory_mib="10240", gpu=gpu))
    assert app.alloc("mem", 5 * GIB)[0] == OOM  # the device has 4 GiB free: the runtime's own refusal
    other.close()  # its 12 GiB return to the device
    assert app.alloc("mem", SHARE)[0] == 0  # and the pod holds nothing of the refused 5 GiB
    assert app.alloc("mem", 1)[0] == OOM


def test_the_runtimes_errors_pass_through_and_count_nothing(hip: PodFactory) -> None:
    for preload in (False, True):
        app = hip.start(hip.pod(memory_mib="10240", preload=preload))
        assert app.ask("badfree") == [INVALID_DEVICE_POINTER, INVALID_VALUE]
        assert app.alloc("mem", 0)[0] == 0  # size 0: no pointer, nothing counted
    assert app.ask("info") == [0, SHARE, SHARE]


def test_three_processes_share_one_cap(hip: PodFactory) -> None:
    pod = hip.pod(memory_mib="10240")
    a, b, c = (hip.start(pod) for _ in range(3))
    assert a.alloc("mem", 4 * GIB)[0] == 0
    assert b.alloc("async", 4 * GIB)[0] == 0
    assert c.alloc("mem", 3 * GIB)[0] == OOM
    assert c.alloc("managed", 2 * GIB)[0] == 0
    for p in (a, b, c):
        assert p.ask("info") == [0, 0, SHARE]
        assert p.alloc("mem", 1)[0] == OOM
    a.close()  # exits: its 4 GiB return to the pod
    assert c.alloc("mem", 4 * GIB)[0] == 0
    assert b.ask("info") == [0, 0, SHARE]


def test_other_pods_have_their_own_share(hip: PodFactory) -> None:
    a = hip.start(hip.pod(memory_mib="10240"))
    b = hip.start(hip.pod(memory_mib="20480"))
    assert a.alloc("mem", SHARE)[0] == 0
    assert b.alloc("mem", 2 * SHARE)[0] == 0
    assert b.alloc("mem", 1)[0] == OOM


def test_a_process_started_after_another_exits_sees_the_right_free_memory(hip: PodFactory) -> None:
    pod = hip.pod(memory_mib="10240")
    first = hip.start(pod)
    assert first.alloc("mem", 6 * GIB)[0] == 0
    holder = hip.start(pod)
    assert holder.alloc("mem", GIB)[0] == 0
    first.close()
    second = hip.start(pod)
    assert second.ask("info") == [0, 9 * GIB, SHARE]


def test_each_device_is_held_to_its_own_limit(hip: PodFactory) -> None:
    app = hip.start(hip.pod(memory_mib="4096,8192", gpu={"FAKE_HIP_DEVICES": "2"}))
    assert app.alloc("mem", 4 * GIB)[0] == 0
    assert app.alloc("mem", 1)[0] == OOM
    assert app.ask("device 1") == [0]
    assert app.ask("info") == [0, 8 * GIB, 8 * GIB]
    assert app.alloc("mem", 8 * GIB)[0] == 0
    assert app.alloc("mem", 1)[0] == OOM
    assert app.ask("device 0") == [0]
    assert app.ask("info") == [0, 0, 4 * GIB]


def test_kill_9_at_any_instant_never_wedges_the_pod(hip: PodFactory) -> None:
    pod = hip.pod(memory_mib="10240")
    rng = random.Random(7)
    for _ in range(8):
        victim = hip.start(pod)
        victim.send(f"stress {GIB}")
        assert victim.proc.stdout is not None and victim.proc.stdout.readline() == "started\n"
        time.sleep(rng.uniform(0.0, 0.05))  # where in its loop it dies: the randomness under test, not a wait
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        heir = hip.start(pod)
        assert heir.alloc("mem", SHARE)[0] == 0
        assert heir.close() == ""


@pytest.mark.parametrize("value", ["ten", "10,,20", "-5", "1e400"])
def test_a_bad_limit_logs_once_and_runs_unlimited(hip: PodFactory, value: str) -> None:
    app = hip.start(hip.pod(memory_mib=value))
    assert app.alloc("mem", 20 * GIB)[0] == 0
    assert app.alloc("mem", GIB)[0] == 0
    err = app.close()
    assert err.count("GPUPOOL_MEMORY_LIMIT_MIB") == 1, err
    assert "memory is not capped" in err


def test_no_limit_passes_through(hip: PodFactory) -> None:
    app = hip.start(hip.pod())
    assert app.ask("total") == [0, DEVICE]
    assert app.alloc("mem", 70 * GIB)[0] == 0


@pytest.mark.parametrize("path", PATHS)
def test_unknown_symbols_pass_through_untouched(hip: PodFactory, path: str) -> None:
    app = hip.start(hip.pod(memory_mib="10240"), path)
    assert app.ask("echo") == [1001]


def test_the_pods_file_says_the_library_honours_no_squeeze(hip: PodFactory) -> None:
    """usage.v1's features (gp_core.h): the HIP library caps memory only, so it claims neither the squeeze
    (1) nor host PIDs (2), only, when granted, that its limits are the agent's file's (4)."""
    for granted, features in ((False, 0), (True, 4)):
        pod = hip.pod(memory_mib="10240", granted=granted)
        app = hip.start(pod)
        assert app.alloc("mem", GIB)[0] == 0
        usage = pod.accounting / "usage.v1"
        assert struct.unpack_from("<Q", usage.read_bytes(), 1328)[0] == features
        read = read_usage(pod.hook_dir)
        assert [u.used_bytes for u in read] == [GIB]  # the agent reads the pod's memory as it does for CUDA
    for granted in (False, True):  # the agent's limits file or not: the library's word decides
        plain = hip.pod(memory_mib="10240", granted=granted)
        assert hip.start(plain).alloc("mem", 1)[0] == 0
        written = write_squeeze(plain.hook_dir, {0: 30})
        assert written is not None and not written.enforced, granted


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cap_mib=st.integers(min_value=1, max_value=512),
    sizes=st.lists(st.integers(min_value=1, max_value=128 * MIB), min_size=1, max_size=6),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_sixteen_threads_never_pass_the_cap(hip_built: Built, cap_mib: int, sizes: list[int], seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "hook").mkdir()
        app = Pod(hip_built, root / "gpu", root / "hook", memory_mib=str(cap_mib)).start()
        try:
            rc, max_live, successes, failures, others = app.ask(f"threads 16 60 {seed} {' '.join(map(str, sizes))}")
            cap = cap_mib * MIB
            assert rc == 0 and others == 0  # only success or hipErrorOutOfMemory, never another code
            assert max_live <= cap
            assert successes + failures > 0
            if min(sizes) <= cap:
                assert successes > 0
            assert app.alloc("mem", cap)[0] == 0  # everything was freed: the whole share, not a byte more
            assert app.alloc("mem", 1)[0] == OOM
        finally:
            app.close()


def test_the_hip_library_carries_nothing_of_cudas(hip_built: Built) -> None:
    defined = subprocess.run(["nm", "-D", "--defined-only", str(hip_built.hook)], capture_output=True, text=True,
                             check=True).stdout
    assert {line.split()[-1] for line in defined.splitlines() if line.strip()} == WRAPPED
    data = hip_built.hook.read_bytes()
    for name in (b"libcuda", b"libnvidia-ml", b"cuMemAlloc", b"nvmlInit"):
        assert name not in data, name


def test_the_installed_libraries_lie_side_by_side() -> None:
    assert hip_library_path().name == "libgpupool_hip.so"
    assert hip_library_path().parent == library_path().parent
