"""Fixtures of the dashboard's browser tests (defined in tests/dashboard/browser.py)."""

from tests.dashboard.browser import browser, shots

__all__ = ["browser", "shots"]
