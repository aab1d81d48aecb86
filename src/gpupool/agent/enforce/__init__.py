"""Holding containers to their grants from the host: the watchdog (`watchdog`), the process table and the
killer it uses (`procs`), and the reclaim squeeze (`squeeze`)."""
