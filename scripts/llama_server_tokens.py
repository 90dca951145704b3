"""Record llama-server's tokenization and greedy continuation of a prompt for each GGUF."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

NUM_TOKENS = 16
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _wait_ready(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling a child process's port: nothing to wait on but time
    raise RuntimeError("llama-server did not become ready")


def greedy(server: str, gguf: Path, prompt: str) -> dict:
    port = _free_port()
    cmd = [server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
           "-t", "2", "--no-repack", "--no-warmup"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        prompt_ids = _post(port, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
        out = _post(port, "/completion", {
            "prompt": prompt_ids, "n_predict": NUM_TOKENS, "temperature": 0.0, "top_k": 1,
            "samplers": ["top_k"], "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
        })
        return {"prompt_ids": prompt_ids, "greedy_ids": out["tokens"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def version(server: str) -> str:
    out = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((out.stdout + out.stderr).split())


def record_tokens(server: str, ggufs: list[Path], out: Path, prompt: str) -> None:
    existing = json.loads(out.read_text()) if out.exists() else {"fixtures": {}}
    existing.update(llama_cpp=version(server), prompt=prompt, num_tokens=NUM_TOKENS)
    for gguf in ggufs:
        existing["fixtures"][gguf.name] = greedy(server, gguf, prompt)
        print(f"llama-server {gguf.name}: {existing['fixtures'][gguf.name]['greedy_ids']}")
        out.write_text(json.dumps(existing, indent=1) + "\n")
