"""The DRA driver on the node: claims as prepared (`claims`), their CDI specs (`cdi`), the node's
ResourceSlices (`slices`), prepare and unprepare with their checkpoint (`driver`) and its metrics (`metrics`).
The kubelet's gRPC side is gpupool.agent.kubelet.dra_service."""
