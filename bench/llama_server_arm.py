"""llama-server's n-gram speculation beside ours (bench_speculative.py --llama-server PATH): the same
GGUF, the same prompt token ids, greedy, the same thread count, plain vs `--spec-type ngram-simple`.

Each arm starts its own llama-server on 127.0.0.1 (a free port), sends `streams` identical
/completion requests at once (prompt cache off), and reads llama-server's own timings: one
stream's tok/s is its `predicted_per_second`; several streams' the sum of theirs."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)  # polling a child's readiness: no event to wait on
    raise RuntimeError("llama-server did not become healthy in time")


class LlamaServer:
    """One llama-server process for an arm; `run(ids, ...)` -> (tok/s, tokens of stream 0, drafted, accepted)."""

    def __init__(self, binary: str, model: Path, threads: int, streams: int, spec: list[str]):
        self.port, self.streams = _free_port(), streams
        cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
               "-tb", str(threads), "-np", str(streams), "-c", str(2048 * streams), "--no-warmup", *spec]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        _wait_healthy(self.base, self.proc)

    def run(self, ids: list[int], max_tokens: int, ignore_eos: bool) -> tuple[float, list[int], int, int]:
        body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "ignore_eos": ignore_eos, "return_tokens": True, "seed": 0}
        results: list = [None] * self.streams

        def one(i: int) -> None:
            results[i] = _post(self.base + "/completion", body, timeout=600)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(self.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        timings = [r["timings"] for r in results]
        tps = sum(t["predicted_per_second"] for t in timings)
        drafted = sum(t.get("draft_n", 0) for t in timings)
        accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
        return tps, list(results[0].get("tokens", [])), drafted, accepted

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def spec_args(ngram: int, draft_max: int) -> list[str]:
    """llama-server's n-gram arm with our lookup's n-gram and longest draft."""
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram),
            "--spec-ngram-simple-size-m", str(draft_max), "--spec-draft-n-max", str(draft_max)]
