"""Host processes for the watchdog: the cgroup parser (held to the exporter's fixtures, so the two readers
of the kubelet's cgroup paths agree), and the pidfd killer on real child processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.agent.enforce.procs import PidfdKiller, ProcRef, ProcTable, bare_container_id, parse_cgroup
from gpupool.exporter.cgroup import parse_cgroup as exporter_parse_cgroup
from tests.agent.watchdog_helpers import write_proc

FIXTURES = Path(__file__).resolve().parents[2] / "exporter" / "fixtures"
UID = "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e"
CID = "0f3c9a1b2d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("cgroup-*.txt")))
def test_the_agent_and_the_exporter_read_every_cgroup_fixture_alike(fixture: str) -> None:
    text = (FIXTURES / fixture).read_text()
    theirs = exporter_parse_cgroup(text)
    mine = parse_cgroup(text)
    got = (mine.pod_uid, mine.container_id) if mine is not None else None
    expected = (theirs.pod_uid, theirs.container_id) if theirs is not None else None
    assert got == expected


def test_both_cgroup_drivers_and_versions() -> None:
    systemd = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
               f"cri-containerd-{CID}.scope\n")
    cgroupfs_v1 = f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu:/kubepods/burstable/pod{UID}/{CID}\n"
    pod_level = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n"
    assert parse_cgroup(systemd) == ProcRef(UID, CID)
    assert parse_cgroup(cgroupfs_v1) == ProcRef(UID, CID)
    assert parse_cgroup(pod_level) == ProcRef(UID, None)
    assert parse_cgroup("0::/system.slice/containerd.service\n") is None
    assert bare_container_id(f"containerd://{CID}") == CID == bare_container_id(CID)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_pidfd_killer_stops_a_process_of_the_expected_container_only(tmp_path: Path) -> None:
    ours, theirs = _sleeper(), _sleeper()
    try:
        write_proc(tmp_path, ours.pid, UID, CID)
        write_proc(tmp_path, theirs.pid, UID, "1" * 64)  # the PID now runs in another container
        killer = PidfdKiller(ProcTable(tmp_path))
        assert killer.kill(ours.pid, ProcRef(UID, CID)) is True
        assert ours.wait(timeout=30) == -9
        assert killer.kill(theirs.pid, ProcRef(UID, CID)) is False  # the cgroup no longer matches: spared
        assert theirs.poll() is None
        assert killer.kill(ours.pid, ProcRef(UID, CID)) is False  # gone already
        assert killer.kill(1, ProcRef(UID, CID)) is False  # never init
    finally:
        theirs.kill()
        theirs.wait(timeout=30)
