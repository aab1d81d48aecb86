"""The gpupool node agent: GPU discovery, health, inventory publishing and the kubelet device plugin."""
