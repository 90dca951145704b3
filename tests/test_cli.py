"""The commands: every one hands the same resolved policy to the engine; bad input is one line."""

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import mlxcel_py.engine.lifecycle as engine_module
from mlxcel_py.cli.app import app
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy

from config_helpers import reset_prefill_chunk_override
from tiny import tiny_model


runner = CliRunner()


class Captured(Exception):
    pass


@pytest.fixture
def capture(monkeypatch):
    """Stop each command where it hands its engine config over; return the policies seen."""
    seen = {}

    def fake_build(config, loaded, runner=None, draft=None):
        seen["engine"] = config
        raise Captured

    def fake_serve(cfg):
        seen["engine"] = cfg.engine

    lm = tiny_model()  # before patching: tiny_model itself loads through load_model
    monkeypatch.setattr(engine_module, "build_engine", fake_build)
    monkeypatch.setattr("mlxcel_py.models.load_model", lambda *a, **k: lm)
    monkeypatch.setattr("mlxcel_py.server.http.serving.serve_forever", fake_serve)
    reset_prefill_chunk_override()
    yield seen
    reset_prefill_chunk_override()


def engine_config(seen, args, env=None):
    seen.clear()
    runner.invoke(app, args, env=env)
    return seen["engine"]


@pytest.mark.parametrize(
    "flags, env, expected",
    [
        ([], {}, PrefillChunkPolicy(2048, 512)),
        (["-b", "1024"], {}, PrefillChunkPolicy(1024, 1024)),
        (["--prefill-chunk-size", "2048", "--batch-size", "1024"], {}, PrefillChunkPolicy(2048, 2048)),
        ([], {"MLXCEL_PREFILL_CHUNK": "256"}, PrefillChunkPolicy(256, 256)),
        ([], {"LLAMA_ARG_BATCH": "768"}, PrefillChunkPolicy(768, 768)),
    ],
)
def test_every_command_hands_the_engine_the_same_policy(capture, monkeypatch, flags, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    policies = {}
    for command in (["generate", "hi"], ["run"], ["serve"]):
        reset_prefill_chunk_override()
        policies[command[0]] = engine_config(capture, command + flags).policy
    assert policies == {"generate": expected, "run": expected, "serve": expected}


def test_every_command_hands_the_engine_the_itl_budget(capture, monkeypatch):
    for command in (["generate", "hi"], ["run"], ["serve"]):
        assert engine_config(capture, command + ["--itl-budget-ms", "300"]).itl_budget_ms == 300
        assert engine_config(capture, command).itl_budget_ms is None
    monkeypatch.setenv("MLXCEL_ITL_BUDGET_MS", "120")
    assert engine_config(capture, ["serve"]).itl_budget_ms == 120
    assert engine_config(capture, ["serve", "-b", "512"]).itl_budget_ms is None  # the explicit chunk wins


def test_every_command_hands_the_engine_context_shift_and_kv_types(capture):
    for command in (["generate", "hi"], ["run"], ["serve"]):
        cfg = engine_config(capture, command + ["--context-shift", "-ctk", "q8_0", "-ctv", "q8_0"])
        assert (cfg.context_shift, cfg.kv_type_k, cfg.kv_type_v) == (True, "q8_0", "q8_0"), command
        cfg = engine_config(capture, command)
        assert (cfg.context_shift, cfg.kv_type_k, cfg.kv_type_v) == (False, None, None), command


@pytest.mark.parametrize("command", [["run"], ["generate", "hi"]])
def test_a_flag_the_engine_refuses_at_start_is_one_line(monkeypatch, command):
    lm = tiny_model()
    monkeypatch.setattr("mlxcel_py.models.load_model", lambda *a, **k: lm)
    result = runner.invoke(app, command + ["--context-shift", "-ctk", "f16", "--max-tokens", "2"], input="hi\n")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert lines == ["error: --context-shift is not available for this model: the KV is stored as K f16, V f32; "
                     "shift with the model's own KV dtype"], result.output


def test_one_slot_front_ends_and_serve_slots(capture):
    assert engine_config(capture, ["generate", "hi"]).num_slots == 1
    assert engine_config(capture, ["run"]).num_slots == 1
    assert engine_config(capture, ["serve", "--parallel", "3"]).num_slots == 3


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["generate", "   "], 2, "error: the prompt is empty"),
        (["generate", "hi", "--max-tokens", "0"], 2, "error: --max-tokens must be at least 1 (got 0)"),
        (["generate", "hi", "--temp", "-1"], 2, "error: --temp must be between 0 and 100 (got -1.0)"),
        (["generate", "hi", "--top-p", "1.5"], 2, "error: --top-p must be in (0, 1] (got 1.5)"),
        (["generate", "hi", "--model", "/nonexistent/model.gguf"], 1, "error: model path not found"),
        (["run", "--prefill-chunk-size", "-5"], 2, "error: --prefill-chunk-size must be a non-negative integer"),
        (["serve", "--port", "70000"], 2, "error: --port must be between 0 and 65535"),
        (["serve", "--itl-budget-ms", "0"], 2, "error: --itl-budget-ms must be between 1 and 600000 (got 0)"),
        (["serve", "--chat-template", "{% for m in messages %}"], 2,
         "error: --chat-template: the chat template does not render: Unexpected end of template."),
        (["serve", "--chat-template", "{{ raise_exception('roles must alternate') }}"], 2,
         "error: --chat-template: the chat template does not render: roles must alternate"),
        (["serve", "--chat-template-file", "/nonexistent/t.jinja"], 2,
         "error: --chat-template-file: cannot read '/nonexistent/t.jinja': No such file or directory"),
        (["serve", "--chat-template", "chatml", "--chat-template-file", "t.jinja"], 2,
         "error: --chat-template and --chat-template-file both choose the chat template; give one"),
        (["serve", "--chat-template-kwargs", "{bad"], 2, "error: --chat-template-kwargs: Expecting property name"),
        (["serve", "--chat-template-kwargs", "[1]"], 2, "error: --chat-template-kwargs must be a JSON object"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(args, code, message):
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_generate_answers_with_the_default_model_deterministically():
    cmd = [sys.executable, "-m", "mlxcel_py", "generate", "Name the capital of France.", "--max-tokens", "24"]
    env = {k: v for k, v in os.environ.items() if k not in ("MLXCEL_PREFILL_CHUNK", "LLAMA_ARG_BATCH")}
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert "Paris" in runs[0].stdout
    assert runs[0].stdout == runs[1].stdout
    assert "Prompt:" in runs[0].stderr and "Generation:" in runs[0].stderr and "tokens-per-sec" in runs[0].stderr

