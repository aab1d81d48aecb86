"""The scheduler's plugins, one module each (registered in gpupool.scheduler.framework.registry)."""
