"""Arm parsing, the null arm, the server command line, and TTFT verdicts."""

from __future__ import annotations

import sys

import pytest

from mlxcel_py.loadtest.servers import Arm, budget_arm, mlxcel_spec, null_arm, parse_arm, parse_arms, parse_url_arm
from mlxcel_py.loadtest.ttft import arm_order, null_verdicts
from mlxcel_py.errors import ConfigError


def test_parse_arm_splits_flags_like_a_shell():
    assert parse_arm('c512=--prefill-chunk-size 512') == Arm("c512", ("--prefill-chunk-size", "512"))
    assert parse_arm("policy=") == Arm("policy", ())
    assert parse_arm("x=--model '/a b/m.gguf'").flags == ("--model", "/a b/m.gguf")


@pytest.mark.parametrize("bad", ["noequals", "=flags", "bad name=x", "q=--a 'unclosed"])
def test_parse_arm_rejects(bad):
    with pytest.raises(ConfigError):
        parse_arm(bad)


def test_parse_url_arm():
    assert parse_url_arm("llama=http://127.0.0.1:8080/") == Arm("llama", url="http://127.0.0.1:8080")
    assert parse_url_arm("p=http://127.0.0.1:8080/v1").url == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match="expected http"):
        parse_url_arm("p=127.0.0.1:8080")


def test_parse_arms_order_and_unique_names():
    arms = parse_arms(["a=", "b=--x 1"], ["c=http://127.0.0.1:1"])
    assert [a.name for a in arms] == ["a", "b", "c"] and arms[2].external
    with pytest.raises(ConfigError, match="twice"):
        parse_arms(["a=", "a=--x"], [])
    with pytest.raises(ConfigError, match="at least one"):
        parse_arms([], [])


def test_null_arm_auto_and_explicit():
    arms = parse_arms(["c2048=--prefill-chunk-size 2048", "policy=", "c2048b=--prefill-chunk-size 2048"], [])
    assert null_arm(arms).name == "c2048b"
    assert null_arm(arms, "policy").name == "policy"
    assert null_arm(arms[:2]) is None
    with pytest.raises(ConfigError, match="not one of the arms"):
        null_arm(arms, "nope")


def test_mlxcel_spec_command_line():
    spec = mlxcel_spec(Arm("c512", ("--prefill-chunk-size", "512")), parallel=5, model="/m.gguf", port=4321)
    assert spec.argv == (sys.executable, "-m", "mlxcel_py", "serve", "--host", "127.0.0.1", "--port", "4321",
                         "--parallel", "5", "--model", "/m.gguf", "--prefill-chunk-size", "512")
    assert spec.url == "http://127.0.0.1:4321"
    assert "--parallel" not in mlxcel_spec(Arm("p"), parallel=None, model=None, port=1).argv


def test_budget_arm_command_line():
    spec = mlxcel_spec(budget_arm(300), parallel=5, model=None, port=4321)
    assert spec.argv == (sys.executable, "-m", "mlxcel_py", "serve", "--host", "127.0.0.1", "--port", "4321",
                         "--parallel", "5", "--itl-budget-ms", "300")
    assert budget_arm(300) == parse_arm("budget=--itl-budget-ms 300")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="--itl-budget-ms must be a positive integer"):
            budget_arm(bad)


def test_bench_admit_adds_the_budget_arm_and_prints_its_checks(monkeypatch):
    from typer.testing import CliRunner

    import mlxcel_py.loadtest.admit as admit_module
    from mlxcel_py.cli.bench import app
    from test_loadtest_report import budget_result

    seen = []

    def fake_run_admit(arms, cfg, model=None, say=None, **_kw):
        seen.append((arms, cfg.prompt_tokens))
        return budget_result([0.3], [1.5])

    monkeypatch.setattr(admit_module, "run_admit", fake_run_admit)
    got = CliRunner().invoke(app, ["admit", "--arm", "c512=--prefill-chunk-size 512", "--itl-budget-ms", "300",
                                   "--prompt-tokens", "6144"])
    assert got.exit_code == 0, got.output
    assert seen == [([Arm("c512", ("--prefill-chunk-size", "512")), budget_arm(300)], 6144)]
    assert "pass  budget p95 during admission <= 1.3 x 300 ms (every round): 300 ms vs limit 390 ms" in got.output
    assert "budget admitted TTFT <= 1.5 x c512 (medians over rounds)" in got.output
    alone = CliRunner().invoke(app, ["admit", "--itl-budget-ms", "300"])  # the budget arm on its own
    assert alone.exit_code == 0 and seen[-1][0] == [budget_arm(300)]
    twice = CliRunner().invoke(app, ["admit", "--arm", "budget=", "--itl-budget-ms", "300"])
    assert twice.exit_code == 2 and "arm name 'budget' is given twice" in twice.output


def test_arm_order_rotates():
    assert [arm_order(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_null_verdicts():
    out = null_verdicts({"c2048": [10.0, 12.0, 11.0], "policy": [10.5, 30.0, 11.5], "null": [10.0, 11.0, 12.0],
                         "slow": [20.0, 21.0], "dead": []}, "null")
    assert out["policy"] == {"n": 3, "min_ms": 10.5, "median_ms": 11.5, "max_ms": 30.0, "inside_null_range": True}
    assert out["slow"]["inside_null_range"] is False and out["dead"]["inside_null_range"] is None
    assert null_verdicts({"a": [1.0]}, None)["a"]["inside_null_range"] is None


def test_cli_rejects_bad_arms_with_usage_errors():
    from typer.testing import CliRunner

    from mlxcel_py.cli.bench import app

    runner = CliRunner()
    got = runner.invoke(app, ["admit", "--arm", "no-equals-sign"])
    assert got.exit_code == 2 and "error: --arm takes NAME=VALUE" in got.output
    got = runner.invoke(app, ["ttft", "--arm", "a=", "--null", "b"])
    assert got.exit_code == 2 and "--null 'b' is not one of the arms" in got.output
    assert runner.invoke(app, ["ttft"]).exit_code == 2


HEALTH_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("listening", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_managed_server_starts_waits_and_stops():
    from mlxcel_py.loadtest.servers import ManagedServer, ServerSpec, free_port

    port = free_port()
    server = ManagedServer(ServerSpec("h", (sys.executable, "-c", HEALTH_SERVER, str(port)), port), 30)
    with server:
        assert server.proc.poll() is None and "listening" in server.log_tail()
    assert server.proc.poll() is not None and not server.log_path.exists()


def test_managed_server_reports_a_dead_process():
    from mlxcel_py.loadtest.servers import ManagedServer, ServerSpec

    spec = ServerSpec("dead", (sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"), 1)
    with pytest.raises(RuntimeError, match=r"(?s)exited with 3.*bad flag"):
        with ManagedServer(spec, 30):
            pass
