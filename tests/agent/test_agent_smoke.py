from __future__ import annotations

from tests.agent.agent_helpers import RESOURCE, pod_object, rig, scheduler_binds


async def test_registers_and_allocates() -> None:
    async with rig() as r:
        assert r.kubelet.registrations == [(RESOURCE, "gpupool.sock")]
        assert len(r.kubelet.healthy(RESOURCE)) == 16
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-2", 2, 10240, 30.0)])
        resp = await r.kubelet.allocate(RESOURCE, "default/a", 1)
        print(dict(resp.envs), r.kubelet.assigned)
