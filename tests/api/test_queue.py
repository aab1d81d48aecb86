"""GPUQueue objects read into the queue tree (gpupool.api.queue)."""

from typing import Any

import pytest

from gpupool.api.queue import LABEL_QUEUE, QueueError, queue_spec, read_queues
from gpupool.core.queues import UNLIMITED, Quota


def gq(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": name}, "spec": spec}


def test_amounts_in_the_units_of_the_quota() -> None:
    spec = queue_spec(gq("team-a", guaranteed={"gpus": "2.5", "gpuMemory": "160Gi", "gpuCores": 250},
                         maximum={"gpus": "4"}, parent="org", weight=3, lend=False))
    # 2.5 GPUs = 2500 milli; 160 GiB = 163840 MiB; 250 % cores.
    assert spec.guaranteed == Quota(2500, 163840, 250)
    # Left-out maximum dimensions are unlimited.
    assert spec.maximum == Quota(4000, UNLIMITED, UNLIMITED)
    assert (spec.parent, spec.weight, spec.lend, spec.borrow) == ("org", 3, False, True)


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"guaranteed": {"gpus": "1.2345"}}, "guaranteed.gpus"),
        ({"guaranteed": {"gpus": "-1"}}, "guaranteed.gpus"),
        ({"maximum": {"gpuMemory": "12 parsecs"}}, "maximum.gpuMemory"),
        ({"guaranteed": {"gpuCores": -5}}, "guaranteed.gpuCores"),
        ({"weight": 70000}, "weight"),
    ],
)
def test_bad_fields_are_named(spec: dict[str, Any], where: str) -> None:
    with pytest.raises(QueueError) as err:
        queue_spec(gq("q", **spec))
    assert str(err.value).startswith(f"GPUQueue q: invalid spec at {where}:")


def test_the_tree_keeps_good_queues_reports_bad_ones_and_always_has_the_default() -> None:
    queues = read_queues([gq("a", guaranteed={"gpus": "1"}), gq("broken", guaranteed={"gpus": "x"})])
    assert set(queues.tree.specs) == {"a", "default"}
    assert "broken" in queues.errors
    assert queues.queue_of({LABEL_QUEUE: "a"}) == "a"
    assert queues.queue_of({"other": "label"}) == "default"


def test_an_inconsistent_tree_applies_no_queue_rather_than_half_of_one() -> None:
    # The children are guaranteed 3 GPUs, their parent only 2: no partial enforcement.
    queues = read_queues([gq("org", guaranteed={"gpus": "2"}),
                          gq("t1", parent="org", guaranteed={"gpus": "2"}),
                          gq("t2", parent="org", guaranteed={"gpus": "1"})])
    assert set(queues.tree.specs) == {"default"}
    assert "children are guaranteed more" in queues.errors["org"]


def test_a_queue_counts_the_dimensions_its_object_declares() -> None:
    assert queue_spec(gq("a", guaranteed={"gpus": "1"}, maximum={"gpuCores": 300})).dims == {"gpu_milli", "cores"}
    assert queue_spec(gq("b")).dims == {"gpu_milli", "memory_mib", "cores"}
