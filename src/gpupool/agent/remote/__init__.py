"""Isolation remote on the node: the GPU server and the moves of its shares (`serving`, on a GPU's node) and
where a remote claim's server is found from the pod's node (`client`; what its containers get is the
strategy gpupool.agent.isolation.remote)."""
