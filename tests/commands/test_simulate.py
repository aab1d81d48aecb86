import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.cli import main

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,2,T4\n" for i in range(5))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},4000,8192,1,{(250, 500, 1000)[i % 3]}\n" for i in range(12)
)


def test_simulate_end_to_end_on_a_small_trace(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "bestfit,fgd,gpupool",
                                       "--seeds", "42,43", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["seeds"] == [42, 43] and set(doc["policies"]) == {"bestfit", "fgd", "gpupool"}
    for res in doc["policies"].values():
        assert 0 <= res["unallocated_pct_at_100"] <= 100
        assert res["curve"][0][0] >= 0 and res["curve"][-1][0] >= 125
    assert (out / "allocation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Unallocated GPU %" in result.output


def test_unknown_policy_lists_valid_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["simulate", "--policies", "fgd,magic", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown policy magic" in result.output and "gpupool" in result.output


def test_malformed_csv_exits_2_with_location(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,100,oops,1,500\n")
    result = CliRunner().invoke(main, ["simulate", "--trace", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "bad.csv:2: column memory_mib: 'oops' is not a whole number" in result.output


TIMED = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n" + "".join(
    f"p{i},4000,8192,1,{(250, 500, 1000)[i % 3]},{10 * i},,{10 * i + 600}\n" for i in range(12)
)


def test_timeline_writes_its_section_and_plot(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(TIMED)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "bestfit,gpupool", "--timeline",
                                       "--target-wait-p99", "1m", "--seeds", "42,43", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "on every seed (42, 43" in result.output
    doc = json.loads((out / "results.json").read_text())["timeline"]
    assert doc["seed"] == 42 and doc["capacity"]["seeds"] == [42, 43]
    # The answer was replayed with both seeds' tie-breaks, and both meet the minute there.
    gpupool = doc["capacity"]["policies"]["gpupool"]
    at_answer = gpupool["tried_by_seed"][str(gpupool["nodes"])]
    assert set(at_answer) == {"42", "43"} and max(at_answer.values()) <= 60
    # 12 pods of 4 cores on 5 nodes of 32 cores and 10 GPUs: everything fits at once, nobody waits.
    assert doc["policies"]["bestfit"]["wait_p99_s"] == 0 and doc["policies"]["gpupool"]["never_ran"] == 0
    # Peak: all 12 running (created 0..110, each 600 s): 4 x 0.25 + 4 x 0.5 + 4 x 1 = 7 GPUs on 4 nodes of 2.
    assert doc["capacity"]["policies"]["bestfit"]["nodes"] == 4
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_names_the_missing_time_column(tmp_path: Path) -> None:
    (tmp_path / "pods.csv").write_text(PODS)
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--timeline",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "missing column(s) creation_time, scheduled_time, deletion_time" in result.output
    assert "Traceback" not in result.output


def test_unreachable_wait_target_exits_2_with_the_best_found(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(TIMED.replace("p0,4000,8192,1,250", "p0,4000,8192,4,1000"))
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "fgd", "--timeline",
                                       "--target-wait-p99", "60", "--jobs", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no cluster size" in result.output and "best:" in result.output
    # The waits that never end are null in results.json, which a strict reader (no Infinity) accepts.
    text = (tmp_path / "o" / "results.json").read_text()
    doc = json.loads(text, parse_constant=lambda name: pytest.fail(f"results.json holds {name}"))["timeline"]
    assert doc["policies"]["fgd"]["wait_p99_s"] is None
    assert set(doc["capacity"]["policies"]["fgd"]["tried"].values()) == {None}


def test_timeline_with_team_queues(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(TIMED)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "gpupool", "--timeline",
                                       "--queues", "2", "--order", "fair", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())["timeline"]["queues"]
    per = doc["policies"]["gpupool"]
    # 12 pods spread over q0 and q1 by the hash of their names; nobody waits on 10 GPUs (see above).
    assert doc["order"] == "fair" and per["q0"]["pods"] + per["q1"]["pods"] == 12
    assert per["q0"]["wait_p99_s"] == 0 and per["q0"]["preemptions"] == 0 and per["_lost_gpu_hours"] == 0
    assert "Team queues" in result.output


def test_bad_queues_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pods.csv").write_text(TIMED)
    base = ["simulate", "--trace", str(tmp_path / "pods.csv"), "--out", str(tmp_path)]
    no_timeline = CliRunner().invoke(main, [*base, "--queues", "2"])
    assert no_timeline.exit_code == 2 and "--queues needs --timeline" in no_timeline.output
    (tmp_path / "q.yaml").write_text("queues:\n  - {name: a, parent: ghost}\n")
    bad = CliRunner().invoke(main, [*base, "--timeline", "--queues", str(tmp_path / "q.yaml")])
    assert bad.exit_code == 2 and "parent 'ghost' does not exist" in bad.output and "Traceback" not in bad.output
    neither = CliRunner().invoke(main, [*base, "--timeline", "--queues", "lots"])
    assert neither.exit_code == 2 and "neither a number of queues nor a YAML file" in neither.output


def test_max_shares_per_gpu_holds_each_gpu_to_that_many_pods(tmp_path: Path) -> None:
    # One node with one GPU; 30 pods of a tenth of a GPU (topped up to 130 % of capacity by the protocol).
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,320000,1310720,1,T4\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
        f"p{i},100,128,1,100\n" for i in range(30)))

    def unallocated(*extra: str) -> float:
        out = tmp_path / ("out" + "".join(extra))
        result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                           str(tmp_path / "nodes.csv"), "--policies", "bestfit", "--seeds", "42",
                                           "--jobs", "1", "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        return float(json.loads((out / "results.json").read_text())["policies"]["bestfit"]["unallocated_pct_at_100"])

    # Without a limit ten tenths fill the GPU: nothing unallocated. Held to 4 pods, 0.4 of it is used: 60 %.
    assert unallocated() == 0.0
    assert unallocated("--max-shares-per-gpu", "4") == 60.0
    both = CliRunner().invoke(main, ["simulate", "--timeline", "--max-shares-per-gpu", "4", "--out", str(tmp_path)])
    assert both.exit_code == 2 and "applies to the static replay" in both.output


def test_what_if_every_gpu_were_one_model(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--gpu-model", "H100-80GB",
                                       "--isolation", "whole,mig,hook"])
    assert result.exit_code == 0, result.output
    # The same table as `gpupool mig whatif`: one row per isolation.
    direct = CliRunner().invoke(main, ["mig", "whatif", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--gpu-model", "H100-80GB",
                                       "--isolation", "whole,mig,hook"])
    assert direct.exit_code == 0 and result.output == direct.output
    assert all(name in result.output for name in ("whole", "mig", "hook"))
    unknown = CliRunner().invoke(main, ["simulate", "--gpu-model", "Z80", "--out", str(tmp_path)])
    assert unknown.exit_code == 2 and "H100-80GB" in unknown.output


TIMED_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n"


@pytest.mark.parametrize(("files", "args", "says"), [
    # issue 26: each of these gave a traceback (or, for the node shapes, gigabytes and a hang)
    ({"pods.csv": "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1,1,1,500,\"" + "x" * 140_000 + "\"\n"},
     [], "field larger than field limit"),
    ({"pods.csv": TIMED_HEADER + "p1,1000,1024,1,500,0,0,100\np2,1000,1024,1,500,0,," + "1" + "0" * 26 + "\n"},
     ["--timeline"], "column deletion_time: 10000000000000000000... (27 digits) is over the limit of 10,000,000,000"),
    ({}, ["--seeds", "-1"], "from 0 to 4294967295"),
    ({}, ["--seeds", "42,99999999999999999999999999"], "from 0 to 4294967295"),
    ({}, ["--constrain-models", "nan"], "'nan' is not between 0 and 1"),
    ({}, ["--timeline", "--speedup", "nan"], "'nan' is not between 1 and 1e+06"),
    ({"nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,1000,T4\n"}, [],
     "column gpu: 1000 is over the limit of 32"),
    ({"nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,100000,T4\n"}, [],
     "column gpu: 100000 is over the limit of 32"),
    ({"nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,1" + "0" * 26 + ",T4\n"}, [],
     "is over the limit of 32"),
    ({"nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,1e26,T4\n"}, [], "not a whole number"),
    ({"nodes.csv": "sn,cpu_milli,memory_mib,gpu,model\nn1,9" + "0" * 20 + ",786432,2,T4\n"}, [],
     "column cpu_milli: 900000000000000000000 is over the limit of 1,000,000,000,000"),
    ({"pods.csv": "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1,1,1" + "0" * 26 + ",1000\n"}, [],
     "column num_gpu: 10000000000000000000... (27 digits) is over the limit of 32"),
])
def test_no_input_gives_a_traceback_only_a_message_and_exit_2(tmp_path: Path, files: dict[str, str],
                                                              args: list[str], says: str) -> None:
    written = {"nodes.csv": NODES, "pods.csv": PODS, **files}
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "gpupool", "--seeds", "42",
                                       *args, "--out", str(tmp_path / "out")])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.output
    assert "Traceback" not in result.output and says in result.output, result.output


def test_the_largest_shapes_the_limits_allow_replay(tmp_path: Path) -> None:
    """The limits are safe, not just stated: a node of 32 GPUs with CPU and memory at the limit, a pod of 32
    GPUs, and times at the limit replay on both clocks (before the limits, 64 GPUs overflowed a bit set)."""
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                        "n1,1000000000000,1000000000000,32,T4\n")
    (tmp_path / "pods.csv").write_text(TIMED_HEADER + "p1,1000,1024,1,500,0,0,100\np2,1000,1024,1,500,0,,10000000000\n"
                                       "p3,1000,1024,32,1000,10000000000,,10000000000\n")
    for extra in ([], ["--timeline"]):
        result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                           str(tmp_path / "nodes.csv"), "--policies", "gpupool", "--seeds", "42",
                                           *extra, "--out", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output


FIELD = st.one_of(
    st.integers(-10, 40).map(str), st.integers(min_value=10**11).map(str), st.sampled_from(["", "nan", "1e26", "T4"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(st.lists(FIELD, min_size=4, max_size=6), min_size=1, max_size=3),
       pods=st.lists(st.lists(FIELD, min_size=4, max_size=9), min_size=1, max_size=3),
       timeline=st.booleans())
def test_any_trace_content_ends_in_a_result_or_a_message(tmp_path: Path, nodes: list[list[str]],
                                                         pods: list[list[str]], timeline: bool) -> None:
    """Whatever the files hold (issue 26: no traceback for any input), the command ends with exit 0 or 2."""
    def csv_text(header: str, rows: list[list[str]]) -> str:
        return header + "\n" + "".join(",".join(f'"{f}"' if "," in f else f for f in row) + "\n" for row in rows)

    (tmp_path / "nodes.csv").write_text(csv_text("sn,cpu_milli,memory_mib,gpu,model", nodes), encoding="utf-8")
    (tmp_path / "pods.csv").write_text(csv_text(TIMED_HEADER.strip(), pods), encoding="utf-8")
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "gpupool", "--seeds", "42",
                                       "--jobs", "1", *(["--timeline"] if timeline else []),
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code in (0, 2), (result.output, result.exception)
    if result.exit_code == 2:
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
