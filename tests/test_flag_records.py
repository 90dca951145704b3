"""The commands' flag records (flags.py): Typer parses each command's options once into its record,
a new field is a new option that reaches the resolved config with no edit elsewhere, and the
functions that handle the flags stay small."""

import ast
import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

import mlxcel_py.cli.generate as generate_module
import mlxcel_py.cli.serve as serve_module
from mlxcel_py.cli.app import app
from mlxcel_py.cli.parse import parses, signature_of
from mlxcel_py.config import resolve
from mlxcel_py.errors import ConfigError
from mlxcel_py.flags import (
    AdmitFlags, GenerateFlags, ModelFlags, RunFlags, SamplingFlags, ServeFlags, TtftFlags, build, leaves, values_of,
)

from config_helpers import flags_for

ROOT = Path(__file__).resolve().parents[1]
RECORDS = (ServeFlags, GenerateFlags, RunFlags, AdmitFlags, TtftFlags)
ProbeOpt = Annotated[Optional[int], typer.Option("--probe-level", help="A throwaway option of this test.")]


def with_probe(kind: type) -> type:
    """`kind` plus one option, as adding a flag does: one field carrying its Typer option."""
    return dataclasses.make_dataclass(f"Probe{kind.__name__}", [("probe_level", ProbeOpt, None)], bases=(kind,),
                                      frozen=True)


def cli_of(name: str, callback) -> typer.Typer:
    cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli.command(name)(callback)
    cli.command("other")(lambda: None)  # two commands: the first argument names one
    return cli


def test_a_new_field_is_an_option_typer_parses_into_the_resolved_config(monkeypatch):
    seen = {}
    monkeypatch.setattr("mlxcel_py.server.http.serving.serve_forever", lambda cfg: seen.setdefault("cfg", cfg))
    cli = cli_of("serve", parses(with_probe(ServeFlags))(serve_module.serve.command))  # serve's own body
    result = CliRunner().invoke(cli, ["serve", "--probe-level", "7", "--port", "0", "-np", "2"], env={})
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.flags.probe_level == 7  # the consumer of the new flag reads it from the resolved config
    assert (cfg.server.port, cfg.engine.num_slots) == (0, 2)  # the record's other options as ever
    assert "--probe-level" in CliRunner().invoke(cli, ["serve", "--help"]).output
    bad = CliRunner().invoke(cli, ["serve", "--probe-level", "x"])
    assert bad.exit_code == 2 and "--probe-level" in bad.output  # click's usage error, as any option's


def test_a_new_field_reaches_generate_too(monkeypatch):
    seen = {}
    monkeypatch.setattr(generate_module, "run_generate", lambda cfg, prompt, **kw: seen.update(cfg=cfg, prompt=prompt))
    cli = cli_of("generate", parses(with_probe(GenerateFlags))(generate_module.generate.command))
    result = CliRunner().invoke(cli, ["generate", "hi there", "--probe-level", "3", "-n", "5"], env={})
    assert result.exit_code == 0, result.output
    assert (seen["cfg"].flags.probe_level, seen["prompt"], seen["cfg"].sampling.max_tokens) == (3, "hi there", 5)


def test_a_command_gets_its_whole_record(monkeypatch):
    seen = {}
    monkeypatch.setattr("mlxcel_py.server.http.serving.serve_forever", lambda cfg: seen.setdefault("cfg", cfg))
    result = CliRunner().invoke(app, ["serve", "-m", "a=x.gguf", "-m", "b=y.gguf", "--temp", "0.5", "--no-webui",
                                      "--port", "0"], env={})
    assert result.exit_code == 0, result.output
    flags = seen["cfg"].flags
    assert type(flags) is ServeFlags
    assert flags.model.model == ("a=x.gguf", "b=y.gguf") and flags.sampling.temp == 0.5 and flags.server.no_webui
    assert seen["cfg"].router.names == ("a", "b")


def test_every_record_is_one_set_of_options_in_its_help_order():
    for kind in RECORDS:
        names = [name for name, _, _ in leaves(kind)]
        assert len(names) == len(set(names)), kind
        order = getattr(kind, "help_order", None)
        want = names if order is None else sorted(names, key=order.index)  # each option named in the order
        assert list(signature_of(kind).parameters) == want, kind
    twice = dataclasses.make_dataclass("Twice", [("model", ModelFlags), ("again", ModelFlags)])
    with pytest.raises(TypeError, match="appear in two groups"):
        signature_of(twice)


def test_build_and_values_of_are_inverses_and_the_defaults_are_not_given():
    flags = build(ServeFlags, {"temp": 0.3, "model": ["m.gguf"], "parallel": 2})
    assert flags.sampling == SamplingFlags(temp=0.3) and flags.model.model == ("m.gguf",)
    assert build(ServeFlags, values_of(flags)) == flags
    defaults = values_of(ServeFlags())
    assert {k for k, v in defaults.items() if v is not None} == {"prompt_cache", "no_webui", "rerank", "allow_image_urls",
                                                                   "spm_infill", "lora_init_without_apply", "lora_fuse"}
    assert defaults["prompt_cache"] is True and defaults["no_webui"] is False


def test_a_commands_record_resolves_as_the_serve_record_with_the_same_flags():
    env = {}
    run = RunFlags(model=ModelFlags(model="m.gguf", threads=2), sampling=SamplingFlags(top_k=5))
    assert resolve("run", run, env) == dataclasses.replace(
        resolve("run", flags_for("serve", model="m.gguf", threads=2, top_k=5), env), flags=run)
    with pytest.raises(ConfigError, match="--host, --port and --api-key apply to serve and bench, not run"):
        resolve("run", flags_for("run", port=1), env)


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            count = len(a.posonlyargs + a.args + a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            yield node.name, count, node.end_lineno - node.lineno + 1


def test_the_flag_handling_functions_stay_small():
    """The CLI, the resolver and the engine's lifecycle take records, not flags one by one:
    at most 8 parameters and 60 lines a function."""
    package = ROOT / "mlxcel_py"
    files = [*sorted((package / "cli").glob("*.py")), *sorted(package.glob("config*.py")), package / "flags.py",
             package / "serve_config.py", package / "serve_models.py", package / "engine" / "lifecycle.py"]
    assert len(files) > 12
    big = [f"{path.relative_to(ROOT)}: {name} ({count} parameters, {lines} lines)"
           for path in files for name, count, lines in _functions(path) if count > 8 or lines > 60]
    assert not big, big


def test_the_size_check_sees_a_long_signature(tmp_path):
    path = tmp_path / "wide.py"
    path.write_text("def wide(a, b, c, d, e, f, g, h, i=1):\n    pass\n")
    assert list(_functions(path)) == [("wide", 9, 2)]
