"""What `gpupool demo` (and the in-process tests and benchmarks) runs instead of a cluster: the embedded
cluster with its bundled scenario, a client of the extender's HTTP verbs, and a stand-in kube-scheduler that
drives them. No service imports it. The real-Kubernetes harness (testbed, fleets, stand-in kubelet) lives
under tests/harness and is not installed."""
