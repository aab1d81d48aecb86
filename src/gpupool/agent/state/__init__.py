"""What the agent keeps on the node's disk: its checkpoints (device-plugin grants, prepared claims), the lock
on them, the hook directories and limits files the interception library reads, their accounting, and the
node's validation record. Imports only the agent's base modules (config, port, identify)."""
