"""Compute by CU masks (libgpupool_hip.so, native/hip/gph_cu.c): every HSA queue of a container's HIP program runs
on the CUs the agent gave it in cu_masks.v1, the null stream's included, and nothing the tenant does widens that.

On the fake HSA runtime (fakes/fake_hsa.c: queues, CU masks and a simulated device whose kernels take W / |mask|
of simulated time) under the fake HIP runtime (fakes/fake_hip.c: streams on a pool of HSA queues made with
hsa_queue_create), driven by fakes/hip_app.c. The mask file is written by the agent's writer
(gpupool.agent.state.hookdir.write_cu_masks) and handed to each process read-only at the library's compiled-in
path (a descriptor, CU_MASKS_FD), as its limits file is. What the device does with a mask beyond the reference
(which XCC a CU is on, how a kernel's work is spread) is a parameter of the fake, swept here.

Every test runs on the plain build and on the ASan/UBSan build."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpupool.agent.state.hookdir import CU_MASKS_FILE, CuMask, limits_dir, write_cu_masks
from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, Built, Pod, Probe
from tests.native.test_hip_memory import CU_MASKS_FD, OOM, build_hip
from tests.native.test_hook_sanitizers import SANITIZE, runtime

CARD = 304  # an MI300X: 8 XCCs of 38 CUs
XCCS = 8
WORK = 304_000  # CU-microseconds per kernel: 1 ms on the whole card, 4 ms on 76 CUs
REDUCED, INVALID_ARGUMENT, INVALID_QUEUE, INVALID_QUEUE_CREATION = 44, 0x1001, 0x1007, 0x1002
LAUNCH_FAILURE, INVALID_VALUE = 719, 1
FULL = " ".join(["0xffffffff"] * 10)  # every CU of the card, and 16 bits beyond it


def xcc_of(cu: int, layout: str) -> int:
    return cu % XCCS if layout == "interleaved" else cu // (CARD // XCCS)


def spread(count: int, layout: str, skip: int = 0) -> frozenset[int]:
    """`count` CUs spread as evenly as they go over the 8 XCCs under `layout` (10, 10, 10, 10, 9, 9, 9, 9 for
    76), each XCC's taken after its first `skip`: what an agent that knows the layout would hand out."""
    per = [count // XCCS + (1 if x < count % XCCS else 0) for x in range(XCCS)]
    out: set[int] = set()
    for x in range(XCCS):
        mine = [c for c in range(CARD) if xcc_of(c, layout) == x][skip:skip + per[x]]
        out.update(mine)
    return frozenset(out)


QUARTER = spread(76, "interleaved")  # CUs 0..75: 25 % of the card


@dataclass
class CuPod(Pod):
    """A granted pod whose agent also wrote cu_masks.v1 (masks=None: no mask file). `mask_file` hands another
    file to the library in its place (a garbled one)."""

    masks: tuple[CuMask | None, ...] | None = None
    mask_file: Path | None = None
    log: Path = field(default_factory=Path)

    def handed(self) -> list[tuple[Path, int]]:
        """limits.v1 and, beside it, cu_masks.v1 (or `mask_file` in its place), each at its descriptor."""
        handed = super().handed()
        if self.masks is not None and not (limits_dir(self.hook_dir) / CU_MASKS_FILE).exists():
            write_cu_masks(limits_dir(self.hook_dir), self.masks)
        masks = self.mask_file or limits_dir(self.hook_dir) / CU_MASKS_FILE
        if masks.exists():
            handed.append((masks, CU_MASKS_FD))
        return handed


@dataclass(frozen=True)
class Dispatch:
    pid: int
    queue: int
    work: int
    start: int
    end: int
    cus: frozenset[int]


@dataclass
class Device:
    """What the fake HSA runtime logged: each queue's mask now (by queue id) and every kernel."""

    queues: dict[int, frozenset[int]]
    owner: dict[int, int]
    dispatches: list[Dispatch]
    hangs: int

    def of(self, pid: int) -> list[Dispatch]:
        return [d for d in self.dispatches if d.pid == pid]

    def queues_of(self, pid: int) -> dict[int, frozenset[int]]:
        return {q: m for q, m in self.queues.items() if self.owner[q] == pid}

    def throughput(self, pid: int) -> float:
        """The process's work per simulated time, in CUs' worth (304 = the whole card)."""
        mine = self.of(pid)
        return sum(d.work * 1000 for d in mine) / (max(d.end for d in mine) - min(d.start for d in mine))


def cus_of(words: list[str]) -> frozenset[int]:
    return frozenset(32 * w + b for w, word in enumerate(words) for b in range(32) if int(word, 16) >> b & 1)


def read_device(log: Path) -> Device:
    queues: dict[int, frozenset[int]] = {}
    owner: dict[int, int] = {}
    dispatches, hangs = [], 0
    for line in log.read_text().splitlines():
        kind, pid, _dev, queue, *rest = line.split()
        if kind == "queue":
            queues[int(queue)], owner[int(queue)] = cus_of(rest), int(pid)
        elif kind == "mask":
            queues[int(queue)] = cus_of(rest[1:])
        elif kind == "dispatch":
            work, start, end, ncu = map(int, rest[:4])
            cus = cus_of(rest[4:])
            assert len(cus) == ncu
            dispatches.append(Dispatch(int(pid), int(queue), work, start, end, cus))
        elif kind == "hang":
            hangs += 1
    return Device(queues, owner, dispatches, hangs)


@pytest.fixture(scope="module", params=["plain", "asan"])
def flavour(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str | None]:
    if request.param == "plain":
        return build_hip(tmp_path_factory.mktemp("hip-cu")), None
    return build_hip(tmp_path_factory.mktemp("hip-cu-asan"), SANITIZE), runtime()


class CuPods(PodFactory):
    def __init__(self, built: Built, device: Path, root: Path, asan: str | None) -> None:
        super().__init__(built, device, root)
        self.asan = asan
        self.log = root / "hsa.log"

    def cu_pod(self, masks: tuple[CuMask | None, ...] | None = (CuMask(CARD, QUARTER),), *,
               gpu: dict[str, str] | None = None, extra: dict[str, str] | None = None, **kwargs: object) -> CuPod:
        self.count += 1
        hook_dir = self.root / f"pod-{self.count}"
        hook_dir.mkdir()
        env = dict(extra or {})
        if self.asan is not None:
            env.update(ASAN_OPTIONS="halt_on_error=1:detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
        sim = {"FAKE_HSA_STATE": str(self.root / "hsa.state"), "FAKE_HSA_LOG": str(self.log), **(gpu or {})}
        return CuPod(self.built, self.device, hook_dir, granted=True, memory_mib="10240", masks=masks,
                     asan_runtime=self.asan, extra=env, gpu=sim, **kwargs)  # type: ignore[arg-type]

    def sim(self) -> Device:
        return read_device(self.log)


@pytest.fixture
def cu(flavour: tuple[Built, str | None], device: Path, tmp_path: Path) -> Iterator[CuPods]:
    built, asan = flavour
    factory = CuPods(built, device, tmp_path, asan)
    yield factory
    factory.close_all(kill=asan is None, check_reports=True)


def run_everything(app: Probe) -> None:
    """Kernels on the null stream, on six streams (past the pool of four queues, so queues are shared), and on
    a stream that asks for every CU."""
    assert app.ask(f"launch 0 {WORK} 2") == [0]
    for _ in range(6):
        rc, sid = app.ask("stream")
        assert rc == 0
        assert app.ask(f"launch {sid} {WORK} 2") == [0]
    rc, sid = app.ask(f"custream {FULL}")
    assert rc == 0
    assert app.ask(f"launch {sid} {WORK} 2") == [0]


# ---- the share --------------------------------------------------------------------------------------------
def test_every_queue_runs_on_exactly_the_containers_cus_the_null_streams_included(cu: CuPods) -> None:
    app = cu.start(cu.cu_pod())
    run_everything(app)
    dev = cu.sim()
    queues = dev.queues_of(app.pid)
    assert len(queues) == 5  # the pool's four (the null stream's among them) and the masked stream's own
    assert set(queues.values()) == {QUARTER}
    assert len(dev.of(app.pid)) == 16
    assert {d.cus for d in dev.of(app.pid)} == {QUARTER}
    # 25 % of the card: 76 CUs' worth of work per unit of time, exactly (4 ms per kernel)
    assert dev.throughput(app.pid) == 76
    assert {d.end - d.start for d in dev.of(app.pid)} == {4_000_000}
    assert app.alloc("mem", 10 * GIB)[0] == 0  # the memory cap still holds beside it
    assert app.alloc("mem", 1)[0] == OOM


@pytest.mark.parametrize("layout", ["interleaved", "blocked"])
@pytest.mark.parametrize(("dispatch", "expected"), [("cu", 76), ("xcc", 72)])
def test_a_quarter_of_the_card_runs_a_quarter_as_fast_on_every_device_model(
        cu: CuPods, layout: str, dispatch: str, expected: int) -> None:
    """Hand-computed: with work spread over the queue's CUs, 76 CUs do 76/304 = 25 % of the card's work; with
    work split evenly over the 8 XCCs, a kernel ends with its slowest XCC's part, on 9 CUs of 38: 8 x 9 = 72
    CUs' worth, 23.7 %. The share is 25 % within 4/304 either way, against the same program uncapped."""
    gpu = {"FAKE_HSA_CU_LAYOUT": layout, "FAKE_HSA_DISPATCH": dispatch}
    full = cu.start(cu.cu_pod(masks=None, gpu=gpu))
    capped = cu.start(cu.cu_pod((CuMask(CARD, spread(76, layout)),), gpu=gpu))
    for app in (full, capped):
        assert app.ask(f"launch 0 {WORK} 4") == [0]
    dev = cu.sim()
    assert dev.throughput(full.pid) == CARD
    assert dev.throughput(capped.pid) == pytest.approx(expected, rel=1e-6)
    assert abs(dev.throughput(capped.pid) / dev.throughput(full.pid) - 0.25) <= 4 / CARD + 1e-9


def test_a_mask_that_leaves_an_xcc_without_cus_stalls_when_work_is_split_over_xccs(cu: CuPods) -> None:
    """Not the library's doing but the agent's to know: CUs 0..75 are the first two XCCs when CUs are numbered
    XCC by XCC, and a device that splits each kernel over all eight XCCs cannot finish it."""
    app = cu.start(cu.cu_pod((CuMask(CARD, frozenset(range(76))),),
                             gpu={"FAKE_HSA_CU_LAYOUT": "blocked", "FAKE_HSA_DISPATCH": "xcc"}))
    assert app.ask(f"launch 0 {WORK} 1") == [LAUNCH_FAILURE]
    assert cu.sim().hangs == 1


def test_two_containers_with_disjoint_masks_each_get_their_quarter_side_by_side(cu: CuPods) -> None:
    second = spread(76, "interleaved", skip=10)  # CUs 80..155: none of the first's
    assert not QUARTER & second
    a = cu.start(cu.cu_pod())
    b = cu.start(cu.cu_pod((CuMask(CARD, second),)))
    for _ in range(4):  # interleaved on the one simulated device
        assert a.ask(f"launch 0 {WORK} 1") == [0]
        assert b.ask(f"launch 0 {WORK} 1") == [0]
    dev = cu.sim()
    assert {d.cus for d in dev.of(a.pid)} == {QUARTER}
    assert {d.cus for d in dev.of(b.pid)} == {second}
    assert dev.throughput(a.pid) == dev.throughput(b.pid) == 76  # neither waits for the other's CUs


# ---- what the tenant can do -------------------------------------------------------------------------------
@pytest.mark.parametrize("env", [{"HSA_CU_MASK": "0:0-303"}, {"ROC_GLOBAL_CU_MASK": "0:0-303"},
                                 {"HSA_CU_MASK": "0:0x" + "f" * 76, "ROC_GLOBAL_CU_MASK": "0:0x" + "f" * 76}])
def test_the_cu_mask_variables_never_widen_the_share(cu: CuPods, env: dict[str, str]) -> None:
    app = cu.start(cu.cu_pod(extra=env))
    run_everything(app)
    dev = cu.sim()
    assert set(dev.queues_of(app.pid).values()) == {QUARTER}
    assert {d.cus for d in dev.of(app.pid)} == {QUARTER}


def test_a_narrower_variable_narrows_the_share(cu: CuPods) -> None:
    app = cu.start(cu.cu_pod(extra={"HSA_CU_MASK": "0:38-113"}))  # 76 CUs, half of them the share's
    assert app.ask(f"launch 0 {WORK} 1") == [0]
    assert {d.cus for d in cu.sim().of(app.pid)} == {frozenset(range(38, 76))}


@pytest.mark.parametrize("path", ["direct", "dlsym", "dlvsym", "dlsym_libc", "gpa"])
def test_asking_hsa_for_every_cu_is_answered_with_the_share(cu: CuPods, path: str) -> None:
    app = cu.start(cu.cu_pod(), path)
    rc, q = app.ask("hsaq")
    assert rc == 0
    assert app.ask("hsaget 1") == [0, 76]  # masked from its creation
    assert app.ask(f"hsaset {q} 320 {FULL}") == [REDUCED]
    assert app.ask(f"hsaget {q}") == [0, 76]
    assert app.ask(f"hsaset {q} 0") == [REDUCED]  # count 0: "every CU"
    assert app.ask(f"hsaget {q}") == [0, 76]
    assert app.ask(f"hsaset {q} 32 0xff") == [0]  # within the share: granted as asked
    assert app.ask(f"hsaget {q}") == [0, 8]
    assert app.ask(f"hsaset {q} 96 0xffff 0 0xffffffff") == [REDUCED]  # part of it outside: the part inside
    assert app.ask(f"hsaget {q}") == [0, 16 + 12]  # CUs 0..15 and 64..75
    assert app.ask(f"hsaset {q} 320 0 0 0 0 0 0 0 0 0 0xffff") == [INVALID_ARGUMENT]  # none of the share
    assert app.ask(f"hsaget {q}") == [0, 28]  # the queue keeps its mask
    assert app.ask(f"hsaset {q} 33 0xff") == [INVALID_ARGUMENT]  # the documented argument checks still hold
    assert app.ask(f"hsaset {q} 320 {FULL}") == [REDUCED]
    assert app.ask(f"hsarun {q} {WORK} 1") == [0]
    mine = cu.sim().of(app.pid)
    assert [d.cus for d in mine] == [QUARTER]
    rc, sid = app.ask(f"custream {FULL}")
    assert rc == 0
    assert app.ask(f"getmask {sid}")[:2] == [0, 76]
    assert app.ask(f"launch {sid} {WORK} 1") == [0]
    assert {d.cus for d in cu.sim().of(app.pid)} == {QUARTER}


def test_a_stream_asking_only_for_cus_outside_the_share_is_refused(cu: CuPods) -> None:
    app = cu.start(cu.cu_pod())
    assert app.ask("custream 0 0 0 0xffffffff")[0] == INVALID_VALUE  # CUs 96..127: none of 0..75
    rc, sid = app.ask("custream 0xf0")
    assert rc == 0
    assert app.ask(f"getmask {sid}")[:3] == [0, 4, 0xF0]


def test_a_queue_the_library_did_not_make_gets_no_mask(cu: CuPods) -> None:
    app = cu.start(cu.cu_pod())
    assert app.ask(f"hsaset 0 320 {FULL}") == [INVALID_QUEUE]


def test_a_forged_mask_file_where_the_tenant_can_write_grants_nothing(cu: CuPods, tmp_path: Path) -> None:
    """The tenant writes a full mask (the agent's own writer) into its accounting directory and points the
    one path variable the library knows there: the library reads its masks at its compiled-in path only."""
    pod = cu.cu_pod()
    forged = pod.hook_dir / "hook"
    write_cu_masks(forged, [CuMask(CARD, frozenset(range(CARD)))])
    pod.extra["GPUPOOL_HOOK_DIR"] = str(forged)
    app = cu.start(pod)
    assert app.ask(f"launch 0 {WORK} 1") == [0]
    assert {d.cus for d in cu.sim().of(app.pid)} == {QUARTER}


@pytest.mark.parametrize(("content", "said"), [
    (b"\0" * 2192, "is not a version 1 CU mask file"),
    (b"garbage", "is not 2192 bytes"),
    (b"", "is not 2192 bytes"),
    ("bits past the card", "sets a CU beyond its card's count"),
    ("another card", "the GPU's CU count is not the one its mask was made for"),
])
def test_an_unusable_mask_file_refuses_every_queue(cu: CuPods, tmp_path: Path, content: bytes | str, said: str) -> None:
    """Garbled, or a tenant's full mask where the agent's file should be: never run unmasked."""
    bad = tmp_path / "bad.v1"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    elif content == "another card":  # a valid file for an 80-CU card, on this 304-CU one
        write_cu_masks(tmp_path, [CuMask(80, frozenset(range(20)))])
        bad = tmp_path / CU_MASKS_FILE
    else:  # every bit of the entry set, 1024 CUs on a 304-CU card
        write_cu_masks(tmp_path, [CuMask(CARD, QUARTER)])
        data = bytearray((tmp_path / CU_MASKS_FILE).read_bytes())
        data[24:24 + 128] = b"\xff" * 128
        bad.write_bytes(bytes(data))
        bad.chmod(0o666)
    app = cu.start(cu.cu_pod(mask_file=bad))
    assert app.ask(f"launch 0 {WORK} 1") == [OOM]  # the null stream's queue cannot be made
    assert app.ask("stream") == [OOM, 0]
    assert app.ask("hsaq") == [INVALID_QUEUE_CREATION, 0]
    assert not cu.log.exists() or not cu.sim().of(app.pid)
    err = app.close()
    assert said in err and "refused" in err, err
    assert "AddressSanitizer" not in err and "runtime error" not in err, err


@pytest.mark.parametrize("visible", ["1,0", "1", "0,1"])
def test_rocr_visible_devices_refuses_every_queue_of_a_container_of_several_gpus(cu: CuPods, visible: str) -> None:
    """The masks are matched to GPUs by HSA's order, which ROCR_VISIBLE_DEVICES can change: card 1's queues would
    run with card 0's CUs (maybe a neighbour's there), or card 1 would run unmasked. Any value is refused, since
    the library cannot tell one that keeps the order from one that does not."""
    masks = (CuMask(CARD, QUARTER), CuMask(CARD, frozenset(range(76, 152))))
    app = cu.start(cu.cu_pod(masks, gpu={"FAKE_HIP_DEVICES": "2"}, extra={"ROCR_VISIBLE_DEVICES": visible}))
    assert app.ask(f"launch 0 {WORK} 1") == [OOM]  # the null stream's queue cannot be made
    assert app.ask("hsaq") == [INVALID_QUEUE_CREATION, 0]
    assert not cu.log.exists() or not cu.sim().of(app.pid)
    err = app.close()
    assert "ROCR_VISIBLE_DEVICES" in err and "refused" in err, err


def test_rocr_visible_devices_leaves_a_container_of_one_gpu_alone(cu: CuPods) -> None:
    """One GPU: the variable can only keep it or hide it, so the one mask still meets its card."""
    app = cu.start(cu.cu_pod(extra={"ROCR_VISIBLE_DEVICES": "0"}))
    assert app.ask(f"launch 0 {WORK} 1") == [0]
    assert {d.cus for d in cu.sim().of(app.pid)} == {QUARTER}


# ---- nothing granted: nothing changes -----------------------------------------------------------------------
@pytest.mark.parametrize("masks", [None, (None,)], ids=["no file", "ncu 0"])
def test_without_a_mask_queues_keep_every_cu(cu: CuPods, masks: tuple[CuMask | None, ...] | None) -> None:
    app = cu.start(cu.cu_pod(masks))
    run_everything(app)
    dev = cu.sim()
    card = frozenset(range(CARD))
    assert dev.queues_of(app.pid) and set(dev.queues_of(app.pid).values()) == {card}
    assert dev.throughput(app.pid) == CARD
    assert app.alloc("mem", 10 * GIB)[0] == 0
    assert app.alloc("mem", 1)[0] == OOM


# ---- the fake, without the library: HSA's documented behaviour ---------------------------------------------
@pytest.mark.parametrize(("env", "cus"), [
    ({}, CARD),
    ({"HSA_CU_MASK": "0:0-37"}, 38),
    ({"HSA_CU_MASK": "0:0x" + "f" * 10}, 40),
    ({"HSA_CU_MASK": "0:0-37; 0:40-41"}, 38),  # GPU 0 named again: a syntax error, that set is ignored
    ({"HSA_CU_MASK": "0:0x0"}, CARD),  # no usable CU: a syntax error, nothing applied
    ({"HSA_CU_MASK": "1:0-37"}, CARD),  # another GPU's
])
def test_the_fake_hsa_runtime_masks_as_documented(cu: CuPods, env: dict[str, str], cus: int) -> None:
    app = cu.start(cu.cu_pod(masks=None, extra=env, preload=False))
    rc, q = app.ask("hsaq")
    assert rc == 0
    assert app.ask(f"hsaget {q}") == [0, cus]  # a new queue: HSA_CU_MASK, else every CU
    assert app.ask(f"hsaset {q} 33 0xff") == [INVALID_ARGUMENT]  # not a multiple of 32
    assert app.ask(f"hsaset {q} 32 0xff") == [0]
    assert app.ask(f"hsaget {q}") == [0, 8]
    # every CU and 16 bits past the card: dropped silently, unless a device mask removes some (REDUCED)
    assert app.ask(f"hsaset {q} 320 {FULL}") == [0 if cus == CARD else REDUCED]
    assert app.ask(f"hsaget {q}") == [0, cus]
    assert app.ask(f"hsaset {q} 0") == [0 if cus == CARD else REDUCED]  # count 0: every CU
    assert app.ask(f"hsaget {q}") == [0, cus]


def test_the_fake_hip_runtime_sets_roc_global_cu_mask_on_its_queues_and_records_stream_masks(cu: CuPods) -> None:
    app = cu.start(cu.cu_pod(masks=None, extra={"ROC_GLOBAL_CU_MASK": "0:0-99"}, preload=False))
    assert app.ask(f"launch 0 {WORK} 1") == [0]
    rc, sid = app.ask("custream 0xffff 0xffff 0 0 0xffffffff")  # 32 CUs asked for, 100..127 outside the global
    assert rc == 0
    assert app.ask(f"getmask {sid}")[:2] == [0, 32]
    assert app.ask(f"launch {sid} {WORK} 1") == [0]
    mine = cu.sim().of(app.pid)
    assert [len(d.cus) for d in mine] == [100, 32]
