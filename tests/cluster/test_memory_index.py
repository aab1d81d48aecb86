"""The embedded cluster's spec.nodeName index answers exactly what a scan would, whatever happened before."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from gpupool.cluster.memory import MemoryCluster, field_value

OPS = st.lists(
    st.tuples(st.sampled_from(["create", "bind", "delete"]), st.sampled_from("abcde"), st.sampled_from(["n1", "n2"])),
    max_size=25,
)


@given(OPS)
def test_a_node_scoped_list_equals_a_scan(ops: list[tuple[str, str, str]]) -> None:
    async def scenario() -> None:
        c = MemoryCluster()
        for op, name, node in ops:
            pods = {p["metadata"]["name"]: p for p in (await c.list_pods())[0]}
            if op == "create" and name not in pods:
                await c.create_pod({"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}})
            elif op == "bind" and name in pods and not pods[name]["spec"].get("nodeName"):
                await c.create_binding("default", name, pods[name]["metadata"]["uid"], node)
            elif op == "delete" and name in pods:
                await c.delete_pod("default", name)
        everything, _ = await c.list_pods()
        for node in ("n1", "n2", ""):
            listed, _ = await c.list_pods(fields={"spec.nodeName": node})
            scanned = [p for p in everything if field_value(p, "spec.nodeName") == node]
            assert sorted(p["metadata"]["name"] for p in listed) == sorted(p["metadata"]["name"] for p in scanned)

    asyncio.run(scenario())
