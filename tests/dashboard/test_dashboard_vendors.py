"""The dashboard over a mixed pool (tests/dashboard/mixed_pool.py), read with httpx: a card per vendor in the
header, each GPU's vendor and runtime, its partitions with their holders, every name escaped."""

from __future__ import annotations

import re
from typing import Any

import httpx

from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.core.model import GPU, Node
from gpupool.core.state import ClusterState
from tests.dashboard.mixed_pool import EVIL_NS, REPORTED, mixed_state
from tests.dashboard.test_dashboard_app import mounted


def page(url: str, **params: str) -> str:
    r = httpx.get(f"{url}/ui/", params=params, follow_redirects=True)
    assert r.status_code == 200
    return r.text


def element(html: str, tag: str, **attrs: str) -> str:
    """The first `tag` element carrying all `attrs` (values as the page writes them), up to its end tag."""
    want = "".join(rf'(?=[^>]*\b{re.escape(k.replace("_", "-"))}="{re.escape(v)}")' for k, v in attrs.items())
    found = re.search(rf"<{tag}\b{want}[^>]*>.*?</{tag}>", html, re.S)
    assert found, (tag, attrs)
    return found.group(0)


def text(fragment: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", fragment).split())


def test_a_card_per_vendor_in_the_header(serve_app: Any) -> None:
    with serve_app(mounted(lambda: build_snapshot(mixed_state(), {}, partitions=REPORTED))) as url:
        html = page(url)
    cards = re.findall(r'<div class="card vendor" data-vendor="([^"]*)"', html)
    assert cards == ["amd", "ascend", "nvidia"]
    # 2 x 192 GiB; 1,125 of 2,000 milli and 221,184 of 393,216 MiB; Ascend 266 of 1,000 and 17,476 / 65,536 MiB
    assert text(element(html, "div", data_vendor="amd")) == "amd · rocm 2 GPUs · 384 GiB compute 56.2 % · memory 56.2 %"
    assert text(element(html, "div", data_vendor="ascend")) == \
        "ascend · cann 1 GPU · 64 GiB compute 26.6 % · memory 26.7 %"
    assert text(element(html, "div", data_vendor="nvidia")).startswith("nvidia · cuda 2 GPUs · 80 GiB")


def test_each_gpu_shows_its_vendor_and_partitions(serve_app: Any) -> None:
    with serve_app(mounted(lambda: build_snapshot(mixed_state(), {}, partitions=REPORTED))) as url:
        html = page(url)
        snap = Snapshot.model_validate_json(httpx.get(f"{url}/ui/api/snapshot").content)
    vendors = dict(re.findall(r'data-gpu-uuid="([^"]+)" data-sharers="\d+" data-vendor="([^"]*)"', html))
    assert vendors == {"GPU-nv-0": "nvidia", "GPU-nv-1": "nvidia", "AMD-0": "amd", "AMD-1": "amd", "NPU-0": "ascend"}
    assert "GPU 0 · MI300X · 192 GiB · amd/rocm" in text(html)
    amd = element(html, "ul", aria_label="partitions of GPU 0")  # the first GPU 0 with partitions: amd-0's
    assert re.findall(r'data-profile="CPX/NPS4" data-start="(\d)"', amd) == [str(k) for k in range(8)]
    held = element(html, "li", data_profile="CPX/NPS4", data_start="2")
    assert 'class="part used"' in held and text(held) == "CPX/NPS4 @2 · team-b/rocm"
    assert 'title="CPX/NPS4 at 2: 38 CU, 24576 MiB"' in held
    assert text(element(html, "li", data_profile="3g.20gb", data_start="4")) == "3g.20gb @4 · idle"
    assert 'title="vir08 at 0: 8 AI Core, 17476 MiB"' in html
    # the JSON the page serves carries the same
    assert [p.profile for n in snap.nodes for g in n.gpus for p in g.partitions if g.uuid == "NPU-0"] == [
        "vir08", "vir04"]


def test_names_from_tenants_and_agents_are_escaped(serve_app: Any) -> None:
    hostile = {**REPORTED, "NPU-0": [('<img src=x onerror="alert(2)">', 1, False)]}
    state = mixed_state()
    with serve_app(mounted(lambda: build_snapshot(state, {}, partitions=hostile))) as url:
        html = page(url, q="npu")
    assert "<script>" not in html and "<img src=x" not in html
    assert "[bold red]npu[/bold red]&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-profile="&lt;img src=x onerror=&#34;alert(2)&#34;&gt;"' in html
    # the search finds the pod on its vNPU, and the vNPU is marked as matching
    assert 'class="part used match"' in element(html, "li", data_profile="vir08")
    assert f"{EVIL_NS}/[bold red]npu" in html


def test_an_unknown_vendor_is_shown_escaped_without_a_runtime(serve_app: Any) -> None:
    state = ClusterState([Node("x", 1000, 1000, (GPU("X-0", 0, "Card<b>", 8192, vendor="acme<i>"),))])
    with serve_app(mounted(lambda: build_snapshot(state, {}))) as url:
        html = page(url)
    assert text(element(html, "div", data_vendor="acme&lt;i&gt;")).startswith("acme&lt;i&gt; 1 GPU · 8 GiB")
    assert "<i>" not in html and "<b>" not in html
    assert "· <span class=\"vendor\">acme&lt;i&gt;</span>" in html
