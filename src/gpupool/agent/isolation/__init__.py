"""Isolation modes as strategies, one module per mode (`none`, `hook`, `mps`, `mig`, and `remote` for DRA
claims) behind one protocol (`base`); `strategies` builds the device plugin's set and `grant` turns a
strategy's part into a container's answer."""
