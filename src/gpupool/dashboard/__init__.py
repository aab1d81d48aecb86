"""The web dashboard (server-rendered, htmx-refreshed) over the pool snapshot and simulation results."""

from gpupool.dashboard.app import create_dashboard

__all__ = ["create_dashboard"]
