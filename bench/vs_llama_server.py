"""Ours beside llama-server on the same GGUF: two modes, one server at a time (or both up, rounds
interleaved), the same client (mlxcel_py.loadtest) for both.

`python -m bench vs-llama-server` (alias `side-by-side`):

    python -m bench vs-llama-server [--models A.gguf B.gguf] [--servers ours llama] [--slots 4] [--ctx 16384]
        [--threads 2] [--rounds 2] [--window-s 10] [--decode-by frames|replies] [--json out.json] [--ttft-only]
        [--interleave] [--ttft-tokens 2048]

Per model and server: resident memory (RSS of the server's process tree) after load and after decoding,
decode tok/s at 1 and 4 streams (token frames over a window, greedy, EOS ignored; `--decode-by replies`:
from whole non-streamed replies of 136 and 8 tokens, for vocabularies whose tokens are byte pieces), the time to first
token of a lone prompt of `--ttft-tokens` tokens (2,048; 512 where 2,048 would take minutes a round, as a
3B on two cores: the table's header says which), greedy completions of GREEDY_PROMPTS (their first dozen characters
compared across servers), and KV bytes per token. `--interleave` starts both servers and runs each round
on each in turn, the other idle (a machine whose speed drifts over a run slows both alike; resident memory
is still each server's own). llama-server is $LLAMA_SERVER, else `llama-server` on
PATH (scripts/build_llama_server.sh builds one). Prints a markdown table.

`python -m bench kv-bytes`: resident KV bytes per token, ours against llama-server, same model and context
(KV_BYTES_DOC below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

import httpx

from bench.peers import ROOT, machine
from mlxcel_py.loadtest.admit import warm_up
from mlxcel_py.loadtest.client import StreamLog, completion_body, light_stream_request, new_client, stream_request
from mlxcel_py.loadtest.prompts import build_prompt, load_encoder, round_seed
from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, free_port, mlxcel_spec
from mlxcel_py.models.footprint import mapped_resident_bytes, resident_bytes as rss, status_kib

LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"  # scripts/build_llama_server.sh
DECODE_PROMPT_TOKENS = 32
TTFT_TOKENS = 2048
AGREE_CHARS = 12


# ---- What vs-llama-server measures on one running server: resident memory, decode rate, lone TTFT, greedy
# text, KV bytes per token. Every request goes through mlxcel_py.loadtest's client.

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


SHORT_REPLY, LONG_REPLY = 8, 136


async def reply_rate(url: str, prompts: list[str], eos_ids: frozenset[int]) -> float:
    """Aggregate decode tokens/s from whole replies: len(prompts) non-streamed greedy requests at once,
    LONG_REPLY tokens and then SHORT_REPLY, (LONG - SHORT) * streams over the difference of their wall
    times, so the prefill and the HTTP costs cancel. Counts tokens, not frames: a byte-piece vocabulary's
    tokens that end inside a UTF-8 character come as fewer text frames from a server that holds them."""
    async def batch(tokens: int) -> float:
        async with new_client() as client:
            async def one(prompt: str) -> None:
                body = {**completion_body(prompt, tokens, eos_ids=eos_ids), "stream": False}
                resp = await client.post(url + "/v1/completions", json=body, timeout=600)
                got = resp.json().get("usage", {}).get("completion_tokens") if resp.status_code == 200 else None
                if got != tokens:
                    raise RuntimeError(f"asked {tokens} tokens, got {got} (HTTP {resp.status_code})")
            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts))
            return time.perf_counter() - start

    long_s, short_s = await batch(LONG_REPLY), await batch(SHORT_REPLY)
    return len(prompts) * (LONG_REPLY - SHORT_REPLY) / max(long_s - short_s, 1e-6)


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
    code = ("import sys; from mlxcel_py.models import load_model; "
            "from mlxcel_py.engine.runner.model_runner import kv_bytes_per_token; "
            "print(kv_bytes_per_token(load_model(sys.argv[1]).model))")
    got = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, check=True)
    return int(got.stdout.strip().splitlines()[-1])


def ours_description(log: str) -> str:
    """The load line of our startup log (format, weights path, BLAS)."""
    found = re.search(r"loaded \S+: (.*?)\s*$", log, re.MULTILINE)
    return found.group(1) if found else ""


# ---- vs-llama-server: every measurement per model and server, the agreement, the table.

def _opened(name: str, model: str, args: argparse.Namespace, server: ManagedServer, encode, eos_ids) -> dict:
    """A started server's first figures: memory after load, its warm-up, greedy texts."""
    out: dict = {"server": name, "model": Path(model).name, "argv": " ".join(server.spec.argv),
                 "ttft_tokens": args.ttft_tokens}
    out["rss_after_load"] = settled_rss(server.proc.pid)
    asyncio.run(warm_up(server.spec.url, encode, eos_ids, 0))
    out["greedy"] = [] if args.ttft_only else greedy_texts(server.spec.url)
    return out


def _decode_round(url: str, streams: int, r: int, args: argparse.Namespace, encode, eos_ids) -> float:
    prompts = [build_prompt(encode, DECODE_PROMPT_TOKENS, round_seed(0, r, "decode", i)) for i in range(streams)]
    if args.decode_by == "replies":
        return asyncio.run(reply_rate(url, prompts, eos_ids))
    return asyncio.run(decode_rate(url, prompts, eos_ids, args.window_s, args.ctx // args.slots - DECODE_PROMPT_TOKENS - 16))


def _ttft_round(url: str, r: int, args: argparse.Namespace, encode, eos_ids) -> float:
    return asyncio.run(lone_ttft_ms(url, build_prompt(encode, args.ttft_tokens, round_seed(0, r, "ttft")), eos_ids))


def _closing(name: str, model: str, out: dict, server: ManagedServer) -> None:
    """A server's last figures, while it is up: memory after decoding, KV bytes, its load line."""
    out["rss_after_decoding"] = resident_mb(server.proc.pid)
    log = server.log_path.read_text(errors="replace")
    out["kv"] = None if name == "llama" else ours_kv(server.spec.url, log, model)
    out["load_line"] = ours_description(log) if name == "ours" else ""


def _medians(out: dict, key: str, values: list[float]) -> None:
    out[key] = {"median": statistics.median(values), "rounds": values}


def measure(name: str, model: str, args: argparse.Namespace) -> dict:
    """Everything for one server on one model; the server is up only inside this call."""
    encode, eos_ids = load_encoder(model)
    with ManagedServer(server_spec(name, model, args.slots, args.ctx, args.threads), health_timeout_s=600) as server:
        out = _opened(name, model, args, server, encode, eos_ids)
        for streams in [] if args.ttft_only else args.streams:
            _medians(out, f"decode_{streams}", [_decode_round(server.spec.url, streams, r, args, encode, eos_ids)
                                                for r in range(args.rounds)])
        _medians(out, "ttft_ms", [_ttft_round(server.spec.url, r, args, encode, eos_ids) for r in range(args.rounds)])
        _closing(name, model, out, server)
    if name == "llama" and not args.ttft_only:
        out["kv"] = llama_kv_probe(model, args.slots, args.ctx, args.threads)
    return out


def measure_interleaved(names: list[str], model: str, args: argparse.Namespace) -> list[dict]:
    """measure's figures for every server in `names` on one model, all up at once and each round run
    on each server in turn (the others idle meanwhile), so that a drift of the machine's speed over the
    run falls on every server alike instead of on whichever ran later."""
    encode, eos_ids = load_encoder(model)
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in names:  # one at a time: each loads, and its memory settles, while the others idle
            servers[name] = stack.enter_context(ManagedServer(server_spec(name, model, args.slots, args.ctx, args.threads),
                                                              health_timeout_s=600))
        outs = {name: _opened(name, model, args, server, encode, eos_ids) for name, server in servers.items()}
        for streams in [] if args.ttft_only else args.streams:
            rates: dict[str, list[float]] = {name: [] for name in names}
            for r in range(args.rounds):
                for name in names:
                    rates[name].append(_decode_round(servers[name].spec.url, streams, r, args, encode, eos_ids))
            for name in names:
                _medians(outs[name], f"decode_{streams}", rates[name])
        ttfts: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names:
                ttfts[name].append(_ttft_round(servers[name].spec.url, r, args, encode, eos_ids))
        for name in names:
            _medians(outs[name], "ttft_ms", ttfts[name])
            _closing(name, model, outs[name], servers[name])
    if "llama" in outs and not args.ttft_only:
        outs["llama"]["kv"] = llama_kv_probe(model, args.slots, args.ctx, args.threads)
    return [outs[name] for name in names]


def agreement(results: list[dict]) -> None:
    """Per ours-result: how many greedy prompts agree with llama-server's on the first AGREE_CHARS chars."""
    by = {(r["model"], r["server"]): r for r in results}
    for r in results:
        other = by.get((r["model"], "llama"))
        if r["server"] == "ours" and other is not None and r["greedy"]:
            same = [a[:AGREE_CHARS] == b[:AGREE_CHARS] for a, b in zip(r["greedy"], other["greedy"])]
            r["greedy_agree"] = f"{sum(same)}/{len(same)}"


def table(results: list[dict], streams: list[int]) -> str:
    sizes = "/".join(sorted({str(r.get("ttft_tokens", TTFT_TOKENS)) for r in results}, key=int))
    head = ("| model | server | RSS after load MB | RSS after decoding MB (peak) | "
            + " | ".join(f"decode tok/s {s} stream{'s' if s > 1 else ''}" for s in streams)
            + f" | lone {sizes}-token TTFT s | KV bytes/token | greedy first {AGREE_CHARS} chars agree |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        rates = " | ".join(f"{r[f'decode_{s}']['median']:.1f}" if f"decode_{s}" in r else "-" for s in streams)
        after = r["rss_after_decoding"]
        kv = r["kv"]
        rows.append(f"| {r['model']} | {r['server']} | {r['rss_after_load']['rss_mb']:.0f} | "
                    f"{after['rss_mb']:.0f} ({after['peak_mb']:.0f}) | {rates} | {r['ttft_ms']['median'] / 1000:.2f} | "
                    f"{kv['bytes_per_token'] if kv else '?'} | {r.get('greedy_agree', '-')} |")
    return "\n".join(rows)


def main() -> None:
    from mlxcel_py.models import default_model_path

    ap = argparse.ArgumentParser(description="ours beside llama-server on the same GGUF: memory, decode, TTFT, greedy text, KV bytes")
    ap.add_argument("--models", nargs="+",
                    default=[str(default_model_path()), str(ROOT / "tests/fixtures/gguf/llamaq-q4_k_m.gguf")])
    ap.add_argument("--servers", nargs="+", default=["ours", "llama"], choices=["ours", "llama"])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=16384, help="total context (both servers split it over the slots)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--decode-by", choices=["frames", "replies"], default="frames",
                    help="decode tok/s from streamed frames over --window-s, or from whole non-streamed replies of "
                         f"{LONG_REPLY} and {SHORT_REPLY} tokens (reply_rate: byte-piece vocabularies)")
    ap.add_argument("--ttft-tokens", type=int, default=TTFT_TOKENS,
                    help="the lone TTFT prompt's tokens (512 for a 3B on two cores, where 2,048 takes minutes a round)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--previous", type=Path, help="an earlier run's output: its result lines are kept, not rerun")
    ap.add_argument("--ttft-only", action="store_true", help="memory and TTFT only: no greedy texts, decode or KV probe")
    ap.add_argument("--interleave", action="store_true",
                    help="both servers up at once, each round run on each in turn (the other idle): a machine whose "
                         "speed drifts over the run then slows both alike")
    args = ap.parse_args()
    # A SIGTERM (timeout, Ctrl-C's cousin) unwinds, so the server started here is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(machine(), flush=True)
    results = [json.loads(line) for line in (args.previous.read_text().splitlines() if args.previous else [])
               if line.startswith('{"server"')]
    for model in args.models:
        if args.interleave and not any(r["model"] == Path(model).name for r in results):
            print(f"{Path(model).name}: {' and '.join(args.servers)}, interleaved ...", flush=True)
            for out in measure_interleaved(args.servers, model, args):
                results.append(out)
                print(json.dumps(out), flush=True)
            continue
        for name in args.servers:
            kept = [r for r in results if r["model"] == Path(model).name and r["server"] == name]
            if kept and kept[0]["server"] == "llama" and kept[0]["kv"] is None:
                kept[0]["kv"] = llama_kv_probe(model, args.slots, args.ctx, args.threads)
            if kept:
                continue
            print(f"{Path(model).name}: {name} ...", flush=True)
            results.append(measure(name, model, args))
            print(json.dumps(results[-1]), flush=True)
    agreement(results)
    print(f"\nend: {machine()}\n")
    print(table(results, args.streams))
    for r in results:
        print(f"\n{r['model']} {r['server']}: KV {r['kv']}; {r['load_line']}")
        for prompt, text in zip(GREEDY_PROMPTS, r["greedy"]):
            print(f"  {prompt!r} -> {text!r}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": results}, indent=1) + "\n")


# ---- kv-bytes

KV_BYTES_DOC = """Resident KV bytes per token, ours against llama-server, same model and context, one run.

Usage: python -m bench kv-bytes [--gguf PATH] [--prompt 2048] [--ctx 16384] [--parallel 4] [--types f16 q8_0]
Ours (each type in a fresh process, the engine `serve` builds, in process): the KV arrays' bytes while
the long row decodes (the engine's own rows: their resident pages, read from /proc/self/smaps), divided
by the row's positions, and the process's RSS growth over the request (after mx.clear_cache()).
llama-server (`-c CTX -np N -t 2 -ctk T -ctv T -lv 4`, `-fa on` for a quantized V): the KV buffer its
log states (allocated and cleared for every cell at startup) over the context, and its RSS growth
over the same prompt.
"""


def kv_bytes(runner) -> tuple[int, int]:
    """(bytes, positions) of the decode batch's KV."""
    from mlxcel_py.engine.runner.kv_rows import RowKV

    batch = runner._batch
    if isinstance(batch, RowKV):
        return mapped_resident_bytes({b.ctypes.data for b in batch.keys + batch.values}), max(batch.lengths)
    parts = [p for layer in batch for held in (layer.keys, layer.values)
             for p in (held if isinstance(held, tuple) else (held,))]
    return sum(p.nbytes for p in parts), int(batch[0]._idx)


def kv_ours(path: str, kv_type: str, prompt: int, ctx: int, parallel: int) -> dict:
    import mlx.core as mx

    from mlxcel_py.config import resolve
    from mlxcel_py.flags import ServeFlags, build
    from mlxcel_py.engine import Request, SamplingParams, build_engine
    from mlxcel_py.models import load_model

    lm = load_model(path, threads=2)
    types = {} if kv_type == "default" else {"cache_type_k": kv_type, "cache_type_v": kv_type}
    engine = build_engine(resolve("serve", build(ServeFlags, dict(parallel=parallel, ctx_size=ctx, **types)), env={}).engine, lm)
    greedy = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    _run(engine, Request("warm", tuple(range(5, 40)), greedy, cache_prompt=False))
    mx.clear_cache()
    before = rss()
    seen = []
    execute = engine.runner.execute
    engine.runner.execute = lambda step: (execute(step), step.decode and not seen and seen.append(kv_bytes(engine.runner)))[0]
    ids = tuple(random.Random(0).randrange(5, 1000) for _ in range(prompt))
    _run(engine, Request("long", ids, greedy))
    mx.clear_cache()
    nbytes, positions = seen[0]
    return {"server": "ours", "type": kv_type, "kv_bytes": nbytes, "positions": positions,
            "bytes_per_token": nbytes / positions, "rss_growth_per_token": (rss() - before) / (prompt + 8),
            "stated_bytes_per_token": engine.scheduler.prompt_cache.bytes_per_token
            if engine.scheduler.prompt_cache else None}


def _run(engine, request) -> None:
    engine.add_request(request)
    for _ in range(100_000):
        if not engine.has_work():
            return
        engine.step()


def kv_llama(path: str, kv_type: str, prompt: int, ctx: int, parallel: int) -> dict:
    port = free_port()
    args = [LLAMA_SERVER, "-m", path, "-c", str(ctx), "-np", str(parallel), "-t", "2", "--port", str(port),
            "--host", "127.0.0.1", "-ctk", kv_type, "-ctv", kv_type, "-lv", "4"] + (["-fa", "on"] if kv_type.startswith("q") else [])
    log_path = f"/tmp/bench_kv_bytes_llama_{kv_type}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        loaded = rss(str(proc.pid))
        _post(base, list(range(5, 40)))
        before = rss(str(proc.pid))
        ids = [random.Random(0).randrange(5, 1000) for _ in range(prompt)]
        _post(base, ids)
        after = rss(str(proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = open(log_path).read()
    # "llama_kv_cache: size =  191.25 MiB (  4096 cells,  30 layers,  4/4 seqs)": cells per sequence
    sizes = re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*\d+ layers,\s*(\d+)/", text)
    mib, cells = (float(sizes[-1][0]), int(sizes[-1][1]) * int(sizes[-1][2])) if sizes else (float("nan"), ctx)
    return {"server": "llama", "type": kv_type, "kv_bytes": mib * (1 << 20), "positions": cells,
            "bytes_per_token": mib * (1 << 20) / cells, "rss_growth_per_token": (after - before) / (prompt + 8),
            "rss_loaded_mib": loaded / (1 << 20), "rss_after_mib": after / (1 << 20),
            "log": [line for line in text.splitlines() if "llama_kv_cache" in line][-3:]}


def _post(base: str, ids: list[int]) -> None:
    body = json.dumps({"prompt": ids, "n_predict": 8, "temperature": 0, "cache_prompt": True}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=900).read()


def kv_bytes_main() -> None:
    ap = argparse.ArgumentParser(description=KV_BYTES_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--types", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    from mlxcel_py.models.loader import default_model_path

    path = a.gguf or default_model_path()
    if a.child:
        fn = kv_ours if a.child[0] == "ours" else kv_llama
        print(json.dumps(fn(path, a.child[1], a.prompt, a.ctx, a.parallel)))
        return
    for kv_type in ["default", *a.types]:
        for server in ("ours", "llama"):
            if server == "llama" and kv_type == "default":
                continue
            cmd = [sys.executable, "-m", "bench", "kv-bytes", "--gguf", path, "--prompt", str(a.prompt), "--ctx", str(a.ctx),
                   "--parallel", str(a.parallel), "--child", server, kv_type]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            print(out, flush=True)
