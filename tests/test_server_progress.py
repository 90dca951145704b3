"""return_progress frames: one per prefill piece, and the piece size follows the chunk policy."""

import json

import pytest

from server_helpers import long_prompt, start_server, stop_server, stream_post, wait_for


@pytest.fixture(scope="module")
def pinned():
    running = start_server(parallel=1, prefill_chunk_size=16)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def policy():
    running = start_server(parallel=2)  # the default policy: 2048 alone, 512 contended
    yield running
    stop_server(running)


def progress_of(frames):
    return [f["prompt_progress"] for f in frames if isinstance(f, dict) and "prompt_progress" in f]


def test_one_frame_per_piece_with_pinned_chunk(pinned):
    body = {"prompt": long_prompt(100), "max_tokens": 2, "return_progress": True, "cache_prompt": False}
    with pinned.client() as client:
        frames = stream_post(client, "/v1/completions", body)
    progress = progress_of(frames)
    assert [p["processed"] for p in progress] == [16, 32, 48, 64, 80, 96, 100]
    assert all(p["total"] == 100 and p["cache"] == 0 and p["time_ms"] >= 0 for p in progress)
    chunks = list(enumerate(frames[:-1]))
    first_text = next(i for i, f in chunks if f["choices"] and f["choices"][0]["text"])
    last_progress = max(i for i, f in chunks if "prompt_progress" in f)
    assert last_progress < first_text  # prefill reports come before generated text
    assert frames[-1] == "[DONE]"


def test_chat_progress_frames_have_empty_delta(pinned):
    body = {"messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 2, "return_progress": True}
    with pinned.client() as client:
        frames = stream_post(client, "/v1/chat/completions", body)
    with_progress = [f for f in frames if isinstance(f, dict) and "prompt_progress" in f]
    assert with_progress and all(f["choices"][0]["delta"] == {} for f in with_progress)
    assert with_progress[-1]["prompt_progress"]["processed"] == with_progress[-1]["prompt_progress"]["total"]
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"


def test_no_progress_frames_unless_asked(pinned):
    with pinned.client() as client:
        frames = stream_post(client, "/v1/completions", {"prompt": long_prompt(40), "max_tokens": 2})
    assert progress_of(frames) == []


def _steps(progress):
    done = [p["processed"] for p in progress]
    return [b - a for a, b in zip([0] + done, done)]


def test_contended_admission_uses_small_pieces(policy):
    prompt = long_prompt(3000)
    body = {"prompt": prompt, "max_tokens": 1, "return_progress": True, "cache_prompt": False}
    with policy.client() as client:
        decoding = {"prompt": "hello", "max_tokens": 3000, "ignore_eos": True, "cache_prompt": False}
        with client.stream("POST", "/v1/completions", json={**decoding, "stream": True}) as other:
            lines = other.iter_lines()
            next(line for line in lines if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"])
            contended = progress_of(stream_post(client, "/v1/completions", body))
        wait_for(lambda: all(s["state"] == "idle" for s in client.get("/slots").json()), 10, "idle slots")
        alone = progress_of(stream_post(client, "/v1/completions", body))
    assert _steps(contended) == [512] * 5 + [440]
    assert _steps(alone) == [2048, 952]
    assert contended[-1]["processed"] == alone[-1]["processed"] == 3000
