"""The extender's hand-written HostPriorityList JSON is byte for byte what json.dumps writes, and refuses
a score outside 0..MAX_EXTENDER_PRIORITY."""

from __future__ import annotations

import json

import pytest

from gpupool.api.extender import MAX_EXTENDER_PRIORITY, dump_priorities, parse_priorities


@pytest.mark.parametrize("pairs", [
    [],
    [("node-a", 0)],
    [("n\u00f6de-\"quoted\"\\", MAX_EXTENDER_PRIORITY), ("b", 3)],
    [(f"node-{i:05d}", i % (MAX_EXTENDER_PRIORITY + 1)) for i in range(500)],
])
def test_priorities_are_the_bytes_json_dumps_writes(pairs):
    expected = json.dumps([{"Host": h, "Score": s} for h, s in pairs], separators=(",", ":")).encode()
    assert dump_priorities(pairs) == expected
    assert [(p.Host, p.Score) for p in parse_priorities(dump_priorities(pairs))] == pairs


@pytest.mark.parametrize("score", [-1, MAX_EXTENDER_PRIORITY + 1])
def test_a_score_out_of_range_is_refused(score):
    with pytest.raises(KeyError):
        dump_priorities([("node-a", score)])
