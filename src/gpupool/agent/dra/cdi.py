"""A claim's CDI spec: the one device `gpu.gpupool.io/claim=<claim UID>` whose container edits are the
claim's grant, written where the container runtime reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupool.agent.isolation.grant import ContainerGrant
from gpupool.agent.state.checkpoint import write_atomically
from gpupool.api.dra import CDI_KIND, DRIVER

CDI_VERSION = "0.6.0"  # env, mounts and device nodes (hostPath: 0.5.0 on): all this spec uses

Obj = dict[str, Any]


def cdi_spec(uid: str, grant: ContainerGrant) -> Obj:
    """The CDI spec of one claim: one device named by the claim's UID whose edits are the grant's."""
    mounts = [{"hostPath": m.host_path, "containerPath": m.container_path, "type": "bind",
               "options": ["bind", "ro" if m.read_only else "rw", "nosuid", "nodev"]} for m in grant.mounts]
    edits: Obj = {"env": [f"{k}={v}" for k, v in sorted(grant.envs.items())]}
    if grant.devices:  # a non-NVIDIA card's nodes; the runtime takes type and numbers from hostPath
        edits["deviceNodes"] = [{"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
                                for d in grant.devices]
    if mounts:
        edits["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": [{"name": uid, "containerEdits": edits}]}


def cdi_path(cdi_dir: Path, uid: str) -> Path:
    return cdi_dir / f"{DRIVER}-claim_{uid}.json"

def write_cdi(cdi_dir: Path, uid: str, spec: Obj) -> None:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(cdi_path(cdi_dir, uid), json.dumps(spec, indent=1).encode())
    cdi_path(cdi_dir, uid).chmod(0o644)  # the runtime reads it (root, but not necessarily as the agent)
