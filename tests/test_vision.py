"""Images in chat: a tiny random-weight Gemma 3 VLM (scripts/make_tiny_vlm.py, built here) served through the
engine, its greedy tokens against mlx-vlm's own model (its language model, its cache) for the same prompt and
pixels; chunked == whole, batched == alone, streaming, the OpenAI client, and every refusal."""

from __future__ import annotations

import base64
import concurrent.futures
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

from server_helpers import error_of, start_server, stop_server

pytest.importorskip("mlx_vlm", reason="make setup installs mlx-vlm")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_vlm.py"
TOKENS = 8
QUESTION = "What is in the image?"


def _png(color=(200, 30, 30), size=(48, 40)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def _url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _chat(raw: bytes, question: str = QUESTION, **extra) -> dict:
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": _url(raw)}}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, "temperature": 0,
            **extra}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("make_tiny_vlm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("vlm") / "tiny-gemma3"
    module.build(out, "float32")
    return out


@pytest.fixture(scope="module")
def loaded(model_dir):
    from mlxcel_py.models import load_model

    return load_model(str(model_dir))


@pytest.fixture(scope="module")
def server(loaded):
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=7)  # pieces of 7 split the image's 16
    yield running
    stop_server(running)


def reference(model_dir: Path, prompt_ids: tuple[int, ...], pixel_values: np.ndarray) -> list[int]:
    """mlx-vlm's own model end to end (its language model, its cache): greedy, TOKENS tokens."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache
    from mlx_vlm.utils import load

    vlm, _ = load(str(model_dir))
    ids = mx.array([list(prompt_ids)])
    embeds = vlm.get_input_embeddings(ids, mx.array(pixel_values), mask=mx.ones_like(ids)).inputs_embeds
    cache = make_prompt_cache(vlm.language_model)
    logits = vlm.language_model(ids, inputs_embeds=embeds, cache=cache).logits
    out = [int(mx.argmax(logits[0, -1]))]
    while len(out) < TOKENS:
        out.append(int(mx.argmax(vlm.language_model(mx.array([[out[-1]]]), cache=cache).logits[0, -1])))
    return out


def _prompt(loaded, raw: bytes, question: str = QUESTION):
    messages = [{"role": "user", "content": [{"type": "text", "text": question}, {"type": "image"}]}]
    text = loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return loaded.vision.process(text, [raw])


def test_the_prompt_has_one_bos_and_the_images_tokens(loaded):
    media = _prompt(loaded, _png())
    assert media.prompt_ids.count(loaded.bos_token_id) == 1 and media.prompt_ids[0] == loaded.bos_token_id
    assert media.prompt_ids.count(loaded.vision.image_token_id) == loaded.vision.image_tokens == 16
    assert media.pixel_values.shape == (1, 3, 32, 32)


def test_greedy_tokens_equal_mlx_vlms_own_model(server, loaded, model_dir):
    raw = _png()
    media = _prompt(loaded, raw)
    want = reference(model_dir, media.prompt_ids, media.pixel_values)
    with server.client() as client:
        got = client.post("/v1/chat/completions", json=_chat(raw)).json()
    assert got["usage"] == {**got["usage"], "prompt_tokens": len(media.prompt_ids), "completion_tokens": TOKENS}
    assert got["choices"][0]["finish_reason"] == "length"
    assert got["choices"][0]["message"]["content"] == loaded.tokenizer.decode(want)
    assert client_text(server, _png((20, 200, 90))) != client_text(server, raw)  # the image decides the reply


def client_text(server, raw: bytes, **extra) -> str:
    with server.client() as client:
        resp = client.post("/v1/chat/completions", json=_chat(raw, **extra))
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def test_an_image_request_beside_text_requests_answers_as_alone(server, loaded):
    raw = _png((30, 30, 220))
    alone = client_text(server, raw)
    text = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24, "temperature": 0}
    with server.client() as client:
        text_alone = client.post("/v1/chat/completions", json=text).json()["choices"][0]["message"]["content"]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            image = pool.submit(client_text, server, raw)
            texts = [pool.submit(client.post, "/v1/chat/completions", json=text) for _ in range(2)]
            assert image.result(60) == alone
            assert all(t.result(60).json()["choices"][0]["message"]["content"] == text_alone for t in texts)


def test_streaming_and_the_openai_client(server, loaded):
    openai = pytest.importorskip("openai")
    raw = _png((90, 90, 10))
    alone = client_text(server, raw)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    body = _chat(raw)
    stream = client.chat.completions.create(model="tiny", messages=body["messages"], max_tokens=TOKENS,
                                            temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == alone


def test_a_second_turn_over_the_same_image_adopts_its_kv_and_answers_as_a_miss(server, loaded):
    raw = _png((250, 120, 0))
    first = _chat(raw)
    with server.client() as client:
        reply = client.post("/v1/chat/completions", json=first).json()
        turn = {**first, "messages": first["messages"] + [
            {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And the colour?"}]}
        hit = client.post("/v1/chat/completions", json=turn).json()
        miss = client.post("/v1/chat/completions", json={**turn, "cache_prompt": False}).json()
        other = client.post("/v1/chat/completions", json={**turn, "messages": [
            {**turn["messages"][0], "content": [turn["messages"][0]["content"][0],
                                                {"type": "image_url", "image_url": {"url": _url(_png((0, 0, 0)))}}]},
            *turn["messages"][1:]]}).json()
    image_start = _prompt(loaded, raw).prompt_ids.index(loaded.vision.image_token_id)
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] >= reply["usage"]["prompt_tokens"]
    assert miss["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert hit["choices"][0]["message"]["content"] == miss["choices"][0]["message"]["content"]
    # Another image at the same place: the ids match, the key does not, so nothing past the image is adopted.
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= image_start


def test_two_images_with_the_same_ids_get_their_own_replies(server, loaded):
    first, second = _png((250, 250, 250)), _png((5, 5, 5))
    assert _prompt(loaded, first).prompt_ids == _prompt(loaded, second).prompt_ids
    assert client_text(server, first) != client_text(server, second)


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "not fetched by this server"),
    ("data:image/png;base64,@@@", "base64 does not decode"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not an image this server reads"),
    ("cat.png", "must be a base64 data: URL"),
])
def test_bad_images_are_a_400_and_the_server_goes_on(server, loaded, url, message):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "max_tokens": 2}
    with server.client() as client:
        resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and message in error_of(resp)["message"], resp.text
    assert "messages[0].content[0]" in error_of(resp)["message"]
    assert client_text(server, _png())


def test_too_many_images_and_images_outside_user_turns_are_refused(server):
    from mlxcel_py.serve_config import DEFAULT_IMAGE_MAX_COUNT as MAX_IMAGES

    part = {"type": "image_url", "image_url": {"url": _url(_png())}}
    with server.client() as client:
        many = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": [part] * (MAX_IMAGES + 1)}], "max_tokens": 2})
        assert many.status_code == 400 and f"at most {MAX_IMAGES} images per request (--image-max-count)" in \
            error_of(many)["message"]
        system = client.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": [part]}, {"role": "user", "content": "hi"}], "max_tokens": 2})
        assert system.status_code == 400 and "images go in user turns" in error_of(system)["message"]


def test_a_text_only_model_refuses_an_image():
    running = start_server()
    try:
        with running.client() as client:
            resp = client.post("/v1/chat/completions", json=_chat(_png()))
            assert resp.status_code == 400
            assert "takes text only; images need a vision-language model" in error_of(resp)["message"]
            assert client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code == 200
    finally:
        stop_server(running)


def test_the_anthropic_and_ollama_clients_send_a_png(server):
    anthropic = pytest.importorskip("anthropic")
    ollama = pytest.importorskip("ollama")
    raw = _png((160, 60, 200))
    want = client_text(server, raw)
    b64 = base64.b64encode(raw).decode()
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    got = client.messages.create(model="tiny", max_tokens=TOKENS, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}])
    assert got.content[0].text == want and got.usage.input_tokens + got.usage.cache_read_input_tokens > 16
    reply = ollama.Client(host=server.url).chat(model="tiny", messages=[
        {"role": "user", "content": QUESTION, "images": [raw]}], options={"temperature": 0, "num_predict": TOKENS})
    assert reply.message.content == want


def test_other_dialects_name_the_image_they_refuse(server):
    with server.client() as client:
        url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
        resp = client.post("/v1/messages", json={"model": "x", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": [url]}]})
        assert resp.status_code == 400 and "not fetched by this server" in resp.json()["error"]["message"]
        resp = client.post("/api/chat", json={"model": "x", "stream": False, "messages": [
            {"role": "user", "content": "hi", "images": ["@@"]}]})
        assert resp.status_code == 400 and resp.json()["error"].startswith("messages[0].images[0]: ")


def test_a_client_leaving_an_image_prefill_stops_it_and_the_slot_serves_on(server, loaded):
    import json
    import socket

    from prometheus_client.parser import text_string_to_metric_families

    from server_helpers import wait_for

    def aborts(client) -> float:
        for family in text_string_to_metric_families(client.get("/metrics").text):
            for sample in family.samples:
                if sample.name == "mlxcel_requests_total" and sample.labels.get("finish_reason") == "abort":
                    return sample.value
        return 0.0

    raw_png = _png((10, 140, 140))
    alone = client_text(server, raw_png)
    long_question = " ".join(["what is here"] * 400)  # ~1,200 tokens: 170 pieces of 7
    body = json.dumps({**_chat(raw_png, long_question), "stream": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with server.client() as client:
        before, left = server.worker.stats().num_prompt_tokens, aborts(client)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head + body)
            wait_for(lambda: server.worker.stats().num_prompt_tokens - before >= 7, 30, "the prefill to start")
        wait_for(lambda: aborts(client) > left, 10, "the server to notice the client left")
        wait_for(lambda: server.worker.stats().num_busy_slots == 0, 30, "the slot to be freed")
        assert server.worker.stats().num_prompt_tokens - before < 1000  # most of the prompt never ran
    assert client_text(server, raw_png) == alone


def test_the_responses_api_takes_an_input_image(server):
    raw = _png((220, 220, 40))
    want = client_text(server, raw)
    with server.client() as client:
        resp = client.post("/v1/responses", json={"input": [{"role": "user", "content": [
            {"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": _url(raw)}]}],
            "max_output_tokens": TOKENS, "temperature": 0})
        assert resp.status_code == 200, resp.text
        assert resp.json()["output"][-1]["content"][0]["text"] == want
        by_file = client.post("/v1/responses", json={"input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}]})
        assert by_file.status_code == 400 and "input[0].content[0]: an input_image needs an image_url" in \
            by_file.json()["error"]["message"]


def test_the_model_lists_say_it_takes_images(server):
    with server.client() as client:
        assert client.get("/props").json()["modalities"] == {"vision": True, "video": False, "audio": False}
        assert client.get("/v1/models").json()["data"][0]["capabilities"] == ["completion", "multimodal"]
        assert "vision" in client.post("/api/show", json={"model": "tiny"}).json()["capabilities"]
    running = start_server()
    try:
        with running.client() as client:
            assert client.get("/props").json()["modalities"]["vision"] is False
            assert client.get("/v1/models").json()["data"][0]["capabilities"] == ["completion"]
            assert "vision" not in client.post("/api/show", json={"model": "x"}).json()["capabilities"]
    finally:
        stop_server(running)


def test_the_image_limits_are_flags(loaded):
    from PIL import Image

    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError
    from config_helpers import flags_for

    noise = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(noise, "PNG")
    small = _png()
    assert len(small) < 200 < len(noise.getvalue())
    running = start_server(model=loaded, image_max_bytes=200, image_max_count=1)
    try:
        with running.client() as client:
            big = client.post("/v1/chat/completions", json=_chat(noise.getvalue()))
            assert big.status_code == 400 and "at most 200 (--image-max-bytes)" in error_of(big)["message"]
            two = _chat(small)
            two["messages"][0]["content"].append(two["messages"][0]["content"][1])
            many = client.post("/v1/chat/completions", json=two)
            assert many.status_code == 400 and "at most 1 images per request" in error_of(many)["message"]
            assert client.post("/v1/chat/completions", json=_chat(small)).status_code == 200
    finally:
        stop_server(running)
    with pytest.raises(ConfigError, match="--image-max-count must be between 1 and 1024"):
        resolve("serve", flags_for("serve", image_max_count=0), env={})


def test_llama_servers_completion_takes_multimodal_data(server, loaded, model_dir):
    raw = _png((0, 90, 250))
    b64 = base64.b64encode(raw).decode()
    text = "<start_of_turn>user\nDescribe <__media__> briefly.<end_of_turn>\n<start_of_turn>model\n"
    with server.client() as client:
        assert client.get("/props").json()["media_marker"] == "<__media__>"
        got = client.post("/completion", json={"prompt": {"prompt_string": text, "multimodal_data": [b64]},
                                               "n_predict": TOKENS, "temperature": 0, "return_tokens": True})
        assert got.status_code == 200, got.text
        media = loaded.vision.process(text.replace("<__media__>", "<start_of_image>"), [raw], add_special_tokens=True)
        assert media.prompt_ids[0] == loaded.bos_token_id and media.prompt_ids.count(loaded.bos_token_id) == 1
        assert got.json()["tokens"] == reference(model_dir, media.prompt_ids, media.pixel_values)
        assert got.json()["tokens_evaluated"] == len(media.prompt_ids)
        wrong = client.post("/completion", json={"prompt": {"prompt_string": "no marker", "multimodal_data": [b64]}})
        assert wrong.status_code == 400 and "0 <__media__> markers for 1 multimodal_data images" in \
            error_of(wrong)["message"]


def test_ollamas_generate_takes_images(server):
    raw = _png((100, 0, 100))
    want = client_text(server, raw)
    b64 = base64.b64encode(raw).decode()
    with server.client() as client:
        got = client.post("/api/generate", json={"model": "tiny", "prompt": QUESTION, "images": [b64], "stream": False,
                                                 "options": {"temperature": 0, "num_predict": TOKENS}})
        assert got.status_code == 200, got.text
        assert got.json()["response"] == want
        raw_mode = client.post("/api/generate", json={"model": "tiny", "prompt": "x", "images": [b64], "raw": True})
        assert raw_mode.status_code == 400 and "not with raw: true" in raw_mode.json()["error"]


def test_image_urls_are_fetched_only_with_the_flag(loaded, server):
    import http.server
    import threading

    raw = _png((60, 120, 180))
    want = client_text(server, raw)

    class Images(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            found = self.path == "/a.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            if found:
                self.wfile.write(raw)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{images.server_address[1]}"

    def ask(client, url):
        content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
        return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}],
                                                         "max_tokens": TOKENS, "temperature": 0})

    running = start_server(model=loaded, allow_image_urls=True, image_max_bytes=len(raw) + 10)
    try:
        with server.client() as client:
            off = ask(client, base + "/a.png")
            assert off.status_code == 400 and "--allow-image-urls turns it on" in error_of(off)["message"]
        with running.client() as client:
            on = ask(client, base + "/a.png")
            assert on.status_code == 200, on.text
            assert on.json()["choices"][0]["message"]["content"] == want
            missing = ask(client, base + "/b.png")
            assert missing.status_code == 400 and "answered HTTP 404" in error_of(missing)["message"]
    finally:
        stop_server(running)
        images.shutdown()
