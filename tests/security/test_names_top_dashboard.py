"""Hostile names (pending pods from forged /filter calls, tenant pod names) in `gpupool top`, the web
dashboard and log lines: shown as text, never as markup, terminal escapes, links or HTML."""

from __future__ import annotations

import json
import logging
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.logsafe import MAX_SHOWN, shown
from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.dashboard.app import create_dashboard
from tests.commands.test_top import pool_app, run_top, serve

MARKUP = "x[/]"
OSC8 = "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "wipe\x1b[2J\x1b[H"
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = 'a" hx-get="/steal" hx-trigger="load'
HOSTILE = [MARKUP, OSC8, CLEAR, SCRIPT, ATTRIBUTE]


def hostile_snapshot() -> Snapshot:
    state = ClusterState([Node(f"node-{SCRIPT}", 32000, 128000, (GPU("GPU-0", 0, f"A100{MARKUP}", 40960),))])
    for i, name in enumerate(HOSTILE[:3]):
        key = f"team/{name}"
        grant = GPUGrant("GPU-0", 0, 100, 1024)
        assert state.allocate(PodRequest(key, gpu=GPURequest(1, 100, 1024)), Allocation(key, f"node-{SCRIPT}",
                                                                                          (grant,))) is None, i
    pending = {f"ns/{name}": f"because {name}" for name in HOSTILE}
    return build_snapshot(state, pending, containers={f"team/{MARKUP}": SCRIPT})


# --- gpupool top ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("colour", [False, True], ids=["plain", "forced-colour"])
def test_top_shows_hostile_names_as_text_and_exits_0(colour: bool) -> None:
    body = hostile_snapshot().model_dump_json()
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color"} if colour else {"NO_COLOR": "1", "TERM": "dumb"}
    with serve(pool_app(body)) as url:
        result = run_top("--once", "--url", f"{url}/pool", env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    # No OSC (links, titles) and no cursor/clear sequences: only colour (SGR: ESC [ ... m) may remain.
    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x1b[H" not in out
    if not colour:
        assert "\x1b" not in out
    # The names are there, as text: markup brackets literally, escapes written out.
    assert "team/x[/]" in out and "A100x[/]" in out
    assert "\\x1b]8;;http://evil\\x1b\\\\click" in out
    assert "wipe\\x1b[2J" in out


# --- dashboard --------------------------------------------------------------------------------------------


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    return parser.tags


@pytest.fixture(scope="module")
def dashboard_url() -> Any:
    snap = hostile_snapshot()
    with serve(create_dashboard(lambda: snap)) as url:
        yield url


@pytest.mark.parametrize("path", ["/", "/fragment", "/?q=team", "/fragment?q=%3Cscript%3E", "/?all=1&q=x%5B"])
def test_dashboard_escapes_names_everywhere(dashboard_url: str, path: str) -> None:
    r = httpx.get(dashboard_url + path, timeout=30)
    assert r.status_code == 200
    html = r.text
    assert SCRIPT not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    tags = elements(html)
    # The only script is the vendored htmx; no name became an element or an attribute.
    assert [a.get("src", "") for t, a in tags if t == "script"] in ([], ["/static/htmx.min.js"])
    hx = {(k, v) for _, a in tags for k, v in a.items() if k.startswith("hx-")}
    assert ("hx-get", "/steal") not in hx and ("hx-trigger", "load") not in hx
    assert all(k != "hx-get" or v == "/fragment" for k, v in hx), hx
    # The attribute-shaped name is still shown, as a value (its quotes escaped), in data-pod.
    pods = {a.get("data-pod") for _, a in tags if "data-pod" in a}
    if "q=" not in path or "team" in path:
        assert "team/x[/]" in pods or f"ns/{ATTRIBUTE}" in pods


def test_dashboard_json_is_json(dashboard_url: str) -> None:
    r = httpx.get(dashboard_url + "/api/snapshot", timeout=30)
    assert r.headers["content-type"].startswith("application/json")
    names = {p["pod"] for p in json.loads(r.text)["pending"]}
    assert names == set(HOSTILE)  # the API gives the data as it is; escaping is the views' job


# --- log lines --------------------------------------------------------------------------------------------


def test_shown_escapes_controls_and_bounds_length() -> None:
    assert shown(OSC8) == "\\x1b]8;;http://evil\\x1b\\\\click\\x1b]8;;\\x1b\\\\"
    assert shown("a\nb\rc\x00") == "a\\x0ab\\x0dc\\x00"  # no forged log lines
    assert shown("\u202egnp.exe") == "\\u202egnp.exe"  # right-to-left override (Trojan Source)
    assert shown("team/ünïcödé-名前") == "team/ünïcödé-名前"  # printable text is kept
    long = shown("x" * (4 * 1024 * 1024))
    assert long == "x" * MAX_SHOWN + f"...(+{4 * 1024 * 1024 - MAX_SHOWN} characters)"


@given(st.text(max_size=400))
def test_shown_never_lets_a_control_character_through(text: str) -> None:
    out = shown(text)
    assert all(ch.isprintable() for ch in out)
    assert len(out) <= MAX_SHOWN * 10 + 40  # each kept character becomes at most 10 (\Uxxxxxxxx)


async def test_webhook_log_line_is_escaped(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    import asyncio
    import ssl

    from gpupool.webhook.inventory import InventoryView
    from tests.webhook.helpers import make_tls, pod, review, start_webhook

    tls = make_tls(tmp_path)
    server, task, port = await start_webhook(tls, InventoryView())
    obj = pod({"gpupool.io/gpu": "1"}, name="evil\nINFO forged line\x1b]8;;http://x\x1b\\" + "y" * 5000)
    obj["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "x"}]
    try:
        context = ssl.create_default_context(cafile=str(tls.ca))
        with caplog.at_level(logging.INFO, logger="gpupool.webhook"):
            async with httpx.AsyncClient(verify=context, timeout=30) as client:
                r = await client.post(f"https://127.0.0.1:{port}/validate", json=review(obj))
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
    message = r.json()["response"]["status"]["message"]
    assert "\n" not in message and "\x1b" not in message
    assert "evil\\x0aINFO forged line\\x1b]8;;http://x" in message
    (line,) = [rec.getMessage() for rec in caplog.records if "denied" in rec.getMessage()]
    assert "\n" not in line and "\x1b" not in line and "evil\\x0aINFO forged line" in line
    assert len(line) < 5000  # the 5,000-character name is cut, not copied into the log
