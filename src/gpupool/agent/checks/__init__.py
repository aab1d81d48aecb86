"""The node validation checks, one module per step; `node` runs them in order.

Each module has a pure judge (what the facts mean) and one edge function that gathers the facts (NVML,
files, a child process). `node_checks` picks the real checks, or with the fake backend the fake ones
(the fault each step is told to report in the fake GPU file), so tests drive the same state machine.
"""
