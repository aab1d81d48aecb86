"""GPUQueue's maxGPUsByVendor read into QueueSpec.vendor_maximum (gpupool.api.queue)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.queue import QueueError, queue_spec, read_queues


def gq(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": name}, "spec": spec}


def test_vendor_maxima_in_milli_gpus_sorted_by_vendor() -> None:
    spec = queue_spec(gq("team", maximum={"gpus": "8"}, maxGPUsByVendor={"ascend": "1.5", "amd": 2}))
    assert spec.vendor_maximum == (("amd", 2000), ("ascend", 1500))
    assert spec.dims == {"gpu_milli"}  # the vendor maxima declare no dimension of their own


def test_absent_or_empty_is_no_vendor_maximum() -> None:
    assert queue_spec(gq("team")).vendor_maximum == ()
    assert queue_spec(gq("team", maxGPUsByVendor={})).vendor_maximum == ()
    assert queue_spec(gq("team", maxGPUsByVendor=None)).vendor_maximum == ()


@pytest.mark.parametrize(("by_vendor", "problem"), [
    ({"hygon": "1"}, "vendor 'hygon' is unknown (use nvidia, amd, ascend)"),
    ({"amd": "two"}, "amd: 'two' is not a number of GPUs such as 2 or 0.5"),
    ({"amd": "-1"}, "amd: '-1' is not a number of GPUs"),
    (["amd"], "expected a map of vendor to GPUs"),
])
def test_bad_vendor_maxima_are_named(by_vendor: Any, problem: str) -> None:
    with pytest.raises(QueueError) as err:
        queue_spec(gq("q", maxGPUsByVendor=by_vendor))
    text = str(err.value)
    assert text.startswith("GPUQueue q: invalid spec at maxGPUsByVendor:") and problem in text, text


def test_a_bad_vendor_maximum_leaves_that_queue_out_with_its_reason() -> None:
    queues = read_queues([gq("a", maxGPUsByVendor={"amd": "1"}), gq("b", maxGPUsByVendor={"intel": "1"})])
    assert set(queues.tree.specs) == {"a", "default"} and "intel" in queues.errors["b"]
    assert queues.tree.specs["a"].vendor_maximum == (("amd", 1000),)
