"""The node's GPUs: discovery (NVML or the fake backend), their health, the slot table kubelet sees, the MIG
manager, the MPS daemons, and the inventory the agent publishes about them."""
