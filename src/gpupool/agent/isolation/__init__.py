"""Isolation modes as strategies, one module per mode (`none`, `hook`, `mps`, `mig`) behind one protocol
(`base`); `strategies` builds the node's set and `grant` turns a strategy's part into a container's answer."""
