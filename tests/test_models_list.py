"""`mlxcel-py models`: the HF cache's model repos and the default model, with size and format."""

import re

from typer.testing import CliRunner

from gguf_fixtures import FIXTURES
from hf_cache import add_cached_dir, add_cached_repo
from mlxcel_py.cli.app import app
from mlxcel_py.models.catalog import default_entry, hub_models


def _rows(stdout: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines()[1:] if line.strip()]


def test_lists_cache_and_default(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    add_cached_dir(hub, "tiny/llama", FIXTURES / "llama-hf")
    add_cached_repo(hub, "tiny/qwen3-GGUF", {
        "qwen3-F16.gguf": FIXTURES / "qwen3-f16.gguf", "sub/qwen3-Q8_0.gguf": FIXTURES / "qwen3-q8_0.gguf",
    })
    add_cached_repo(hub, "tiny/readme-only", {"README.md": FIXTURES / "llama-hf" / "config.json"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    entries, problem = hub_models()
    assert problem is None
    llama_size = sum(p.stat().st_size for p in (FIXTURES / "llama-hf").iterdir())
    qwen_size = (FIXTURES / "qwen3-f16.gguf").stat().st_size + (FIXTURES / "qwen3-q8_0.gguf").stat().st_size
    assert [(e.name, e.format, e.size_bytes, e.files) for e in entries] == [
        ("tiny/llama", "mlx", llama_size, ()),
        ("tiny/qwen3-GGUF", "gguf", qwen_size, ("qwen3-F16.gguf", "sub/qwen3-Q8_0.gguf")),
        ("tiny/readme-only", "other", (FIXTURES / "llama-hf" / "config.json").stat().st_size, ()),
    ]
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    default = default_entry()
    assert _rows(result.stdout) == [
        [default.name, "gguf, default", f"{default.size_bytes / 1e6:.1f} MB", default.files[0]],
        ["tiny/llama", "mlx", f"{llama_size / 1e3:.1f} KB"],
        ["tiny/qwen3-GGUF", "gguf", f"{qwen_size / 1e3:.1f} KB", "qwen3-F16.gguf, sub/qwen3-Q8_0.gguf"],
        ["tiny/readme-only", "other", f"{(FIXTURES / 'llama-hf' / 'config.json').stat().st_size / 1e3:.1f} KB"],
    ]


def test_no_cache_is_said_on_stderr(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "none"))
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0
    assert f"no Hugging Face cache at {tmp_path / 'none'}" in result.stderr
    assert _rows(result.stdout)[0][1] == "gguf, default"
