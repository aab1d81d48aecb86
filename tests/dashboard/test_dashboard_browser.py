"""The dashboard in headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

The page must load, show every GPU and a known pod on its GPU, follow changes in the pool without a
reload (htmx polling), and filter by pod. Screenshots are kept under a temporary directory whose path
is printed (`pytest -s` shows it). The browser fixtures are tests/dashboard/browser.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from starlette.applications import Starlette

from gpupool.core.state import ClusterState
from gpupool.dashboard import create_dashboard
from tests.dashboard.browser import WAIT_S


# Read in one script: the page swaps in fresh elements every poll, so elements found by one call can be
# gone (stale) by the next.
def shares_on(driver: webdriver.Chrome, uuid: str) -> list[str]:
    script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.dataset.pod || '')"
    result: list[str] = driver.execute_script(script, f'.gpu[data-gpu-uuid="{uuid}"] .share')
    return result


def node_names(driver: webdriver.Chrome) -> list[str]:
    result: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('.node')).map(e => e.dataset.node)")
    return result


def test_pool_page_live_and_searchable(
    cluster_factory: Any, give_pod: Any, serve_app: Any, shared_pool: Any, browser: webdriver.Chrome, shots: Path
) -> None:
    state: ClusterState = cluster_factory(nodes=3, gpus=4)
    give_pod(state, "team-a/train-0", "n1", 2, 600, 20480)
    give_pod(state, "team-b/infer-3", "n1", 2, 300, 8192)
    give_pod(state, "team-a/whole", "n2", 0, 1000, 40960)
    pool = shared_pool(state, {"team-c/big": "needs 2 x a whole free GPU; 1 available"})
    app = Starlette()
    app.mount("/ui", create_dashboard(pool.snapshot, refresh_s=0.5))
    wait = WebDriverWait(browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))  # see shares_on
    with serve_app(app) as url:
        browser.get(f"{url}/ui/")
        wait.until(lambda d: d.execute_script("return window.htmx && htmx.version"))
        assert browser.execute_script("return htmx.version") == "2.0.11"  # the vendored copy, not a CDN
        assert len(browser.find_elements(By.CSS_SELECTOR, ".gpu")) == 12
        # read through `wait`: the page swaps its fragment every 0.5 s, and an element found just before a swap
        # is stale when it is read
        wait.until(lambda d: d.find_element(By.ID, "total-gpus").text == "12")
        wait.until(lambda d: shares_on(d, "GPU-1-2") == ["team-a/train-0", "team-b/infer-3"])

        def share_is_60_percent_of_its_bar(d: webdriver.Chrome) -> bool:  # allow for borders and rounding
            share = d.find_element(By.CSS_SELECTOR, '.share[data-pod="team-a/train-0"]')
            bar = d.find_element(By.CSS_SELECTOR, '.gpu[data-gpu-uuid="GPU-1-2"] .bar')
            return (share.get_attribute("textContent") or "").strip() == "team-a/train-0" and \
                share.size["width"] / bar.size["width"] == pytest.approx(0.6, abs=0.03)

        wait.until(share_is_60_percent_of_its_bar)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#pending tr[data-pod="team-c/big"]').text.endswith(
            "needs 2 x a whole free GPU; 1 available"))
        # (600 + 300 + 1000) / 12000
        wait.until(lambda d: d.find_element(By.ID, "allocated").text == "15.8 %")
        browser.save_screenshot(str(shots / "1-loaded.png"))

        # the pool changes; the open page follows without a reload
        marker = browser.execute_script("window.__same_page = 1; return 1")
        with pool.lock:
            state.release("team-a/train-0")
            give_pod(state, "team-d/new-7", "n0", 3, 500, 4096)
            state.set_gpu_health("n2", 3, False)
            pool.pending.clear()
        wait.until(lambda d: shares_on(d, "GPU-0-3") == ["team-d/new-7"])
        wait.until(lambda d: shares_on(d, "GPU-1-2") == ["team-b/infer-3"])
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '.gpu.unhealthy[data-gpu-uuid="GPU-2-3"]'))
        wait.until(lambda d: d.find_element(By.ID, "pending-count").text == "0")
        assert browser.execute_script("return window.__same_page") == marker
        browser.save_screenshot(str(shots / "2-updated.png"))

        # search: only the node holding the pod remains, and the pod is highlighted
        box = browser.find_element(By.ID, "q")
        box.send_keys("new-7")
        wait.until(lambda d: d.find_elements(By.ID, "matches") and d.find_element(By.ID, "matches").text.startswith(
            "1 match"))
        assert node_names(browser) == ["n0"]
        assert browser.find_elements(By.CSS_SELECTOR, '.share.match[data-pod="team-d/new-7"]')
        # polling keeps the search applied
        with pool.lock:
            give_pod(state, "team-d/new-7b", "n1", 0, 100, 1024)
        wait.until(lambda d: d.find_element(By.ID, "matches").text.startswith("2 matches"))
        wait.until(lambda d: node_names(d) == ["n0", "n1"])
        browser.save_screenshot(str(shots / "3-search.png"))
    assert all((shots / f).stat().st_size > 0 for f in ("1-loaded.png", "2-updated.png", "3-search.png"))
