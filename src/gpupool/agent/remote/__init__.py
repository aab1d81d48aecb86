"""Isolation remote on the node: the GPU server and the moves of its shares (`serving`, on a GPU's node) and
what a remote claim's containers get on the pod's node (`client`)."""
