"""Memory oversubscription holds for a remote share too (issue 30, item 4): the server's worker runs the
interception library with the share's limits file, so a share of 4 GiB oversubscribed by 2 GiB lets the
remote program allocate 6 GiB while the GPU memory it holds stays at 4 GiB (docs/claims.md, "Memory
oversubscription"; tests/native/test_hook_oversubscription.py is the local side)."""

from __future__ import annotations

from tests.native.conftest import PodFactory
from tests.native.native_helpers import GIB, MIB
from tests.native.remote_helpers import Remote, remote, remote_built

__all__ = ["remote", "remote_built"]  # fixtures

OOM = 2


def test_a_remote_share_allocates_beyond_its_cap_from_host_memory(remote: Remote, pods: PodFactory) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="4096", oversub_mib=2048)
    probe = remote.probe(server, token)
    for _ in range(6):
        assert probe.alloc("mem", GIB)[0] == 0
    assert probe.alloc("mem", MIB)[0] == OOM  # the share plus its oversubscription is the ceiling
    observer = pods.start(pods.pod())  # the same simulated GPU, seen without limits, as NVML counts it
    rc, _total, _free, used = observer.ask("nvml")
    assert (rc, used) == (0, 4 * GIB)  # the 2 GiB beyond the share are not on the GPU
