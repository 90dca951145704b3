"""Shared helpers for the server tests: a real uvicorn server on 127.0.0.1 port 0 with the tiny model."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from mlxcel_py.config import AppConfig, resolve
from mlxcel_py.engine import build_engine
from mlxcel_py.engine.core.worker import EngineWorker
from mlxcel_py.server.app import create_app
from mlxcel_py.server.runtime import Runtime
from mlxcel_py.server.http.serving import GracefulServer, bind_socket, make_server
from config_helpers import flags_for
from tiny import tiny_model

START_TIMEOUT_S = 20.0
GREEDY = {"temperature": 0.0}


@dataclass(frozen=True)
class RunningServer:
    url: str
    config: AppConfig
    server: GracefulServer
    thread: threading.Thread
    runtime: Runtime

    @property
    def worker(self) -> Optional[EngineWorker]:
        return self.runtime.worker

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def start_server(loaded: bool = True, grace_s: Optional[float] = None, model: Any = None,
                 sampling: Optional[dict] = None, **resolve_kwargs: Any) -> RunningServer:
    """Resolve a serve config (port 0), build the engine on `model` (default: the tiny one), run uvicorn
    in a thread. `sampling` overrides the requests' defaults (e.g. a logit_bias no dialect can send)."""
    cfg = resolve("serve", flags_for("serve", port=0, **resolve_kwargs), env={})
    if sampling:
        cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, **sampling))
    if grace_s is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, shutdown_grace_s=grace_s))
    worker = None
    if loaded:
        model = model or tiny_model()
        worker = EngineWorker(build_engine(cfg.engine, model)).start()
    else:
        model = None
    app = create_app(worker, model, cfg)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_server(app, cfg)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-uvicorn", daemon=True)
    thread.start()
    wait_for(lambda: server.started, START_TIMEOUT_S, "uvicorn to start")
    return RunningServer(f"http://127.0.0.1:{port}", cfg, server, thread, app.state.runtime)


def stop_server(running: RunningServer) -> None:
    running.server.should_exit = True
    running.thread.join(START_TIMEOUT_S)
    if running.worker is not None:
        running.worker.stop()


def sse_payloads(lines) -> list[Any]:
    """The `data:` payloads of an SSE stream: dicts, and the final "[DONE]" string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_post(client: httpx.Client, path: str, body: dict) -> list[Any]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_payloads(response.iter_lines())


OVERFLOW_KEYS = {"n_prompt_tokens", "n_ctx"}  # llama-server's, on a context overflow only


def error_of(response: httpx.Response) -> dict:
    """The OpenAI error object of a response, checking its shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    extra = OVERFLOW_KEYS if body["error"].get("code") == "context_length_exceeded" else set()
    assert set(body["error"]) == {"message", "type", "param", "code"} | extra, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def long_prompt(num_tokens: int) -> list[int]:
    """Token ids of a prompt with exactly `num_tokens` tokens (plain text ids of the tiny vocab)."""
    from mlxcel_py.models import encode_text

    ids = encode_text(tiny_model().tokenizer, "The quick brown fox jumps over the lazy dog. " * (num_tokens // 5 + 10))
    return list(ids[:num_tokens])


@dataclass
class ChildServer:
    """`mlxcel-py serve` in a child process, its output collected on threads (a full pipe would block it)."""

    proc: subprocess.Popen
    url: str = ""
    lines: list = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _collect(stream, lines: list, found: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if re.search(r"ready: serving", line):
            found.set()


def spawn_server(model: Path, *args: str, timeout: float = 120.0) -> ChildServer:
    """Start `mlxcel-py serve -m model --port 0 *args` and wait until it answers /health with 200."""
    import httpx

    script = Path(sys.executable).with_name("mlxcel-py")
    env = {**os.environ, "COLUMNS": "400"}  # rich wraps log lines at the terminal width
    proc = subprocess.Popen([str(script), "serve", "-m", str(model), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    child, ready = ChildServer(proc), threading.Event()
    threading.Thread(target=_collect, args=(proc.stdout, child.lines, ready), daemon=True).start()
    try:
        wait_for(lambda: ready.is_set() or proc.poll() is not None, timeout, "the child server to load")
        urls = [m.group(1) for line in list(child.lines) for m in [re.search(r"server (http://[\d.]+:\d+)", line)] if m]
        assert ready.is_set() and urls, child.log()
        child.url = urls[0]
        httpx.get(child.url + "/health", timeout=10).raise_for_status()
    except BaseException:
        child.kill()
        raise
    return child
