"""Trace replay: the placement engine on a simulated cluster, following the FGD evaluation protocol."""
