"""The chat page sends an image: headless chromium against a tiny random-weight Gemma 3 VLM (built by
scripts/make_tiny_vlm.py). The page shows the attach button only for a model that takes images, shows the
image before and after sending, and the reply is the chat route's for the same image and question.

MLXCEL_WEBUI_SHOTS=DIR saves the screenshot docs/WEBUI.md shows (image.png) into DIR."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
from pathlib import Path

import pytest

from server_helpers import start_server, stop_server

pytest.importorskip("mlx_vlm", reason="make setup installs mlx-vlm")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_vlm.py"
QUESTION = "What is in the image?"
ANSWER_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mlxcel_py.models import load_model

    spec = importlib.util.spec_from_file_location("make_tiny_vlm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("vlm") / "tiny-gemma3"
    module.build(out, "float32")
    running = start_server(model=load_model(str(out)), parallel=2)
    yield running
    stop_server(running)


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (48, 40), (200, 40, 40)).save(buf, "PNG")
    return buf.getvalue()


def test_the_page_attaches_an_image_and_sends_it(recorded, server, tmp_path):
    page = recorded.page
    page.goto("/")
    page.get_by_text("ready").wait_for()
    page.get_by_role("button", name="Settings").click()
    for name, value in {"temperature": "0", "max_tokens": "8"}.items():
        page.locator(f'#settings [name="{name}"]').fill(value)
    page.get_by_role("button", name="Settings").click()
    attach = page.get_by_role("button", name="Image")
    assert attach.is_visible()  # /props says the model takes images
    raw = _png()
    page.locator("#attach").set_input_files([{"name": "red.png", "mimeType": "image/png", "buffer": raw}])
    page.get_by_role("img", name="image 1 to send").wait_for()
    box = page.get_by_role("textbox", name="Message")
    box.fill(QUESTION)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as reply:
        box.press("Enter")
    turn = page.locator('[data-role="assistant"]').nth(0)
    turn.locator(".stats").filter(has_text="tokens").wait_for(timeout=ANSWER_TIMEOUT_MS)
    sent = page.get_by_role("img", name="attached image 1")
    assert sent.get_attribute("src") == "data:image/png;base64," + base64.b64encode(raw).decode()
    assert page.locator("#attachments").is_hidden()  # the composer's images went with the message
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    with server.client() as client:
        want = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
            {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]}],
            "max_tokens": 8, "temperature": 0}).json()["choices"][0]["message"]["content"]
    sent_body = json.loads(reply.value.request.post_data)
    assert sent_body["messages"][-1]["content"] == [
        {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    frames = [json.loads(line[6:]) for line in reply.value.text().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f.get("choices")) == want
    assert turn.locator(".body").inner_text().strip()
    shots = Path(os.environ.get("MLXCEL_WEBUI_SHOTS") or tmp_path)
    page.screenshot(path=str(shots / "image.png"))
    assert (shots / "image.png").stat().st_size > 0
    assert recorded.foreign() == [] and recorded.errors == []


def test_a_text_model_shows_no_attach_button(browser):
    running = start_server()
    try:
        context = browser.new_context(base_url=running.url)
        page = context.new_page()
        page.goto("/")
        page.get_by_text("ready").wait_for()
        assert page.locator("#attach-button").is_hidden()
        context.close()
    finally:
        stop_server(running)
