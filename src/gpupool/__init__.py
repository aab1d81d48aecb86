"""gpupool: turn the GPUs of a Kubernetes cluster into one shared pool."""

__version__ = "0.1.0"
