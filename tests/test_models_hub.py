"""`--model org/name[@rev][:file|:TAG]` through a Hugging Face cache laid out as huggingface_hub does."""

import os
import socket
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from gguf_fixtures import FIXTURES, write_split
from hf_cache import add_cached_dir, add_cached_repo
from mlxcel_py.models import ModelLoadError, load_model
from mlxcel_py.models.hub import HubId, parse_hub_id


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A hub cache with an mlx-lm/HF model repo and a GGUF repo; huggingface_hub pointed at it."""
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    add_cached_dir(hub, "tiny/llama", FIXTURES / "llama-hf")
    add_cached_repo(hub, "tiny/qwen3-GGUF", {
        "qwen3-F16.gguf": FIXTURES / "qwen3-f16.gguf", "qwen3-Q8_0.gguf": FIXTURES / "qwen3-q8_0.gguf",
        "README.md": FIXTURES / "qwen3-hf" / "config.json",
    })
    add_cached_repo(hub, "tiny/one-GGUF", {"gemma3.gguf": FIXTURES / "gemma3-f16.gguf"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_cache_layout_is_huggingface_hubs(cache):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache)
    assert info.warnings == []
    assert {r.repo_id: r.nb_files for r in info.repos} == {"tiny/llama": 5, "tiny/qwen3-GGUF": 3, "tiny/one-GGUF": 1}


@pytest.mark.parametrize("spec, expected", [
    ("org/name", HubId("org/name", None, None)),
    ("org/name@v1.0", HubId("org/name", "v1.0", None)),
    ("org/name:Q4_K_M", HubId("org/name", None, "Q4_K_M")),
    ("org/Name-1.5B-GGUF@main:name.Q8_0.gguf", HubId("org/Name-1.5B-GGUF", "main", "name.Q8_0.gguf")),
    ("name", None), ("a/b/c", None), ("./org/name", None), ("org/name:", None),
])
def test_parse_hub_id(spec, expected):
    assert parse_hub_id(spec) == expected


def test_mlx_repo_loads_from_the_cache(cache, no_network):
    loaded = load_model("tiny/llama")
    assert (loaded.name, loaded.source) == ("tiny/llama", "mlx")
    assert load_model("tiny/llama@main").name == "tiny/llama@main"


def test_cached_files_need_no_network_even_when_online(cache, no_network, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert load_model("tiny/qwen3-GGUF:Q8_0").description.startswith("qwen3 124K, gguf Q8_0")


@pytest.mark.parametrize("spec, file_type", [
    ("tiny/qwen3-GGUF:Q8_0", "Q8_0"), ("tiny/qwen3-GGUF:q8_0", "Q8_0"), ("tiny/qwen3-GGUF:F16", "F16"),
    ("tiny/qwen3-GGUF:qwen3-F16.gguf", "F16"),
])
def test_gguf_by_tag_or_file_name(cache, no_network, spec, file_type):
    loaded = load_model(spec)
    assert loaded.name == spec and loaded.source == "gguf"
    assert loaded.description.startswith(f"qwen3 124K, gguf {file_type} ->")


def test_a_repo_with_one_gguf_needs_no_tag(cache, no_network):
    assert load_model("tiny/one-GGUF").description.startswith("gemma3 249K, gguf F16")


def test_missing_id_is_one_line_naming_it(cache, no_network):
    message = (
        rf"^model 'tiny/nope' not found: it is not in the Hugging Face cache \({cache}\) and HF_HUB_OFFLINE is set; "
        r"get it with `hf download tiny/nope`$"
    )
    with pytest.raises(ModelLoadError, match=message):
        load_model("tiny/nope")
    with pytest.raises(ModelLoadError, match=r"^model 'tiny/llama@v2' not found: .* `hf download tiny/llama --revision v2`$"):
        load_model("tiny/llama@v2")


def test_tag_not_in_repo_lists_the_files(cache, no_network):
    message = (
        r"^no GGUF file for tag 'Q4_K_M' in tiny/qwen3-GGUF \(GGUF files: qwen3-F16\.gguf, qwen3-Q8_0\.gguf; "
        r"pick one with tiny/qwen3-GGUF:FILE\.gguf\)$"
    )
    with pytest.raises(ModelLoadError, match=message):
        load_model("tiny/qwen3-GGUF")
    with pytest.raises(ModelLoadError, match=r"^model 'tiny/qwen3-GGUF:nope\.gguf' not found"):
        load_model("tiny/qwen3-GGUF:nope.gguf")


def test_a_split_gguf_is_fetched_whole_by_tag_or_by_its_first_part(cache, no_network, tmp_path):
    parts = write_split(FIXTURES / "qwen3-q8_0.gguf", tmp_path / "qwen3-Q8_0.gguf", 8)
    assert len(parts) >= 2
    add_cached_repo(cache, "tiny/split-GGUF", {p.name: p for p in parts})
    whole = load_model("tiny/qwen3-GGUF:Q8_0")
    ids = mx.array([whole.tokenizer.encode("Hello there")])
    for spec in ("tiny/split-GGUF:Q8_0", f"tiny/split-GGUF:{parts[0].name}"):
        np.testing.assert_array_equal(np.array(load_model(spec).model(ids)), np.array(whole.model(ids)))
    add_cached_repo(cache, "tiny/two-GGUF", {"a-Q8_0.gguf": parts[0], "b-Q8_0.gguf": parts[1]})
    with pytest.raises(ModelLoadError, match=r"^more than one GGUF file for tag 'Q8_0' in tiny/two-GGUF: "
                                             r"a-Q8_0\.gguf, b-Q8_0\.gguf; pick one with tiny/two-GGUF:FILE\.gguf$"):
        load_model("tiny/two-GGUF:Q8_0")


def test_missing_relative_gguf_path_is_a_path_error():
    with pytest.raises(ModelLoadError, match=r"^model path not found: models/x\.gguf$"):
        load_model("models/x.gguf")


def _cli(args, hub_cache):
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "mlxcel_py", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_cli_generates_from_a_cached_id_and_fails_fast_on_a_missing_one(cache):
    done = _cli(["generate", "--model", "tiny/qwen3-GGUF:Q8_0", "--raw", "Hello", "-n", "4"], cache)
    assert done.returncode == 0, done.stderr
    missing = _cli(["generate", "--model", "tiny/missing", "Hello"], cache)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: model 'tiny/missing' not found: it is not in the Hugging Face cache")
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr


def test_online_the_cache_is_asked_first_then_the_hub(cache, monkeypatch):
    """With the network allowed, a cache miss becomes one download call (the Hub is faked)."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    calls = []

    def fake_download(repo, filename, *, revision=None, local_files_only=False):
        calls.append((repo, filename, local_files_only))
        if local_files_only:
            raise errors.LocalEntryNotFoundError("not cached")
        return str(FIXTURES / "qwen3-q8_0.gguf")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    loaded = load_model("elsewhere/model-GGUF:model.Q8_0.gguf")
    assert loaded.description.startswith("qwen3 124K, gguf Q8_0")
    assert calls == [("elsewhere/model-GGUF", "model.Q8_0.gguf", True), ("elsewhere/model-GGUF", "model.Q8_0.gguf", False)]


def test_online_failure_is_one_line_with_the_reason(cache, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants, errors

    def fake_download(repo, filename, *, revision=None, local_files_only=False):
        raise errors.LocalEntryNotFoundError("not cached" if local_files_only else "connection refused\nmore")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    message = r"^model 'x/y:f\.gguf' not found: cannot download it \(connection refused\); get it with `hf download x/y`$"
    with pytest.raises(ModelLoadError, match=message):
        load_model("x/y:f.gguf")
