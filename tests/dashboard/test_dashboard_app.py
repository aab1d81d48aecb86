"""The dashboard's HTTP surface, served by a real uvicorn server on 127.0.0.1 and read with httpx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.core.model import GPU, Node
from gpupool.core.state import ClusterState
from gpupool.dashboard import create_dashboard


def mounted(provider: Any, sim_dir: Path | None = None, cache_s: float = 0) -> Starlette:
    app = Starlette()
    app.mount("/ui", create_dashboard(provider, sim_results_dir=sim_dir, cache_s=cache_s))
    return app


def test_json_snapshot_and_page(cluster: ClusterState, give_pod: Any, serve_app: Any) -> None:
    give_pod(cluster, "team-a/train", "n1", 1, 400, 8192)
    with serve_app(mounted(lambda: build_snapshot(cluster, {"team-b/wait": "no GPU"}))) as url:
        r = httpx.get(f"{url}/ui/api/snapshot")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert Snapshot.model_validate_json(r.content) == build_snapshot(cluster, {"team-b/wait": "no GPU"})
        page = httpx.get(f"{url}/ui/", follow_redirects=True)
        assert page.status_code == 200
        assert page.text.count('data-gpu-uuid=') == 4
        assert 'data-pod="team-a/train"' in page.text and 'data-pod="team-b/wait"' in page.text
        assert 'src="/ui/static/htmx.min.js"' in page.text  # links follow the mount point
        js = httpx.get(f"{url}/ui/static/htmx.min.js")
        assert js.status_code == 200 and "Zero-Clause BSD" in js.text[:600]


def test_search_filters_nodes_and_pending(cluster: ClusterState, give_pod: Any, serve_app: Any) -> None:
    give_pod(cluster, "team-a/train", "n0", 0, 400, 8192)
    give_pod(cluster, "team-b/infer", "n1", 1, 400, 8192)
    pending = {"team-a/train-2": "no fit", "team-c/x": "no fit"}
    with serve_app(mounted(lambda: build_snapshot(cluster, pending))) as url:
        frag = httpx.get(f"{url}/ui/fragment", params={"q": "TEAM-A/TRAIN"}).text
        # one grant and one pending pod match (case-insensitive); node n1 is not listed
        assert "2 matches" in frag
        assert 'data-node="n0"' in frag and 'data-node="n1"' not in frag
        assert 'data-pod="team-a/train-2"' in frag and 'data-pod="team-c/x"' not in frag
        none = httpx.get(f"{url}/ui/fragment", params={"q": "nobody"}).text
        assert "0 matches" in none and "No node or GPU pod matches" in none
        full = httpx.get(f"{url}/ui/fragment").text
        assert 'data-node="n0"' in full and 'data-node="n1"' in full and "match" not in full.split("</section>")[0]


def test_large_pools_are_cut_to_max_nodes(cluster_factory: Any, give_pod: Any, serve_app: Any) -> None:
    state = cluster_factory(nodes=12, gpus=1)
    give_pod(state, "ns/late", "n11", 0, 500, 1024)
    app = Starlette()
    app.mount("/ui", create_dashboard(lambda: build_snapshot(state, {}), max_nodes=5))
    with serve_app(app) as url:
        page = httpx.get(f"{url}/ui/").text
        assert page.count("data-node=") == 5 and "7 more nodes not shown" in page
        assert 'href="/ui/?all=1"' in page
        every = httpx.get(f"{url}/ui/", params={"all": "1"}).text
        assert every.count("data-node=") == 12 and "more node" not in every
        assert 'id="all"' in every  # so that the polling keeps showing everything
        # a search reaches past the cut: by pod, and by node name
        assert 'data-node="n11"' in httpx.get(f"{url}/ui/fragment", params={"q": "late"}).text
        by_node = httpx.get(f"{url}/ui/fragment", params={"q": "n1"}).text
        assert [n for n in ("n1", "n10", "n11") if f'data-node="{n}"' in by_node] == ["n1", "n10", "n11"]
        assert "3 matches" in by_node  # the nodes n1, n10 and n11 (no pod name contains "n1")


def test_concurrent_viewers_share_one_snapshot(cluster: ClusterState, serve_app: Any) -> None:
    calls = {"n": 0}

    def provider() -> Snapshot:
        calls["n"] += 1
        return build_snapshot(cluster, {})

    # an hour-long cache: every request below falls inside it, however slow the machine
    with serve_app(mounted(provider, cache_s=3600)) as url:
        for path in ("/ui/", "/ui/fragment", "/ui/fragment?q=x", "/ui/api/snapshot"):
            assert httpx.get(f"{url}{path}").status_code == 200
    assert calls["n"] == 1


def test_user_text_is_escaped(cluster: ClusterState, give_pod: Any, serve_app: Any) -> None:
    with serve_app(mounted(lambda: build_snapshot(cluster, {"ns/p": "<img src=x onerror=alert(1)>"}))) as url:
        body = httpx.get(f"{url}/ui/", params={"q": '"><script>alert(1)</script>'}, follow_redirects=True).text
        assert "<script>alert(1)" not in body
        assert "&lt;script&gt;alert(1)" in body
        assert "<img src=x" not in httpx.get(f"{url}/ui/fragment").text


def test_a_nodes_gpu_server_and_its_remote_shares_are_shown_escaped(cluster: ClusterState, serve_app: Any) -> None:
    """The agent's inventory names the node's GPU server (docs/remote.md); the page shows it under the node,
    escaped (an address is the agent's, but every name shown to a person is), and nothing for a node
    without one."""
    servers = {"n1": ("tcp:10.0.0.1:7070<b>", 2)}
    with serve_app(mounted(lambda: build_snapshot(cluster, {}, servers=servers))) as url:
        snap = Snapshot.model_validate_json(httpx.get(f"{url}/ui/api/snapshot").content)
        assert [(n.name, n.remote_server, n.remote_shares) for n in snap.nodes] == [
            ("n0", "", 0), ("n1", "tcp:10.0.0.1:7070<b>", 2)]
        page = httpx.get(f"{url}/ui/", follow_redirects=True).text
        assert "GPU server tcp:10.0.0.1:7070&lt;b&gt; · 2 remote shares" in page
        assert page.count('class="server"') == 1


def test_provider_failure_is_reported_and_the_app_keeps_serving(cluster: ClusterState, serve_app: Any) -> None:
    state = {"broken": True}

    def provider() -> Snapshot:
        if state["broken"]:
            raise RuntimeError("ledger not synced")
        return build_snapshot(cluster, {})

    with serve_app(mounted(provider)) as url:
        assert httpx.get(f"{url}/ui/api/snapshot").status_code == 503
        page = httpx.get(f"{url}/ui/", follow_redirects=True)
        assert page.status_code == 503 and "not available" in page.text
        state["broken"] = False
        assert httpx.get(f"{url}/ui/api/snapshot").status_code == 200


def sim_results(out: Path, with_plot: bool = True) -> dict[str, Any]:
    """A results directory written by the simulator's own writer (the format the page must read)."""
    from gpupool.sim.report import plot, write_results

    policies = {
        name: {"unallocated_pct_at_100": u100, "std_pct_at_100": 0.4, "unallocated_pct_at_130": u130,
               "curve": [[0, 0.0], [50, 50.0], [100, 100 - u100], [130, 100 - u130]], "seconds_per_seed": 1.25,
               "failed_pods_mean": 3.0}
        for name, u100, u130 in [("random", 9.5, 4.0), ("fgd", 2.25, 1.0), ("bestfit", 5.0, 2.0)]
    }
    write_results(out, "default", [42, 43], policies)
    if with_plot:
        plot(out, "default", policies)
    return policies


def test_simulation_report(cluster: ClusterState, serve_app: Any, tmp_path: Path) -> None:
    sim_results(tmp_path)
    with serve_app(mounted(lambda: build_snapshot(cluster, {}), tmp_path)) as url:
        page = httpx.get(f"{url}/ui/simulation")
        assert page.status_code == 200
        rows = [line.split('data-policy="')[1].split('"')[0] for line in page.text.splitlines()
                if 'data-policy="' in line]
        assert rows == ["fgd", "bestfit", "random"]  # least unallocated at 100 % first
        assert "2.25 %" in page.text and "42, 43" in page.text
        assert 'src="/ui/simulation/allocation.png"' in page.text
        png = httpx.get(f"{url}/ui/simulation/allocation.png")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content.startswith(b"\x89PNG")


def test_simulation_without_plot_draws_the_curves(cluster: ClusterState, serve_app: Any, tmp_path: Path) -> None:
    sim_results(tmp_path, with_plot=False)
    with serve_app(mounted(lambda: build_snapshot(cluster, {}), tmp_path)) as url:
        page = httpx.get(f"{url}/ui/simulation").text
        assert page.count("<polyline") == 3
        # fgd's curve: (100 % arrived, 97.75 % allocated) -> x = 100/130 * 600, y = 300 - 0.9775 * 300
        assert "461.5,6.8" in page
        assert httpx.get(f"{url}/ui/simulation/allocation.png").status_code == 404


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (None, 404, "no results.json in"),
        ("{not json", 500, "is not readable JSON"),
        (json.dumps({"trace": "t", "seeds": [1], "policies": {"x": {"curve": []}}}), 500,
         "policies.x.unallocated_pct_at_100: Field required"),
        (json.dumps({"trace": "t", "seeds": [1], "policies": {}}), 500, "policies: "),
    ],
)
def test_bad_simulation_results_say_what_is_wrong(
    cluster: ClusterState, serve_app: Any, tmp_path: Path, content: str | None, status: int, message: str
) -> None:
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    with serve_app(mounted(lambda: build_snapshot(cluster, {}), tmp_path)) as url:
        page = httpx.get(f"{url}/ui/simulation")
        assert page.status_code == status
        assert message in page.text
        assert httpx.get(f"{url}/ui/api/snapshot").status_code == 200  # the rest keeps working


def test_simulation_not_configured(cluster: ClusterState, serve_app: Any) -> None:
    with serve_app(mounted(lambda: build_snapshot(cluster, {}))) as url:
        page = httpx.get(f"{url}/ui/simulation")
        assert page.status_code == 404 and "No simulation results configured" in page.text


def test_team_queues_are_listed_with_escaped_names(cluster: ClusterState, serve_app: Any) -> None:
    from gpupool.api.snapshot import QueueView

    def provider() -> Snapshot:
        return build_snapshot(cluster, {}).model_copy(update={"queues": [
            QueueView(name="team-a", used_gpus=2, guaranteed_gpus=1, maximum_gpus=2, borrowed_gpus=1, pending=3),
            QueueView(name="<b>x</b>", used_gpus=0, guaranteed_gpus=1, lent_gpus=1)]})

    with serve_app(mounted(provider)) as url:
        page = httpx.get(f"{url}/ui/", follow_redirects=True).text
    row = page[page.index('data-queue="team-a"'):]
    row = row[:row.index("</tr>")]
    # used, guaranteed, maximum, borrowed, lent, pending
    assert [c.split("<")[0] for c in row.split("<td>")[1:]] == ["team-a", "2", "1", "2", "1", "0", "3"]
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "<td>-</td>" in page  # no maximum: unlimited


def test_gpu_memory_is_shown_to_one_decimal(serve_app: Any) -> None:
    """An L40S's 46,068 MiB is 44.98828125 GiB: the page says 45 GiB, not 44.9883 GiB."""
    state = ClusterState([Node("n0", 64000, 256000, (GPU("GPU-a", 0, "L40S", 46068), GPU("GPU-b", 1, "A10", 23040)))])
    with serve_app(mounted(lambda: build_snapshot(state, {}))) as url:
        page = httpx.get(f"{url}/ui/", follow_redirects=True).text
    assert "L40S · 45 GiB" in page and "A10 · 22.5 GiB" in page
    assert "44.98" not in page
