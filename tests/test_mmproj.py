"""A GGUF language model with a llama.cpp projector file (--mmproj): the committed tiny Gemma 3 pair
(scripts/make_mmproj_fixture.py: make_tiny_vlm.py's weights as llama.cpp lays them out) served through the
engine, its greedy tokens against llama-server's recorded ones for the same prompt and images (one at the
tower's size, one letterboxed and resized), on /completion's multimodal prompt and on the chat route;
images never cut between prefill pieces (they attend both ways), batched == alone, a cache hit == a miss,
and the refusals of files that do not go together."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import sys
from pathlib import Path

import pytest

from server_helpers import error_of, start_server, stop_server

pytest.importorskip("mlx_vlm", reason="make setup installs mlx-vlm")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_mmproj_fixture as fixture  # noqa: E402

RECORD = json.loads(fixture.RECORD.read_text())
PICTURES = fixture.images()


def _b64(name: str) -> str:
    return base64.b64encode(PICTURES[name]).decode()


def _chat(name: str, **extra) -> dict:
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(name)}},
               {"type": "text", "text": RECORD["question"]}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": RECORD["n_predict"],
            "temperature": 0, **extra}


def _completion(name: str) -> dict:
    return {"prompt": {"prompt_string": RECORD["prompt_string"], "multimodal_data": [_b64(name)]},
            "n_predict": RECORD["n_predict"], "temperature": 0, "return_tokens": True}


@pytest.fixture(scope="module")
def loaded():
    from mlxcel_py.models import load_model

    return load_model(str(fixture.TEXT), mmproj=str(fixture.MMPROJ))


@pytest.fixture(scope="module")
def server(loaded):
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=7)  # pieces of 7 around 16 image tokens
    yield running
    stop_server(running)


def test_the_prompt_is_llama_cpps(loaded):
    vision = loaded.vision
    media = vision.process(RECORD["prompt_string"].replace("<__media__>", vision.marker),
                           [PICTURES["gradient"]], add_special_tokens=True)
    ids = media.prompt_ids
    assert len(ids) == RECORD["completion"]["gradient"]["prompt_tokens"]
    lo = ids.index(vision.image_token_id)
    assert ids[0] == loaded.bos_token_id and ids.count(loaded.bos_token_id) == 1
    assert loaded.tokenizer.decode([ids[lo - 1]]) == "<start_of_image>"
    assert ids[lo:lo + 17] == (vision.image_token_id,) * 16 + (ids[lo + 16],)
    assert loaded.tokenizer.decode([ids[lo + 16]]) == "<end_of_image>"
    assert media.both_ways == ((lo, lo + 16),)
    assert media.pixel_values.shape == (1, 3, 32, 32)
    # letterboxed: the 48x40 gradient fills 32x27 rows of the square, black (normalized -1) above and below
    assert (media.pixel_values[0, :, :2] == -1).all() and (media.pixel_values[0, :, -3:] == -1).all()
    assert not (media.pixel_values[0, :, 2:29] == -1).all()


@pytest.mark.parametrize("name", ["square", "gradient"])
def test_greedy_tokens_equal_llama_servers(server, name):
    with server.client() as client:
        got = client.post("/completion", json=_completion(name))
        assert got.status_code == 200, got.text
        assert got.json()["tokens"] == RECORD["completion"][name]["tokens"]
        assert got.json()["tokens_evaluated"] == RECORD["completion"][name]["prompt_tokens"]
        chat = client.post("/v1/chat/completions", json=_chat(name)).json()
    assert chat["choices"][0]["message"]["content"] == RECORD["chat"][name]["content"]
    assert chat["usage"]["prompt_tokens"] == RECORD["chat"][name]["prompt_tokens"]


def test_a_cache_hit_answers_as_a_miss(server):
    with server.client() as client:
        first = client.post("/v1/chat/completions", json=_chat("gradient")).json()
        again = client.post("/v1/chat/completions", json=_chat("gradient")).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"] \
        == RECORD["chat"]["gradient"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_an_image_request_beside_text_requests_answers_as_alone(server):
    text = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24, "temperature": 0}
    with server.client() as client:
        text_alone = client.post("/v1/chat/completions", json=text).json()["choices"][0]["message"]["content"]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            image = pool.submit(client.post, "/v1/chat/completions", json=_chat("square"))
            texts = [pool.submit(client.post, "/v1/chat/completions", json=text) for _ in range(2)]
            assert image.result(60).json()["choices"][0]["message"]["content"] == RECORD["chat"]["square"]["content"]
            assert all(t.result(60).json()["choices"][0]["message"]["content"] == text_alone for t in texts)


def test_the_server_says_it_takes_images_and_refuses_bad_ones(server):
    with server.client() as client:
        assert client.get("/props").json()["modalities"]["vision"] is True
        bad = client.post("/v1/chat/completions", json={**_chat("square"), "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}]})
        assert bad.status_code == 400 and "not an image" in error_of(bad)["message"]
        assert client.post("/completion", json=_completion("square")).json()["tokens"] == \
            RECORD["completion"]["square"]["tokens"]


def test_files_that_do_not_go_together_are_refused(tmp_path):
    from mlxcel_py.errors import ModelLoadError
    from mlxcel_py.models import load_model

    with pytest.raises(ModelLoadError, match="is no llama.cpp vision projector"):
        load_model(str(fixture.TEXT), mmproj=str(fixture.TEXT))
    with pytest.raises(ModelLoadError, match="the model is not Gemma 3"):
        load_model(str(ROOT / "tests/fixtures/gguf/llama-f16.gguf"), mmproj=str(fixture.MMPROJ))
    with pytest.raises(ModelLoadError, match="model path not found: .*missing.gguf"):
        load_model(str(fixture.TEXT), mmproj=str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="--mmproj goes with a GGUF model"):
        load_model(str(tmp_path), mmproj=str(fixture.MMPROJ))


def test_the_flag_is_serves_alone(tmp_path):
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError

    cfg = resolve("serve", flags_for("serve", mmproj="p.gguf"), env={})
    assert cfg.model.mmproj == "p.gguf"
    assert resolve("serve", flags_for("serve"), env={"LLAMA_ARG_MMPROJ": "q.gguf"}).model.mmproj == "q.gguf"
    assert resolve("generate", flags_for("generate"), env={"LLAMA_ARG_MMPROJ": "q.gguf"}).model.mmproj is None
    with pytest.raises(ConfigError, match="--mmproj goes with one model"):
        resolve("serve", flags_for("serve", mmproj="p.gguf", model=["a.gguf", "b.gguf"]), env={})
    with pytest.raises(ConfigError, match="--mmproj applies to serve"):
        resolve("generate", flags_for("generate", mmproj="p.gguf"), env={})
