"""Fixtures: a throwaway CA + serving certificate, and the webhook served over real TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest

from gpupool.webhook.inventory import InventoryView
from tests.webhook.helpers import CLUSTER_NODES, Served, TLSFiles, make_tls, start_webhook


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def served(tls: TLSFiles) -> AsyncIterator[Served]:
    inventory = InventoryView()
    inventory.replace(CLUSTER_NODES)
    server, task, port = await start_webhook(tls, inventory)
    context = ssl.create_default_context(cafile=str(tls.ca))
    async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=context, timeout=30) as client:
        yield Served(client, port, inventory)
    server.should_exit = True
    await asyncio.wait_for(task, 30)
