"""Resolving several models (serve_models.py): -m NAME=SPEC, --models-dir, the limits, and the refusals."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gguf_fixtures import FIXTURES
from mlxcel_py.cli.app import app
from mlxcel_py.config import resolve, startup_summary
from mlxcel_py.errors import ConfigError
from mlxcel_py.serve_models import ModelEntry, parse_keep_alive
from mlxcel_py.server.http import serving

from config_helpers import flags_for

LLAMA, QWEN = str(FIXTURES / "llama-f16.gguf"), str(FIXTURES / "qwen2-f16.gguf")


def test_one_model_is_todays_config():
    cfg = resolve("serve", flags_for("serve", model=LLAMA), env={})
    assert cfg.router is None and cfg.model.path == LLAMA and cfg.server.model_aliases == ()
    named = resolve("serve", flags_for("serve", model=f"fast={LLAMA}"),
                    env={})  # NAME=SPEC with one model: NAME is its --alias
    assert named.router is None and named.model.path == LLAMA and named.server.model_aliases == ("fast",)


def test_several_models_are_named_by_flag_or_stem():
    cfg = resolve("serve", flags_for("serve", model=f"a={LLAMA}", extra_models=(QWEN, "org/repo:Q4_K_M"), models_max=2,
                                     keep_alive="5m", models_memory=1.5, models_preload="qwen2-f16,a"), env={})
    router = cfg.router
    assert router.entries == (ModelEntry("a", LLAMA, named=True), ModelEntry("qwen2-f16", QWEN),
                              ModelEntry("org/repo:Q4_K_M", "org/repo:Q4_K_M"))
    assert (router.max_resident, router.keep_alive_s, router.memory_bytes) == (2, 300.0, int(1.5 * 2**30))
    assert router.preload == ("qwen2-f16", "a") and cfg.model.path == LLAMA
    assert startup_summary(cfg)[:4] == [f"model a: {LLAMA}", f"model qwen2-f16: {QWEN}",
                                        "model org/repo:Q4_K_M: org/repo:Q4_K_M",
                                        "models_max 2 models_memory 1.5 GiB keep_alive 300 s preload qwen2-f16, a"]


def test_models_dir_lists_gguf_files_and_mlx_dirs(tmp_path):
    (tmp_path / "one.gguf").write_bytes(b"")
    (tmp_path / "big-00001-of-00002.gguf").write_bytes(b"")
    (tmp_path / "big-00002-of-00002.gguf").write_bytes(b"")
    (tmp_path / "mlxdir").mkdir()
    (tmp_path / "mlxdir" / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "empty").mkdir()
    cfg = resolve("serve", flags_for("serve", models_dir=str(tmp_path)), env={})
    assert cfg.router.names == ("big", "mlxdir", "one")
    assert cfg.router.entries[0].spec == str(tmp_path / "big-00001-of-00002.gguf")
    assert (cfg.router.max_resident, cfg.router.keep_alive_s, cfg.router.memory_bytes) == (4, -1.0, None)
    from_env = resolve("serve", env={"LLAMA_ARG_MODELS_DIR": str(tmp_path), "LLAMA_ARG_MODELS_MAX": "1"})
    assert from_env.router.names == ("big", "mlxdir", "one") and from_env.router.max_resident == 1


@pytest.mark.parametrize(("raw", "seconds"), [("30", 30.0), (30, 30.0), ("1.5s", 1.5), ("5m", 300.0),
                                              ("1h", 3600.0), ("250ms", 0.25), (-1, -1.0), ("-5m", -1.0), (0, 0.0)])
def test_keep_alive_durations(raw, seconds):
    assert parse_keep_alive(raw, "--keep-alive") == seconds


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": LLAMA, "models_max": 2}, "--models-max applies when several models are configured"),
    ({"model": LLAMA, "keep_alive": "5m"}, "--keep-alive applies when several models are configured"),
    ({"model": LLAMA, "extra_models": (LLAMA,)}, "two models are named 'llama-f16'"),
    ({"model": LLAMA, "extra_models": (QWEN,), "model_alias": "x"}, "--alias names the one model served"),
    ({"model": LLAMA, "extra_models": (QWEN,), "models_max": 0}, "--models-max must be between 1 and 64"),
    ({"model": LLAMA, "extra_models": (QWEN,), "keep_alive": "soon"}, "--keep-alive must be seconds or a duration"),
    ({"model": LLAMA, "extra_models": (QWEN,), "models_memory": 0}, "--models-memory must be at least 0.001"),
    ({"model": LLAMA, "extra_models": (QWEN,), "models_preload": "zz"},
     "--models-preload: no model named 'zz'; the models are llama-f16, qwen2-f16"),
    ({"model": LLAMA, "extra_models": ("x=",)}, "--model 'x=': nothing to load after x="),
    ({"models_dir": "/nonexistent/dir"}, "--models-dir: '/nonexistent/dir' is not a directory"),
    ({"model": LLAMA, "extra_models": (QWEN,), "distributed": "auto"}, "several models cannot be served over"),
])
def test_bad_model_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        resolve("serve", flags_for("serve", **kwargs), env={})
    assert str(info.value).startswith(message), str(info.value)


def test_other_commands_refuse_several_models():
    with pytest.raises(ConfigError, match="apply to serve, not generate"):
        resolve("generate", flags_for("generate", model=LLAMA, extra_models=(QWEN,)), env={})


def test_cli_repeats_model(monkeypatch):
    seen = []
    monkeypatch.setattr(serving, "serve_forever", seen.append)
    args = ["serve", "-m", f"a={LLAMA}", "-m", QWEN, "--models-max", "1", "--keep-alive", "10s", "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen[0].router.names == ("a", "qwen2-f16") and seen[0].router.max_resident == 1
    assert seen[0].router.keep_alive_s == 10.0
    bad = CliRunner().invoke(app, ["serve", "-m", LLAMA, "--models-max", "2", "--port", "0"])
    assert bad.exit_code != 0 and "--models-max applies when several models are configured" in bad.stderr
