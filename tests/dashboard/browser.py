"""Headless Chromium for the dashboard's browser tests (Debian's chromium + chromium-driver, driven by
selenium): the `browser` and `shots` fixtures (registered by tests/dashboard/conftest.py) and the wait bound.
Missing browser binaries fail the test: .ci/run installs them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

WAIT_S = 60  # generous: only there so that a broken page fails instead of hanging


@pytest.fixture(scope="module")
def shots() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gpupool-dashboard-shots-"))
    print(f"\ndashboard screenshots: {path}")
    return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if chromium is None or driver_bin is None:
        pytest.fail("chromium and chromedriver are needed: apt-get install chromium chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_bin))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
