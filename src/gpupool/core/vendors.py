"""Vendors as data: which runtime each vendor's cards run, so placement can route a pod to cards it can use.

A CUDA image runs only on NVIDIA cards, a ROCm image only on AMD Instinct, a CANN image only on Ascend
(vendors.md, "Routing by runtime"). Everything above the node agent knows a vendor only through these names.
"""

from __future__ import annotations

NVIDIA = "nvidia"
AMD = "amd"
ASCEND = "ascend"

CUDA = "cuda"
ROCM = "rocm"
CANN = "cann"
ANY_RUNTIME = "any"  # an image that carries several runtimes: any card will do

RUNTIME_OF_VENDOR: dict[str, str] = {NVIDIA: CUDA, AMD: ROCM, ASCEND: CANN}
