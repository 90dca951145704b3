"""The benchmark client: SSE frames of our server, llama-server and mlx_lm.server; streaming
against a tiny in-test SSE server, including an admission round and a TTFT run end to end."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlxcel_py.loadtest.admit import AdmitConfig, admit_rounds, build_round_prompts, run_admit
from mlxcel_py.loadtest.client import (
    Frame, StreamLog, completion_body, frame_from_json, light_stream_request, new_client, parse_sse, parse_sse_line,
    stream_request,
)
from mlxcel_py.loadtest.servers import Arm
from mlxcel_py.loadtest.ttft import TtftConfig, run_ttft

OURS = [
    'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"","logprobs":null,'
    '"finish_reason":null}],"prompt_progress":{"total":2048,"cache":0,"processed":512,"time_ms":40.5}}',
    "",
    'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":" Paris","logprobs":null,'
    '"finish_reason":null}]}',
    "",
    'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"","logprobs":null,'
    '"finish_reason":"length"}],"timings":{"prompt_n":2048}}',
    "",
    "data: [DONE]",
]
LLAMA_NATIVE = [
    'data: {"index":0,"content":"","tokens":[],"stop":false,"prompt_progress":'
    '{"total":100,"cache":0,"processed":100,"time_ms":9.1}}',
    'data: {"index":0,"content":" hi","tokens":[42],"stop":false}',
    'data: {"index":0,"content":"","tokens":[],"stop":true,"stop_type":"limit"}',
]
LLAMA_OAI_CHAT = [
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],'
    '"created":1758113912,"id":"chatcmpl-x","model":"qwen","object":"chat.completion.chunk",'
    '"prompt_progress":{"total":36,"cache":0,"processed":36,"time_ms":57.3}}',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Hi"}}],"object":"chat.completion.chunk"}',
    'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"timings":{"prompt_n":36}}',
    'data: {"choices":[],"usage":{"prompt_tokens":36,"completion_tokens":1}}',
    "data: [DONE]",
]
CHAT = [
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}',
    'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}',
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}',
    ": keep-alive comment",
    "event: ping",
]


def test_our_frames_progress_token_finish_done():
    frames = parse_sse(OURS)
    assert frames == [
        Frame(progress={"total": 2048, "cache": 0, "processed": 512, "time_ms": 40.5}),
        Frame(text=" Paris"),
        Frame(finish_reason="length"),
        Frame(done=True),
    ]


def test_llama_server_native_frames():
    frames = parse_sse(LLAMA_NATIVE)
    assert frames[0].progress["processed"] == 100 and frames[0].text == ""
    assert frames[1] == Frame(text=" hi")
    assert frames[2].finish_reason == "limit"


def test_llama_server_openai_frames():
    frames = parse_sse(LLAMA_OAI_CHAT)
    assert frames[0] == Frame(progress={"total": 36, "cache": 0, "processed": 36, "time_ms": 57.3})
    assert frames[1] == Frame(text=" Hi")
    assert frames[2].finish_reason == "length" and frames[3] == Frame() and frames[4].done


def test_chat_deltas_and_ignored_lines():
    assert [f.text for f in parse_sse(CHAT)] == ["", "Hel", ""]
    assert parse_sse(CHAT)[-1].finish_reason == "stop"
    assert parse_sse_line(": comment") is None and parse_sse_line("") is None


def test_errors_in_band_and_malformed():
    assert frame_from_json({"error": {"message": "boom", "code": 500}}).error == "boom"
    assert frame_from_json({"error": "plain"}).error == "plain"
    assert parse_sse_line("data: {not json").error.startswith("malformed SSE payload")
    assert frame_from_json([1, 2]).error is not None


def test_stream_log_records_tokens_and_progress():
    log = StreamLog()
    for t, frame in enumerate(parse_sse(OURS)):
        log.record(frame, float(t))
    assert log.token_times == [1.0] and log.first_token == 1.0
    assert log.progress == [(0.0, {"total": 2048, "cache": 0, "processed": 512, "time_ms": 40.5})]
    assert log.finish_reason == "length" and log.ended


def test_completion_body_never_stops_or_caches():
    body = completion_body("hi", 7, progress=True, eos_ids={2, 0})
    assert body["ignore_eos"] is True and body["cache_prompt"] is False and body["stream"] is True
    assert body["return_progress"] is True and body["temperature"] == 0.0
    assert body["logit_bias"] == {"0": -100.0, "2": -100.0}
    assert "logit_bias" not in completion_body("hi", 1) and "return_progress" not in completion_body("hi", 1)


class FakeServer:
    """A loopback OpenAI-ish server: tokens every `itl_s`; a prompt of more than 20 words
    gets two progress frames and a `prefill_s` pause first."""

    def __init__(self, itl_s: float = 0.004, prefill_s: float = 0.05):
        self.itl_s, self.prefill_s, self.bodies = itl_s, prefill_s, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200 if self.path == "/health" else 404, b'{"status":"ok"}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    return self._send(404, b'{"error":"not found"}')
                fake.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    fake.stream(self.wfile, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _send(self, code, data):
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def stream(self, out, body):
        def send(obj):
            out.write(f"data: {json.dumps(obj)}\n\n".encode())
            out.flush()

        total = len(body["prompt"].split())
        if total > 20:
            for done in (total // 2, total):
                time.sleep(self.prefill_s / 2)
                if body.get("return_progress"):
                    send({"choices": [{"text": ""}], "prompt_progress": {"total": total, "cache": 0,
                                                                        "processed": done, "time_ms": 1.0}})
        for _ in range(body["max_tokens"]):
            time.sleep(self.itl_s)
            send({"choices": [{"index": 0, "text": " w", "finish_reason": None}]})
        send({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        out.write(b"data: [DONE]\n\n")
        out.flush()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.close()


def words(text: str) -> list[str]:
    return text.split()


def test_stream_request_against_fake(fake):
    async def go():
        log = StreamLog()
        async with new_client() as client:
            await stream_request(client, fake.url + "/v1/completions", completion_body("a b", 5), log)
        return log

    log = asyncio.run(go())
    assert log.status == 200 and len(log.token_times) == 5 and log.finish_reason == "length"
    assert log.token_times == sorted(log.token_times) and log.sent <= log.token_times[0]


def test_stream_request_reports_http_errors(fake):
    async def go():
        log = StreamLog()
        async with new_client() as client:
            await stream_request(client, fake.url + "/nope", {}, log)
        return log

    assert asyncio.run(go()).error.startswith("HTTP 404")


def test_light_stream_request_reads_what_httpx_reads(fake):
    async def go(light):
        log = StreamLog()
        if light:
            await light_stream_request(fake.url + "/v1/completions", completion_body("a b", 5), log)
        else:
            async with new_client() as client:
                await stream_request(client, fake.url + "/v1/completions", completion_body("a b", 5), log)
        return log

    light, heavy = asyncio.run(go(True)), asyncio.run(go(False))
    assert (light.status, len(light.token_times), light.finish_reason) == (heavy.status, 5, "length") == (200, 5, "length")
    assert light.token_times == sorted(light.token_times) and light.sent <= light.token_times[0]
    assert fake.bodies[0] == fake.bodies[1]  # the same request on the wire
    log = StreamLog()
    asyncio.run(light_stream_request(fake.url + "/nope", {}, log))
    assert log.status == 404 and log.error == 'HTTP 404: {"error":"not found"}'


CHUNKED_FRAMES = (b'data: {"choices":[{"text":" a","finish_reason":null}]}\n\n'
                  b'data: {"choices":[{"text":" b","finish_reason":null}]}\n\ndata: {"choices":[{"text":"",'
                  b'"finish_reason":"length"}]}\n\ndata: [DONE]\n\n')


async def _chunked_server(sizes, data=CHUNKED_FRAMES):
    """A server answering every request with `data` in chunks of `sizes` bytes (lines split
    across chunks, one chunk with an extension), then the zero chunk."""
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        at = 0
        for i, size in enumerate(sizes):
            piece, at = data[at:at + size], at + size
            ext = b";x=1" if i == 1 else b""
            writer.write(f"{len(piece):x}".encode() + ext + b"\r\n" + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


class FrameLog(StreamLog):
    """A StreamLog that keeps every frame it was handed, to compare the two readers' parses."""

    def __init__(self):
        super().__init__()
        self.frames = []

    def record(self, frame, now):
        self.frames.append(frame)
        super().record(frame, now)


def _read_both(sizes, data=CHUNKED_FRAMES) -> tuple[FrameLog, FrameLog]:
    """(bare-socket log, httpx log) of one request each to a server sending `data` in chunks of `sizes`."""
    async def go():
        server = await _chunked_server(sizes, data)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        light, heavy = FrameLog(), FrameLog()
        await asyncio.wait_for(light_stream_request(url, {}, light), 10)
        async with new_client() as client:
            await asyncio.wait_for(stream_request(client, url, {}, heavy), 10)
        server.close()
        return light, heavy

    return asyncio.run(go())


def test_light_stream_request_reads_chunked_bodies_split_anywhere():
    light, heavy = _read_both([10, 47, 60, len(CHUNKED_FRAMES) - 117])
    assert len(light.token_times) == len(heavy.token_times) == 2
    assert light.finish_reason == heavy.finish_reason == "length" and light.error is None


MIXED = (b': comment\n\ndata: {"choices":[{"text":"","finish_reason":null}],"prompt_progress":{"processed":4}}\n\n'
         b'data: {"choices":[{"text":" a","finish_reason":null}]}\r\n\r\ndata: {"error":{"message":"slot lost"}}\n\n'
         b'data: not json\n\nevent: ping\ndata: {"content":" b","stop":true,"stop_type":"eos"}\n\n')


@pytest.mark.parametrize("tail, sizes", [
    (b"data: [DONE]\n\ndata: {\"content\":\" after\"}\n\n", [3, 70, 1, 90]),  # [DONE] ends the read
    (b'data: {"choices":[{"text":" z","finish_reason":"length"}]}', [50, 50, 50, 50]),  # no final newline
])
def test_both_readers_parse_the_same_frames_from_the_same_bytes(tail, sizes):
    body = MIXED + tail
    light, heavy = _read_both(sizes + [len(body) - sum(sizes)], body)
    want = [Frame(progress={"processed": 4}), Frame(text=" a"), Frame(error="slot lost"),
            Frame(error="malformed SSE payload: not json"), Frame(text=" b", finish_reason="eos")]
    want += [Frame(done=True)] if b"[DONE]" in tail else [Frame(text=" z", finish_reason="length")]
    assert light.frames == heavy.frames == want
    assert light.error == heavy.error == "malformed SSE payload: not json"
    tokens = sum(1 for f in want if f.text)
    assert len(light.token_times) == len(heavy.token_times) == tokens and len(light.progress) == len(heavy.progress) == 1


def test_admission_round_end_to_end(fake):
    cfg = AdmitConfig(num_streams=2, prompt_tokens=40, stream_prompt_tokens=5, stream_max_tokens=10_000,
                      quiet_s=0.25, rounds=2, pause_s=0.0)  # room for a few tokens on a loaded machine
    prompts = build_round_prompts(words, cfg)
    rounds = asyncio.run(admit_rounds(fake.url, cfg, prompts, words, frozenset({2})))
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        assert r["admitted"]["server_prompt_tokens"] == 40
        assert [p["processed"] for p in r["admitted"]["progress"]] == [20, 40]
        assert r["admit_window_s"][0] == 0.0 and r["admitted"]["ttft_ms"] > 0
        for stream, stats in zip(r["streams"], r["stream_stats"]):
            end = r["admit_window_s"][1]
            assert sum(t > end for t in stream["token_times_s"]) >= cfg.tail_tokens  # the tail was waited for
            assert stats["during"]["num_intervals"] >= 1 and stats["quiet"]["num_intervals"] >= 1
    # Every prompt (warm-up, streams, admitted; both rounds) was unique and uncached.
    prompts_sent = [b["prompt"] for b in fake.bodies]
    assert len(set(prompts_sent)) == len(prompts_sent) and all(b["cache_prompt"] is False for b in fake.bodies)


def test_run_admit_and_ttft_with_url_arms(fake):
    cfg = AdmitConfig(num_streams=1, prompt_tokens=30, stream_prompt_tokens=5, quiet_s=0.02, rounds=1)
    result = run_admit([Arm("fake", url=fake.url), Arm("dead", url="http://127.0.0.1:9")], cfg,
                       encoder=(words, frozenset()))
    assert "rounds" in result["arms"]["fake"] and "error" in result["arms"]["dead"]
    tcfg = TtftConfig(prompt_tokens=30, rounds=2)
    out = run_ttft([Arm("a", url=fake.url), Arm("b", url=fake.url)], tcfg, encoder=(words, frozenset()))
    assert out["null_arm"] == "b" and [r["round"] for r in out["arms"]["a"]["rounds"]] == [0, 1]
    assert out["summary"]["a"]["n"] == 2 and out["summary"]["a"]["inside_null_range"] in (True, False)
