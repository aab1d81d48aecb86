"""`gpupool top` against a real HTTP server serving the pool snapshot (as the scheduler's GET /pool)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpupool.api.snapshot import build_snapshot
from gpupool.cli import main
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState


@contextmanager
def serve(app: Any) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def pool_app(body: Any, status: int = 200) -> Starlette:
    async def pool(request: Request) -> Response:
        content = body() if callable(body) else body
        return Response(content, status_code=status, media_type="application/json")

    return Starlette(routes=[Route("/pool", pool)])


def snapshot_json() -> str:
    state = ClusterState(
        Node(f"gpu-{i}", 32000, 128000, tuple(GPU(f"GPU-{i}-{j}", j, "A100", 40960) for j in range(2)))
        for i in range(2)
    )
    for key, node, j, milli, mem in [("team-a/train", "gpu-1", 0, 300, 10240), ("team-b/infer", "gpu-1", 0, 200, 4096),
                                     ("team-a/whole", "gpu-0", 1, 1000, 40960)]:
        grant = GPUGrant(f"GPU-{node[-1]}-{j}", j, milli, mem)
        assert state.allocate(PodRequest(key, gpu=GPURequest(1, milli, mem)), Allocation(key, node, (grant,))) is None
    state.set_gpu_health("gpu-0", 0, False)
    return build_snapshot(state, {"team-c/big": "needs 2 x a whole free GPU; 1 available"}).model_dump_json()


def run_top(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["top", *args], env={"COLUMNS": "200", **(env or {})})


def test_once_prints_the_pool() -> None:
    with serve(pool_app(snapshot_json())) as url:
        result = run_top("--once", "--url", f"{url}/pool")
    assert result.exit_code == 0, result.output
    out = result.output
    # (300 + 200 + 1000) / 4000 = 37.5 %; GPU-0-1 idle with 100 % strands nothing; GPU-1-0 strands 500
    assert "GPUs 4 (3 healthy)" in out
    assert "compute 37.5 %" in out and "fragmented 12.5 %" in out
    assert "pending 1" in out
    row = next(line for line in out.splitlines() if "team-a/train" in line)
    assert row.split()[:3] == ["gpu-1", "0", "A100"]
    assert "team-b/infer" in row and "50%" in row  # both sharers of GPU 0 on gpu-1, 30 % + 20 % in use
    assert "unhealthy" in next(line for line in out.splitlines() if line.split()[:2] == ["gpu-0", "0"])
    assert "team-c/big" in out and "needs 2 x a whole free GPU" in out


def test_query_and_env_url() -> None:
    with serve(pool_app(snapshot_json())) as url:
        result = run_top("--once", "-q", "WHOLE", env={"GPUPOOL_URL": f"{url}/pool"})
    assert result.exit_code == 0, result.output
    gpu_rows = [line for line in result.output.splitlines() if line.startswith("gpu-")]
    assert len(gpu_rows) == 1 and "team-a/whole" in gpu_rows[0]
    assert "team-c/big" not in result.output


def test_max_gpus_limits_rows() -> None:
    with serve(pool_app(snapshot_json())) as url:
        result = run_top("--once", "--max-gpus", "1", "--url", f"{url}/pool")
    assert result.exit_code == 0
    assert len([line for line in result.output.splitlines() if line.startswith("gpu-")]) == 1
    assert "3 more GPU(s) not shown" in result.output


def test_unreachable_url_exits_2() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        result = run_top("--once", "--url", f"http://127.0.0.1:{port}/pool", "--timeout", "2")
    assert result.exit_code == 2
    assert f"gpupool top: cannot reach http://127.0.0.1:{port}/pool" in result.output


def test_bad_json_and_http_errors_exit_2() -> None:
    with serve(pool_app("{not json")) as url:
        bad = run_top("--once", "--url", f"{url}/pool")
    assert bad.exit_code == 2
    assert "did not return a pool snapshot" in bad.output
    with serve(pool_app('{"nodes": []}')) as url:
        wrong = run_top("--once", "--url", f"{url}/pool")
    assert wrong.exit_code == 2 and "(pending: Field required)" in wrong.output
    with serve(pool_app('{"error": "ledger not synced"}', status=503)) as url:
        down = run_top("--once", "--url", f"{url}/pool")
    assert down.exit_code == 2 and "answered HTTP 503: {\"error\": \"ledger not synced\"}" in down.output


def test_refreshes_until_interrupted() -> None:
    """Without --once, top keeps fetching; what changed after start is in the frame shown at Ctrl-C."""
    first = snapshot_json()
    doc = json.loads(first)
    grant = doc["nodes"][0]["gpus"][1]["grants"][0]
    assert (grant["namespace"], grant["pod"]) == ("team-a", "whole")
    grant.update(namespace="team-z", pod="late")
    changed = json.dumps(doc)
    served = {"n": 0}
    two_after_change = threading.Event()

    def body() -> str:
        served["n"] += 1
        if served["n"] >= 5:
            two_after_change.set()
        return first if served["n"] <= 2 else changed

    with serve(pool_app(body)) as url:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from gpupool.cli import main; main()", "top", "--url", f"{url}/pool",
             "--interval", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
            # Ctrl-C as a terminal delivers it, even when this suite runs as a background job of a
            # non-interactive shell, which starts it (and so the child) with SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            assert two_after_change.wait(timeout=60), "top did not keep refreshing"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"top did not stop within 30 s of SIGINT; its stderr ends: {err[-2000:]!r}") from None
        finally:
            if proc.poll() is None:  # reaped and its pipes closed here, so nothing leaks into later tests
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert "team-z/late" in out


def test_team_queues_are_shown() -> None:
    from gpupool.api.snapshot import QueueView, Snapshot

    snap = Snapshot.model_validate_json(snapshot_json()).model_copy(update={"queues": [
        QueueView(name="team-a", used_gpus=2.5, guaranteed_gpus=2, maximum_gpus=None, borrowed_gpus=0.5, pending=1)]})
    with serve(pool_app(snap.model_dump_json())) as url:
        result = run_top("--once", "--url", f"{url}/pool")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith("team-a "))
    # queue, used, guaranteed, maximum (none: unlimited), borrowed, lent, pending
    assert row.split() == ["team-a", "2.5", "2", "-", "0.5", "0", "1"]


def test_piped_or_narrow_it_prints_lines_that_keep_every_name() -> None:
    """At 80 columns (a pipe's width) the seven-column table cut names and bars short: the frame is then one
    line per GPU and one per pod on it, wrapped to the width, every name whole."""
    long_name = "team-a/" + "inference-server-with-a-long-name-" * 2 + "0"
    snap = json.loads(snapshot_json())
    snap["pending"][0]["pod"] = long_name.split("/")[1]
    with serve(pool_app(json.dumps(snap))) as url:
        result = run_top("--once", "--url", f"{url}/pool", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, result.output
    assert not any(c in result.output for c in "█·─"), result.output
    # (300 + 200 + 1000) / 4000 = 37.5 %, as in the table
    assert "compute 37.5 %" in result.output
    gpu_line = lines.index("gpu-1  GPU 0  A100  nvidia/cuda  used 50%  memory 14336/40960 Mi")
    assert lines[gpu_line + 1:gpu_line + 3] == ["    team-a/train  30%  10240Mi", "    team-b/infer  20%  4096Mi"]
    assert "gpu-0  GPU 0  A100 unhealthy  nvidia/cuda  used 0%  memory 0/40960 Mi" in lines
    waiting = lines[lines.index("pending GPU pods:") + 1:]
    assert "".join(part.strip() for part in waiting).startswith(
        long_name.removeprefix("team-a/").join(["team-c/", ":"]))
