from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.native_helpers import Built, Pod, Probe, build_all, have_cc


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert have_cc(), "no C compiler: the native tests need one (set CC)"
    return build_all(tmp_path_factory.mktemp("native"))


@pytest.fixture
def device(tmp_path: Path) -> Path:
    """A fresh simulated GPU (its state file) for one test."""
    return tmp_path / "fake-gpu-state"


# Every pod's processes run in a PID namespace of their own, as in a real pod: NVML names them by host PIDs
# that differ from their getpid() (fake_state.h, FAKE_GPU_PID_NS).
PID_NS_STEP = 10_000_000


class PodFactory:
    def __init__(self, built: Built, device: Path, root: Path) -> None:
        self.built, self.device, self.root = built, device, root
        self.probes: list[Probe] = []
        self.count = 0

    def pod(self, **kwargs: object) -> Pod:
        self.count += 1
        hook_dir = self.root / f"pod-{self.count}"
        hook_dir.mkdir()
        kwargs.setdefault("pid_ns", PID_NS_STEP * self.count)
        return Pod(self.built, self.device, hook_dir, **kwargs)  # type: ignore[arg-type]

    def start(self, pod: Pod, mode: str = "direct") -> Probe:
        probe = pod.start(mode)
        self.probes.append(probe)
        return probe

    def close_all(self, kill: bool = True, check_reports: bool = False) -> None:
        """Ends every probe started: killed if still running with `kill` (a sanitized probe is left to finish,
        killing it would lose its report), and with `check_reports` failing on a sanitizer's report."""
        for probe in self.probes:
            if kill and probe.proc.poll() is None:
                probe.proc.kill()
            err = probe.close()
            if check_reports:
                assert "AddressSanitizer" not in err and "runtime error" not in err, err


@pytest.fixture
def pods(built: Built, device: Path, tmp_path: Path) -> Iterator[PodFactory]:
    factory = PodFactory(built, device, tmp_path)
    yield factory
    factory.close_all()
