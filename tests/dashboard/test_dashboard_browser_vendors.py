"""The dashboard of a mixed pool in headless Chromium (as tests/dashboard/test_dashboard_browser.py): the vendor
cards, each GPU's vendor and partitions, names shown as text (no markup or script of theirs runs), and the page
following the pool when a partition is given back."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait
from starlette.applications import Starlette

from gpupool.api.snapshot import Snapshot, build_snapshot
from gpupool.dashboard import create_dashboard
from tests.dashboard.browser import WAIT_S
from tests.dashboard.mixed_pool import EVIL_NS, EVIL_POD, REPORTED, mixed_state

XSS_PROFILE = '<img src=x onerror="window.__xss = 1">'


def read(driver: webdriver.Chrome, script: str) -> Any:
    """One script per read: the page swaps its fragment every poll, so elements found earlier go stale."""
    return driver.execute_script(script)


def vendor_cards(driver: webdriver.Chrome) -> list[tuple[str, str]]:
    return [tuple(x) for x in read(driver, "return Array.from(document.querySelectorAll('.card.vendor'))"
                                           ".map(e => [e.dataset.vendor, e.innerText.replace(/\\s+/g, ' ').trim()])")]


def partitions(driver: webdriver.Chrome, uuid: str) -> list[tuple[str, str, str, bool]]:
    script = (f"return Array.from(document.querySelectorAll('.gpu[data-gpu-uuid=\"{uuid}\"] .part'))"
              ".map(e => [e.dataset.profile, e.dataset.start, e.dataset.holder, e.classList.contains('used')])")
    return [tuple(x) for x in read(driver, script)]


def test_mixed_pool_in_the_browser(browser: webdriver.Chrome, shots: Path, serve_app: Any) -> None:
    state = mixed_state()
    reported = {**REPORTED, "NPU-0": [(XSS_PROFILE, 1, False)]}
    lock = threading.Lock()

    def provider() -> Snapshot:
        with lock:
            return build_snapshot(state, {}, partitions=reported)

    app = Starlette()
    app.mount("/ui", create_dashboard(provider, refresh_s=0.5))
    wait = WebDriverWait(browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
    with serve_app(app) as url:
        browser.get(f"{url}/ui/")
        wait.until(lambda d: d.execute_script("return window.htmx && htmx.version"))
        wait.until(lambda d: [v for v, _ in vendor_cards(d)] == ["amd", "ascend", "nvidia"])
        cards = dict(vendor_cards(browser))
        assert cards["amd"] == "amd · rocm 2 GPUs · 384 GiB compute 56.2 % · memory 56.2 %"
        assert cards["ascend"] == "ascend · cann 1 GPU · 64 GiB compute 26.6 % · memory 26.7 %"
        assert read(browser, "return Array.from(document.querySelectorAll('.gpu'))"
                             ".map(e => e.dataset.vendor + ' ' + e.querySelector('.vendor').textContent)") == [
            "nvidia nvidia/cuda", "nvidia nvidia/cuda", "amd amd/rocm", "amd amd/rocm", "ascend ascend/cann"]
        amd = partitions(browser, "AMD-0")
        assert [(p, s) for p, s, _, _ in amd] == [("CPX/NPS4", str(k)) for k in range(8)]
        assert [(s, h) for _, s, h, used in amd if used] == [("2", "team-b/rocm")]
        # the names reach the page as text: the holder reads back exactly, and no markup of theirs ran
        npu = partitions(browser, "NPU-0")
        assert npu == [("vir08", "0", f"{EVIL_NS}/{EVIL_POD}", True), (XSS_PROFILE, "1", "", False)]
        share = read(browser, "return document.querySelector('.gpu[data-gpu-uuid=\"NPU-0\"] .share').textContent")
        assert share == f"{EVIL_NS}/{EVIL_POD}"
        assert read(browser, "return document.querySelectorAll('.gpu img, .gpu script').length") == 0
        assert read(browser, "return window.__xss === undefined") is True
        browser.save_screenshot(str(shots / "vendors-1-loaded.png"))

        # the ROCm pod ends and the agent reports its partition idle: the open page follows without a reload
        marker = read(browser, "window.__same_page = 1; return 1")
        with lock:
            state.release("team-b/rocm")
            reported["AMD-0"] = [("CPX/NPS4", k, False) for k in range(8)]
        wait.until(lambda d: not any(used for _, _, _, used in partitions(d, "AMD-0")))
        # AMD: 1,000 of 2,000 milli now; 196,608 of 393,216 MiB
        wait.until(lambda d: dict(vendor_cards(d))["amd"].endswith("compute 50.0 % · memory 50.0 %"))
        assert read(browser, "return window.__same_page") == marker
        assert read(browser, "return window.__xss === undefined") is True
        browser.save_screenshot(str(shots / "vendors-2-released.png"))
    assert all((shots / f).stat().st_size > 0 for f in ("vendors-1-loaded.png", "vendors-2-released.png"))
