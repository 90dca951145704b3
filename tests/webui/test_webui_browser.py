"""The chat page in headless chromium against a real server on the tiny model (tests/tiny.py).

The first test is the smoke that `make test` runs; the rest are `webui_full` (`make test-webui`).
"""

from __future__ import annotations

import json

import httpx
import pytest

from server_helpers import start_server, stop_server, wait_for
from tiny import tiny_model

ANSWER_TIMEOUT_MS = 30_000
full = pytest.mark.webui_full
# Recorded in the page from its first script on: when the progress bar first had a value, every
# value it took, and when the newest assistant turn first showed text.
TIMELINE = """
window.__timeline = {progress: [], firstText: null, firstProgress: null, lengths: []};
new MutationObserver(() => {
  const t = window.__timeline, now = performance.now();
  const bar = document.querySelector('[data-role="assistant"] [role="progressbar"][aria-valuenow]');
  if (bar) {
    const v = Number(bar.getAttribute('aria-valuenow'));
    if (t.progress.at(-1)?.[0] !== v) t.progress.push([v, Number(bar.getAttribute('aria-valuemax'))]);
    t.firstProgress ??= now;
  }
  const body = [...document.querySelectorAll('[data-role="assistant"] .body')].at(-1);
  const n = body ? body.textContent.length : 0;
  if (n && t.firstText === null) t.firstText = now;
  if (n && t.lengths.at(-1) !== n) t.lengths.push(n);
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
"""


def open_page(recorded):
    page = recorded.page
    page.goto("/")
    page.get_by_text("ready").wait_for()
    return page


def ask(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def wait_answered(page, count: int = 1):
    """The count-th assistant turn, once its reply has finished (its stats line is written)."""
    turn = page.locator('[data-role="assistant"]').nth(count - 1)
    turn.locator(".stats").filter(has_text="tokens").wait_for(timeout=ANSWER_TIMEOUT_MS)
    return turn


def set_settings(page, **values: str) -> None:
    page.get_by_role("button", name="Settings").click()
    for name, value in values.items():
        page.locator(f'#settings [name="{name}"]').fill(value)
    page.get_by_role("button", name="Settings").click()


def test_smoke_a_question_gets_a_streamed_answer_and_nothing_leaves(recorded, server):
    recorded.page.add_init_script(TIMELINE)
    page = open_page(recorded)
    set_settings(page, temperature="0", max_tokens="200")
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as reply:
        ask(page, "What is the capital of France?")
    turn = wait_answered(page)
    assert page.locator('[data-role="user"] .body').inner_text() == "What is the capital of France?"
    assert turn.locator(".body").inner_text().strip()
    # streamed: asked for a stream and read one (the page renders once a frame, so a short reply on a
    # busy machine can land in one frame: the text's growth is not what proves it)
    assert json.loads(reply.value.request.post_data)["stream"] is True
    assert reply.value.headers["content-type"].startswith("text/event-stream")
    assert page.evaluate("window.__timeline.lengths")  # the reply's text reached the page as it was rendered
    stats = turn.locator(".stats").inner_text()
    assert "tok/s" in stats and "TTFT" in stats and "cached" in stats
    assert page.get_by_role("button", name="Send").is_enabled()
    assert any(u.endswith("/v1/chat/completions") for u in recorded.requests)
    assert any(u.endswith("/webui/vendor/purify.js") for u in recorded.requests)
    assert recorded.foreign() == []
    assert recorded.errors == []


def prompt_of(num_tokens: int) -> str:
    from mlxcel_py.models import encode_text

    sentence = "The quick brown fox jumps over the lazy dog. "
    per = len(encode_text(tiny_model().tokenizer, sentence * 10)) / 10
    return sentence * int(num_tokens / per)


@full
def test_a_long_prompt_shows_the_progress_bar_before_the_first_token(recorded):
    recorded.page.add_init_script(TIMELINE)
    page = open_page(recorded)
    set_settings(page, max_tokens="4")
    ask(page, prompt_of(3000))
    wait_answered(page)
    t = page.evaluate("window.__timeline")
    assert t["firstProgress"] is not None and t["firstText"] is not None
    assert t["firstProgress"] < t["firstText"]
    values = [v for v, _ in t["progress"]]
    total = t["progress"][0][1]
    assert 2900 < total < 3200
    # Pieces of the chunk policy (2048 alone), then the rest: the bar moves in visible steps.
    assert values == [2048, total]
    assert recorded.foreign() == []


@full
def test_stop_ends_a_long_reply_and_the_page_stays_usable(recorded, server):
    page = open_page(recorded)
    set_settings(page, temperature="0", max_tokens="3000")
    ask(page, "Tell me a long story")
    body = page.locator('[data-role="assistant"] .body').first
    page.wait_for_function("() => document.querySelector('[data-role=\"assistant\"] .body').textContent.length > 20")
    page.get_by_role("button", name="Stop").click()
    page.get_by_role("button", name="Send").wait_for()
    turn = page.locator('[data-role="assistant"]').first
    assert "stopped" in turn.locator(".stats").inner_text()
    assert body.inner_text().strip()  # the partial answer stays
    slots = lambda: httpx.get(server.url + "/slots").json()  # noqa: E731
    wait_for(lambda: all(s["state"] == "idle" for s in slots()), 10.0, "the server to drop the stopped request")
    set_settings(page, max_tokens="8")
    ask(page, "Hi")
    second = wait_answered(page, 2)
    assert "8 tokens" in second.locator(".stats").inner_text()


@full
def test_a_reload_keeps_the_conversation(recorded):
    page = open_page(recorded)
    set_settings(page, max_tokens="12", temperature="0")
    ask(page, "Remember me")
    answer = wait_answered(page).locator(".body").inner_text()
    page.reload()
    page.get_by_text("ready").wait_for()
    assert page.locator('[data-role="user"] .body').inner_text() == "Remember me"
    assert page.locator('[data-role="assistant"] .body').inner_text() == answer
    assert page.locator("#conversations .title").all_inner_texts() == ["Remember me"]
    assert page.locator('#settings [name="max_tokens"]').input_value() == "12"


def sse(*contents: str) -> str:
    frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    frames += [{"choices": [{"index": 0, "delta": {"content": c}}]} for c in contents]
    frames.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(contents), "total_tokens": 9,
                                           "prompt_tokens_details": {"cached_tokens": 0}}})
    return "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"


@full
def test_html_in_the_models_output_is_shown_as_text(recorded):
    """A scripted reply (the route answered by the test) with a script, an image and a code block."""
    page = recorded.page
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"},
        body=sse("Here:\n\n<script>window.__pwned = 1</script>\n\n", "<b onclick=\"x()\">bold?</b> ",
                 "![t](http://example.invalid/t.png)\n\n", "```python\nprint(1)\n```\n")))
    open_page(recorded)
    ask(page, "show me html")
    body = wait_answered(page).locator(".body")
    text = body.inner_text()
    assert "<script>window.__pwned = 1</script>" in text and '<b onclick="x()">bold?</b>' in text
    assert body.locator("script, img, b, [onclick]").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert body.locator("pre code.language-python .hljs-built_in").inner_text() == "print"
    assert body.locator(".code-block button.copy").count() == 1
    assert [u for u in recorded.requests if "example.invalid" in u] == []


@full
def test_the_server_panel_shows_the_slots(recorded, server):
    page = open_page(recorded)
    page.get_by_role("button", name="Server").click()
    panel = page.locator("#server-panel")
    panel.locator("#slots tbody tr").nth(1).wait_for()
    assert panel.locator("#slots tbody tr").count() == 2
    assert panel.locator("#slots tbody tr").first.locator("td").nth(1).inner_text() == "idle"
    info = panel.locator("#server-info").inner_text()
    assert server.runtime.model_id in info and f"{server.worker.stats().slot_context} tokens" in info


@full
def test_conversations_rename_delete_and_new(recorded):
    page = open_page(recorded)
    set_settings(page, max_tokens="4")
    ask(page, "first")
    wait_answered(page)
    page.get_by_role("button", name="New conversation").click()
    assert page.locator("[data-role]").count() == 0
    ask(page, "second")
    wait_answered(page)
    titles = page.locator("#conversations .title")
    assert titles.all_inner_texts() == ["second", "first"]
    page.get_by_role("button", name="Rename first").click()
    page.get_by_role("textbox", name="New title").fill("renamed")
    page.get_by_role("textbox", name="New title").press("Enter")
    assert titles.all_inner_texts() == ["renamed", "second"]  # renaming stores it, so it is newest
    page.get_by_role("button", name="Delete second").click()
    assert titles.all_inner_texts() == ["renamed"]
    assert page.locator('[data-role="user"] .body').inner_text() == "first"


@pytest.fixture
def keyed_server():
    running = start_server(api_key="s3cret")
    yield running
    stop_server(running)


@full
def test_with_an_api_key_the_page_asks_for_it(browser, keyed_server):
    context = browser.new_context(base_url=keyed_server.url)
    page = context.new_page()
    page.goto("/")
    page.get_by_role("dialog").get_by_label("API key").fill("s3cret")
    page.get_by_role("button", name="Use this key").click()
    page.locator("#model-name").filter(has_text=keyed_server.runtime.model_id).wait_for()
    set_settings(page, max_tokens="4")
    ask(page, "hello")
    assert "4 tokens" in wait_answered(page).locator(".stats").inner_text()
    context.close()
