"""`gpupool doctor` as a user runs it: usage errors exit 2, an unreachable API server is one failure line
(exit 1, no traceback), `--json` is one document."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from click.testing import CliRunner

from gpupool.cli import main


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["doctor", "--kubeconfig", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert runner.invoke(main, ["doctor", "--bogus"]).exit_code == 2
    kubeconfig = unreachable_kubeconfig(tmp_path)
    context = runner.invoke(main, ["doctor", "--kubeconfig", str(kubeconfig), "--context", "other"])
    assert context.exit_code == 2 and "Context 'other' not found" in context.output
    garbage = tmp_path / "garbage"
    garbage.write_text("a: [b")
    assert runner.invoke(main, ["doctor", "--kubeconfig", str(garbage)]).exit_code == 2
    nodes = runner.invoke(main, ["doctor", "--kubeconfig", str(kubeconfig), "--nodes", "novalue"])
    assert nodes.exit_code == 2 and "is not KEY=VALUE" in nodes.output


def test_an_unreachable_api_server_is_one_failure_line(tmp_path: Path) -> None:
    kubeconfig = str(unreachable_kubeconfig(tmp_path))
    out = CliRunner().invoke(main, ["doctor", "--kubeconfig", kubeconfig, "--json"])
    assert out.exit_code == 1, out.output
    report = json.loads(out.output)
    assert report["ok"] is False
    [finding] = report["findings"]
    assert (finding["area"], finding["status"]) == ("api", "fail")
    assert finding["detail"].startswith("cannot read namespace gpupool-system: ")
    table = CliRunner().invoke(main, ["doctor", "--kubeconfig", kubeconfig])
    assert table.exit_code == 1 and "Traceback" not in table.output
    assert "gpupool doctor: something is wrong (1 failed, 0 warnings)" in table.output
