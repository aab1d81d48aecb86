"""Test harness, kept out of the production packages: the fake kube-scheduler, the embedded cluster with
its scenarios and fake kubelet, the stand-in device-manager kubelet, an extender client, and the real
Kubernetes 1.37 testbed. Used by `gpupool demo`, the benchmarks and the tests; no service imports it."""
