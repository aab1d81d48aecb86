"""Faults for the soak (benchmarks/soak.py, tests/e2e/test_e2e_soak.py): the restarts the testbed's own
objects do not offer, as small functions over them.

Standard library only, like the rest of tests/harness. Every function that starts a process must be called
from the thread that lives as long as the testbed (the main thread): the processes die with the thread that
started them (testbed.die_with_parent).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import testbed as tb


def respawn(bed: tb.Testbed, name: str) -> tb.Process:
    """Stop the testbed's process `name` (SIGTERM, then SIGKILL) and start it again with the same command line
    and log: what a restarted static pod or systemd unit does. Its state stays where its flags put it (etcd's
    data directory, the API server's certificates and token file)."""
    old = bed.processes.get(name)
    if old is None:
        raise tb.TestbedError(f"the testbed runs no process named {name!r} ({', '.join(bed.processes)})")
    argv = [str(a) for a in old.popen.args]  # type: ignore[union-attr]
    old.stop()
    proc = bed.processes[name] = tb.spawn(name, argv, old.log)
    return proc


def _answers(url: str, token: str | None = None) -> bool:
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=3, context=ctx) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _wait(proc: tb.Process, ready: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not proc.alive():
            raise tb.TestbedError(f"{proc.name} exited ({proc.popen.returncode}) after its restart:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise tb.TestbedError(f"{proc.name} not ready {timeout_s:.0f}s after its restart:\n{proc.tail()}")
        time.sleep(0.3)


def restart_control_plane(bed: tb.Testbed, timeout_s: float = 180.0) -> None:
    """etcd, then kube-apiserver, restarted one after the other (both down a moment, as when their machine
    reboots); returns once the API server answers /readyz again."""
    etcd = respawn(bed, "etcd")
    etcd_url = str(bed.etcd_url)  # set when the testbed started etcd
    _wait(etcd, lambda: _answers(f"{etcd_url}/health"), timeout_s)
    api = respawn(bed, "kube-apiserver")
    _wait(api, lambda: _answers(bed.url + "/readyz", bed.admin_token), timeout_s)


def restart_kubelet(node: Any) -> None:
    """Stop the node's kubelet (SIGTERM) and start it again with the same configuration; its pods keep
    running in containerd meanwhile (a realnode.RealNode)."""
    node.stop_kubelet()
    node.start_kubelet()


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def restart_containerd(node: Any, timeout_s: float = 60.0) -> None:
    """Stop the node's containerd (SIGTERM: its shims and containers keep running, as on any node) and start
    it again in the node's same mount namespace, entered through a process still in it (kubelet, else a
    shim): the kubelet's volume mounts and the node's bind mounts stay the ones the new containerd sees, and
    the kubelet reconnects to the same socket. A realnode.RealNode."""
    old = node.containerd
    if old is None or not old.alive():
        raise tb.TestbedError(f"containerd of {node.name} is not running")
    namespace = _mount_namespace(old.popen.pid)
    old.stop()
    holder = node.kubelet.popen.pid if node.kubelet is not None and node.kubelet.alive() else None
    if holder is None or _mount_namespace(holder) != namespace:
        holder = next((int(p.name) for p in Path("/proc").iterdir()
                       if p.name.isdigit() and _mount_namespace(int(p.name)) == namespace), None)
    if holder is None:
        raise tb.TestbedError(f"no process left in the mount namespace of {node.name}: containerd cannot rejoin it")
    argv = [str(a) for a in old.popen.args]  # env PATH=... unshare ... sh -c '<binds> && exec containerd ...'
    # the binds are in place already: only containerd itself (the first start's script, or a restart's)
    command = argv[-1].split(" && exec ", 1)[-1].removeprefix("exec ")
    path = next(a for a in argv if a.startswith("PATH="))
    node.containerd = tb.spawn(old.name, ["nsenter", "--target", str(holder), "--mount", "--", "env", path,
                                          "sh", "-c", f"exec {command}"], old.log)
    deadline = time.monotonic() + timeout_s
    while not node._ctr_ok():  # noqa: SLF001  # the node's own readiness probe
        if not node.containerd.alive():
            raise tb.TestbedError(f"containerd of {node.name} exited after its restart:\n{node.containerd.tail()}")
        if time.monotonic() > deadline:
            raise tb.TestbedError(f"containerd of {node.name} not answering {timeout_s:.0f}s after its restart")
        time.sleep(0.2)
