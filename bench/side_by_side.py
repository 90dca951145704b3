"""What bench_vs_llama_server.py measures on one running server: resident memory, decode rate, lone
TTFT, greedy text, KV bytes per token. Every request goes through mlxcel_py.loadtest's client."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

from mlxcel_py.loadtest.client import StreamLog, completion_body, light_stream_request, new_client, stream_request
from mlxcel_py.models.footprint import status_kib
from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, free_port, mlxcel_spec

LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"  # scripts/build_llama_server.sh
# Greedy prompts whose first dozen characters both servers must agree on (leading spaces included).
GREEDY_PROMPTS = (
    "Water boils at a temperature of",
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. What is 12345 + 678?",
)
GREEDY_TOKENS = 16


def server_spec(name: str, model: str, slots: int, ctx: int, threads: int) -> ServerSpec:
    """Ours or llama-server on loopback, same file, slots, total context and threads (default flags else)."""
    if name == "ours":
        flags = ("--ctx-size", str(ctx), "--threads", str(threads))
        spec = mlxcel_spec(Arm("ours", flags), slots, model)
        return ServerSpec(spec.name, spec.argv, spec.port, {"COLUMNS": "400"})  # rich wraps log lines at 80
    port = free_port()
    argv = (LLAMA_SERVER, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx),
            "-np", str(slots), "-t", str(threads))
    return ServerSpec("llama", argv, port)


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (a server may run helpers)."""
    out, todo = [], [pid]
    while todo and len(out) < 256:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return out


def resident_mb(pid: int) -> dict:
    """RSS now and its peak (VmHWM), MB, summed over the server's process tree."""
    rss = hwm = 0
    for p in _tree(pid):
        rss += status_kib("VmRSS", p)  # 0 for a process that has exited meanwhile
        hwm += status_kib("VmHWM", p)
    return {"rss_mb": round(rss / 1024, 1), "peak_mb": round(hwm / 1024, 1)}


def settled_rss(pid: int, settle_s: float = 3.0) -> dict:
    """Resident memory once it stops moving (a lazily mapped file is read on first use)."""
    last = resident_mb(pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = resident_mb(pid)
        if abs(now["rss_mb"] - last["rss_mb"]) < 1.0:
            return now
        last = now
    return last


async def decode_rate(url: str, prompts: list[str], eos_ids: frozenset[int], window_s: float,
                      max_tokens: int, light: bool = True) -> float:
    """Aggregate token frames/s while every stream decodes: from the moment all have two tokens to the
    window's end, or to the first stream's end if one runs out of context sooner. `light`: the bare
    HTTP/1.1 reader (light_stream_request), whose CPU a token is a fraction of httpx's, so the client
    takes less of the cores the server decodes on (the same client for every server)."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        def stream(prompt: str, log: StreamLog):
            body = completion_body(prompt, max_tokens, eos_ids=eos_ids)
            if light:
                return light_stream_request(url + "/v1/completions", body, log, changed)
            return stream_request(client, url + "/v1/completions", body, log, changed)

        tasks = [asyncio.create_task(stream(p, log)) for p, log in zip(prompts, logs)]
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: all(len(g.token_times) >= 2 or g.ended for g in logs)),
                                       600)
            if any(g.ended for g in logs):
                raise RuntimeError(f"a stream ended early: {[(g.finish_reason, g.error) for g in logs]}")
            start = max(g.token_times[1] for g in logs)
            try:
                async with changed:
                    await asyncio.wait_for(changed.wait_for(lambda: any(g.ended for g in logs)), window_s)
            except asyncio.TimeoutError:
                pass
            end = min([time.perf_counter()] + [g.token_times[-1] for g in logs if g.ended and g.token_times])
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return sum(start < t <= end for g in logs for t in g.token_times) / max(end - start, 1e-6)


async def lone_ttft_ms(url: str, prompt: str, eos_ids: frozenset[int]) -> float:
    """A lone prompt's time to its first token: one token asked for, so its frame (with text or, for a
    partial UTF-8 character, with only the finish) is the first token's arrival."""
    log = StreamLog()
    async with new_client() as client:
        await asyncio.wait_for(stream_request(client, url + "/v1/completions",
                                              completion_body(prompt, 1, eos_ids=eos_ids), log), 1800)
        ended = time.perf_counter()  # the one frame, then [DONE]: the stream's end is the token's arrival
    if log.error is not None or log.sent is None:
        raise RuntimeError(f"the TTFT request failed: {log.error}")
    return ((log.first_token or ended) - log.sent) * 1000


def greedy_texts(url: str) -> list[str]:
    """Each greedy prompt's completion text (GREEDY_TOKENS tokens, temperature 0, no prompt cache)."""
    out = []
    with httpx.Client(timeout=600) as client:
        for prompt in GREEDY_PROMPTS:
            body = {"prompt": prompt, "max_tokens": GREEDY_TOKENS, "temperature": 0.0, "cache_prompt": False}
            reply = client.post(url + "/v1/completions", json=body)
            reply.raise_for_status()
            out.append(reply.json()["choices"][0]["text"])
    return out


LLAMA_KV = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells.*?(\d+)/\d+ seqs.*?K \((\w+)\).*?V \((\w+)\)")
OURS_KV = re.compile(r"(\d[\d,]*) (?:bytes|B) (?:of KV )?per token", re.IGNORECASE)


def llama_kv(log: str) -> Optional[dict]:
    """llama-server's KV bytes per token, from its startup log: the cache's size over its cells (the line
    counts one sequence's cells; without --kv-unified each of the `n/n seqs` has its own)."""
    m = LLAMA_KV.search(log)
    if m is None:
        return None
    size_mib, cells = float(m.group(1)), int(m.group(2)) * int(m.group(3))
    return {"bytes_per_token": round(size_mib * 2**20 / cells), "cells": cells, "types": f"K {m.group(4)}, "
            f"V {m.group(5)}", "source": "startup log (-lv 4)"}


def llama_kv_probe(model: str, slots: int, ctx: int, threads: int) -> Optional[dict]:
    """llama-server logs its KV cache's size only at verbosity 4: a second start with -lv 4, read, stopped
    (the measured server runs at its default verbosity)."""
    spec = server_spec("llama", model, slots, ctx, threads)
    spec = ServerSpec("llama-kv", spec.argv + ("-lv", "4"), spec.port)
    with ManagedServer(spec, health_timeout_s=300) as server:
        return llama_kv(server.log_path.read_text(errors="replace"))


def ours_kv(url: str, log: str, model: str) -> dict:
    """Ours: /slots or the startup log where the server states it, else the runner's own formula."""
    try:
        slots = httpx.get(url + "/slots", timeout=10).json()
        for slot in slots if isinstance(slots, list) else []:
            for key, value in slot.items():
                if "bytes_per_token" in key and isinstance(value, int):
                    return {"bytes_per_token": value, "source": f"/slots {key}"}
    except (httpx.HTTPError, ValueError):
        pass
    m = OURS_KV.search(log)
    if m is not None:
        return {"bytes_per_token": int(m.group(1).replace(",", "")), "source": "startup log"}
    return {"bytes_per_token": _formula_kv(model), "source": "runner.kv_bytes_per_token (not stated by the server)"}


def _formula_kv(model: str) -> int:
    """engine/runner/model_runner.kv_bytes_per_token on the model as serve loads it (in a child: MLX)."""
    import subprocess

    code = ("import sys; from mlxcel_py.models import load_model; "
            "from mlxcel_py.engine.runner.model_runner import kv_bytes_per_token; "
            "print(kv_bytes_per_token(load_model(sys.argv[1]).model))")
    got = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, check=True)
    return int(got.stdout.strip().splitlines()[-1])


def ours_description(log: str) -> str:
    """The load line of our startup log (format, weights path, BLAS)."""
    found = re.search(r"loaded \S+: (.*?)\s*$", log, re.MULTILINE)
    return found.group(1) if found else ""
