"""`mlxcel-py serve`: flags reach the config, startup failures are one-line errors, SIGTERM drains."""

import json
import os
import queue
import signal
import socket
import threading

import httpx
from typer.testing import CliRunner

import mlxcel_py.server.http.serving as run_module
from mlxcel_py.cli.app import app
from server_helpers import spawn_server, start_server, stop_server, wait_for
from tiny import tiny_model, write_tiny_gguf


def test_flags_reach_serve_forever(monkeypatch):
    seen = []
    monkeypatch.setattr(run_module, "serve_forever", seen.append)
    args = ["serve", "-np", "3", "--prefill-chunk-size", "256", "--alias", "m", "--api-key", "k",
            "--port", "0", "--temp", "0.5", "--max-queue", "7", "--no-prompt-cache", "--max-body-bytes", "4096",
            "--shutdown-grace", "2.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert (cfg.engine.num_slots, cfg.engine.max_queue, cfg.engine.prompt_cache.enabled) == (3, 7, False)
    assert cfg.chunk.explicit == 256 and cfg.sampling.temperature == 0.5
    assert (cfg.server.model_alias, cfg.server.api_key, cfg.server.port) == ("m", "k", 0)
    assert (cfg.server.max_body_bytes, cfg.server.shutdown_grace_s) == (4096, 2.5)


def test_bad_server_limits_are_one_line_errors():
    cases = ((["--max-body-bytes", "10"], "error: --max-body-bytes must be at least 1024 (got 10)"),
             (["--shutdown-grace", "-1"], "error: --shutdown-grace must be between 0 and 3600.0 (got -1.0)"))
    for args, message in cases:
        result = CliRunner().invoke(app, ["serve", "--port", "0", *args])
        assert result.exit_code != 0 and result.stderr.splitlines()[-1] == message, result.output


def test_port_in_use_is_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port), "--model", "/nonexistent.gguf"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.1:{port}: ")


def test_bad_model_is_one_line_error():
    result = CliRunner().invoke(app, ["serve", "--port", "0", "--model", "/nonexistent/model.gguf"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "error: model path not found: /nonexistent/model.gguf"


def _health(url):
    try:
        return httpx.get(url + "/health", timeout=1).status_code
    except httpx.TransportError:
        return None


def _stream_then_sigterm(started: queue.Queue, loaded: threading.Event, out: dict) -> None:
    """Client side: see 503 while loading, then start a stream and SIGTERM the server mid-stream."""
    port, server = started.get(timeout=30)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _health(url) == 503, 30, "/health to answer 503 while loading")
        loaded.set()
        wait_for(lambda: _health(url) == 200, 30, "the server to be ready")
        body = {"prompt": "hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            lines = resp.iter_lines()
            frames = [next(line for line in lines if line.startswith("data: "))]
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the server's handler on the main thread
            frames += [line for line in lines if line.startswith("data: ")]
        out["frames"] = frames
    finally:
        server.should_exit = True  # never leave the server running if the client side failed


def test_loading_then_sigterm_drains_and_exits_0(monkeypatch):
    model, loaded = tiny_model(), threading.Event()  # built before the patch: tiny_model calls load_model
    monkeypatch.setattr("mlxcel_py.models.load_model", lambda path, **kw: model if loaded.wait(30) else None)
    started: queue.Queue = queue.Queue()
    real_bind, real_make = run_module.bind_socket, run_module.make_server
    port = []

    def bind(host, port_, *rest):
        sock = real_bind(host, port_, *rest)
        port.append(sock.getsockname()[1])
        return sock

    def make(app_, cfg):
        server = real_make(app_, cfg)
        started.put((port[0], server))
        return server

    monkeypatch.setattr(run_module, "bind_socket", bind)
    monkeypatch.setattr(run_module, "make_server", make)
    out: dict = {}
    client = threading.Thread(target=_stream_then_sigterm, args=(started, loaded, out))
    client.start()
    result = CliRunner().invoke(app, ["serve", "--port", "0", "-np", "1"])
    client.join(30)
    assert result.exit_code == 0, result.output
    frames = out["frames"]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert "stopped" in result.stderr


def test_grace_period_over_cuts_the_rest():
    running = start_server(parallel=2, grace_s=0.3)
    body = {"prompt": "hello", "max_tokens": 3000, "ignore_eos": True}
    waiting: dict = {}

    def non_streaming():
        with running.client() as own:
            waiting["response"] = own.post("/v1/completions", json=body)

    try:
        with running.client() as client, \
                client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            lines = resp.iter_lines()
            frames = [next(line for line in lines if line.startswith("data: "))]
            other = threading.Thread(target=non_streaming)
            other.start()
            wait_for(lambda: running.worker.stats().num_busy_slots == 2, 10, "both requests to run")
            running.server.should_exit = True  # what SIGTERM does
            frames += [line for line in lines if line.startswith("data: ")]
            other.join(10)
            running.thread.join(10)
            assert not running.thread.is_alive()
            wait_for(lambda: running.worker.stats().num_busy_slots == 0, 10, "both to be aborted")
    finally:
        stop_server(running)
    assert frames[-1] == "data: [DONE]"
    final, error = json.loads(frames[-3][6:]), json.loads(frames[-2][6:])
    assert final["choices"][0]["finish_reason"] == "abort" and final["object"] == "text_completion"
    assert error["error"]["message"] == "the server shut down before this request finished (grace period 0.3 s)"
    cut = waiting["response"]
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "server_shutting_down"


def _read_stream(url, body, first: threading.Event, out: list):
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                first.set()


def test_sigterm_ends_every_stream_with_done_and_exits_0(tmp_path):
    child = spawn_server(write_tiny_gguf(tmp_path / "tiny.gguf"), "-np", "2", "--shutdown-grace", "0.5")
    url = child.url
    try:
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 100000, "ignore_eos": True,
                "stream": True, "cache_prompt": False}
        streams = [([], threading.Event()) for _ in range(3)]  # two decoding, one queued
        readers = [threading.Thread(target=_read_stream, args=(url, body, first, out)) for out, first in streams]
        for reader in readers:
            reader.start()
        for out, first in streams:
            assert first.wait(30)
        wait_for(lambda: sum(len(out) > 3 for out, _ in streams) >= 2, 30, "two streams to be decoding")
        child.proc.send_signal(signal.SIGTERM)
        for reader in readers:
            reader.join(30)
        assert child.proc.wait(30) == 0
    finally:
        child.kill()
    log = child.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "cut 3 requests" in log
    for out, _ in streams:
        assert out[-1] == "[DONE]"
        final, error = json.loads(out[-3]), json.loads(out[-2])
        assert final["choices"][0]["finish_reason"] == "abort" and final["object"] == "chat.completion.chunk"
        assert error["error"]["code"] == "server_shutting_down" and error["error"]["type"] == "unavailable_error"


def test_serve_runs_its_loop_on_uvloop_when_installed(monkeypatch):
    import asyncio
    import sys

    import uvloop

    assert run_module.event_loop_runner() is uvloop.run  # a dependency: what `serve` runs on here
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a platform without it
    assert run_module.event_loop_runner() is asyncio.run
