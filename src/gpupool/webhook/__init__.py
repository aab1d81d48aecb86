"""The admission webhook: routes GPU pods to the gpupool scheduler and refuses impossible requests early.

`admission` decides (pure: AdmissionReview dict in, AdmissionReview dict out), `patch` builds RFC 6902
patches, `inventory` keeps the largest GPUs known in the cluster, `app` is the HTTP layer and `server`
runs it over TLS.
"""
