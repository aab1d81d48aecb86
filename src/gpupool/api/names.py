"""Resource and annotation names: the contract between pods, webhook, scheduler and agent."""

from __future__ import annotations

from gpupool.api.isolation import IsolationMode

DOMAIN = "gpupool.io"

RESOURCE_GPU = f"{DOMAIN}/gpu"  # number of GPUs (advertised by the agent as slots)
RESOURCE_MEMORY = f"{DOMAIN}/gpu-memory"  # MiB per GPU (extender-accounted, ignored by kube-scheduler)
RESOURCE_CORES = f"{DOMAIN}/gpu-cores"  # percent of one GPU's compute per GPU

ANN_MODEL = f"{DOMAIN}/gpu-model"  # comma-separated allowed models
ANN_UUID = f"{DOMAIN}/gpu-uuid"  # comma-separated GPU UUIDs the pod may use
ANN_EXCLUDE = f"{DOMAIN}/gpu-exclude"  # comma-separated GPU UUIDs the pod must not use
ANN_POLICY = f"{DOMAIN}/policy"
ANN_ISOLATION = f"{DOMAIN}/isolation"
ANN_RUNTIME = f"{DOMAIN}/runtime"  # the runtime the pod's image needs: cuda, rocm, cann or any
ANN_MIG_PROFILE = f"{DOMAIN}/mig-profile"  # isolation mig: the MIG profile asked for by name (e.g. 3g.40gb)
ANN_ALLOCATION = f"{DOMAIN}/allocation"  # written by the scheduler only
ANN_ALLOCATED = f"{DOMAIN}/allocated"  # written by the node agent once it served the pod's Allocate
ANN_INVENTORY = f"{DOMAIN}/inventory"  # node annotation written by the agent

ISOLATION_MODES = tuple(m.value for m in (IsolationMode.MPS, IsolationMode.HOOK, IsolationMode.MIG, IsolationMode.NONE))
DEFAULT_ISOLATION = IsolationMode.HOOK.value
