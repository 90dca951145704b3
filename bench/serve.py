"""Benchmarks of our server over HTTP, one mode a subcommand (each `python -m bench <mode> --help`):

    decode            aggregate decode tok/s at 1 and 4 streams, ours beside mlx_lm.server and llama-server
    serve-path        the HTTP path's CPU a token apart from the decode step's: event loop and client
    models            several models behind one server: cold and resident TTFT, two models decoding at once
    mixed-embeddings  embedding requests arriving while four chat streams decode
    distributed       one process against two tensor-parallel ranks on this machine

Each starts its server(s) in child processes on 127.0.0.1 (`models` in a thread of this one).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

from bench import peers
from bench.peers import ROOT, machine
from mlxcel_py.loadtest.admit import warm_up
from mlxcel_py.loadtest.client import StreamLog, completion_body, light_stream_request, new_client, stream_request
from mlxcel_py.loadtest.prompts import build_prompt, load_encoder, round_seed
from mlxcel_py.loadtest.scaled import ScaledDims, write_scaled_gguf
from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, free_port, mlxcel_spec
from mlxcel_py.loadtest.stats import itls_overlapping, itls_within, percentile


# ---- decode --------------------------------------------------------------------------------------

DECODE_DOC = """Aggregate decode tokens/s through each server's HTTP API at 1 and 4 streams, same machine, same run.

    python -m bench decode [--streams 1 4] [--window-s 10] [--rounds 3] [--arms ours mlx_lm llama]

Arms: `ours` (mlxcel-py serve, the default model, dense float32 on the CPU), `mlx_lm`
(mlx_lm.server on the dense float32 conversion of the same model, OpenBLAS preloaded with
the same kernels: bench/peers.py) and `llama` (llama-server on the default Q4_1 GGUF, where
installed, -t 2 -b 512), each also with its threads tamed for a busy machine (see spec_for).
All servers of a stream count run at once and take turns within each round, so load swings
hit every arm alike. A turn starts N streams of a 32-token prompt (greedy, EOS ignored), waits
until every stream has two tokens, then counts the token frames all streams receive in a
window of `--window-s` seconds. Prints the median and range over rounds, and the load average.
"""


PROMPT_TOKENS = 32


async def one_round(url: str, prompts: list[str], eos_ids: frozenset[int], window_s: float) -> float:
    """Aggregate token frames per second over the window in which every stream decodes."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        tasks = [asyncio.create_task(stream_request(client, url + "/v1/completions",
                                                    completion_body(p, 4096, eos_ids=eos_ids), log, changed))
                 for p, log in zip(prompts, logs)]
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: all(len(g.token_times) >= 2 or g.ended for g in logs)), 600)
            if any(g.ended for g in logs):
                raise RuntimeError(f"a stream ended early: {[(g.finish_reason, g.error) for g in logs]}")
            start = time.perf_counter()
            await asyncio.sleep(window_s)
            end = time.perf_counter()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return sum(start <= t <= end for g in logs for t in g.token_times) / (end - start)


ARMS = ("ours", "mlx_lm", "mlx_lm-1t", "llama", "llama-passive", "llama-t1")


def spec_for(name: str, streams: int) -> ServerSpec:
    """The server of an arm. `-1t`: OpenBLAS on one thread; `-passive`: OpenMP threads that
    sleep instead of spinning at barriers; `-t1`: llama-server on one thread. (On a busy
    2-core machine spinning threads collapse: docs/CPU_DECODE.md.)"""
    if name == "ours":
        return mlxcel_spec(Arm("ours"), streams, None)
    if name.startswith("mlx_lm"):
        spec = peers.mlx_lm_spec(name, peers.ensure_converted(), None)
        return replace(spec, env={**spec.env, "OPENBLAS_NUM_THREADS": "1"}) if name.endswith("-1t") else spec
    binary = peers.llama_server_binary()
    if binary is None:
        raise RuntimeError("llama-server is not installed ($LLAMA_SERVER unset, none on PATH)")
    from mlxcel_py.models import default_model_path

    spec = peers.llama_server_spec(name, binary, default_model_path(), 512, streams)
    if name == "llama-passive":
        return replace(spec, env={**spec.env, "OMP_WAIT_POLICY": "passive"})
    if name == "llama-t1":
        argv = list(spec.argv)
        argv[argv.index("-t") + 1] = "1"
        return replace(spec, argv=tuple(argv))
    return spec


def decode_main() -> None:
    ap = argparse.ArgumentParser(description=DECODE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = ap.parse_args()
    encode, eos_ids = load_encoder(None)
    print(f"load average at start {os.getloadavg()[0]:.2f}; window {args.window_s:.0f} s, {args.rounds} rounds, "
          "arms alternating within each round")
    print("| server | streams | tok/s median | range | load during |\n|---|---:|---:|---:|---:|", flush=True)
    for streams in args.streams:
        with ExitStack() as stack:
            servers, rates, loads = {}, {name: [] for name in args.arms}, {name: [] for name in args.arms}
            for name in args.arms:  # all up at once, so every round meets the same machine load
                try:
                    servers[name] = stack.enter_context(ManagedServer(spec_for(name, streams))).spec.url
                except RuntimeError as exc:
                    print(f"| {name} | {streams} | not run: {str(exc).splitlines()[0]} | | |", flush=True)
            for r in range(-1, args.rounds):  # round -1 warms every server up
                prompts = [build_prompt(encode, PROMPT_TOKENS, round_seed(0, r, "decode", i)) for i in range(streams)]
                for name, url in servers.items():
                    rate = asyncio.run(one_round(url, prompts, eos_ids, args.window_s if r >= 0 else 2.0))
                    if r >= 0:
                        rates[name].append(rate)
                        loads[name].append(os.getloadavg()[0])
        for name in servers:
            v = rates[name]
            print(f"| {name} | {streams} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} "
                  f"| {min(loads[name]):.1f}-{max(loads[name]):.1f} |", flush=True)


# ---- serve-path ----------------------------------------------------------------------------------

SERVE_PATH_DOC = """The HTTP path's CPU a token, apart from the decode step's (docs/CPU_DECODE.md, "The server's share").

    python -m bench serve-path [--streams 1 4] [--tokens 300] [--client light httpx]

A server in its own process runs the real app, worker and engine over the tiny test model, each tick
padded to --tick-ms by a sleep (no CPU), so the event loop thread's CPU can be read from
/proc/PID/task/PID/schedstat; the client (loadtest.client, in this process) reads its own thread time.
Prints ms of CPU a token frame for the loop and the client, between the 20th frame and the last 20.
"""


def paced_server(port: int, tick_s: float) -> None:
    """The paced server (serve-path with --serve-port): uvicorn on this process's main thread."""
    from mlxcel_py.models.cpu.blas import preload_blas

    preload_blas("auto")
    from mlxcel_py.config import resolve
    from mlxcel_py.flags import ServeFlags, build
    from mlxcel_py.engine import build_engine
    from mlxcel_py.engine.core.worker import EngineWorker
    from mlxcel_py.server.app import create_app
    from mlxcel_py.server.http.serving import bind_socket, event_loop_runner, make_server
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import tiny_model

    cfg = resolve("serve", build(ServeFlags, dict(port=port, parallel=4, ctx_size=16384, threads=1)), env={})
    model = tiny_model()
    engine = build_engine(cfg.engine, model)
    step = engine.step

    def paced(*args, **kwargs):
        began = time.perf_counter()
        out = step(*args, **kwargs)
        time.sleep(max(0.0, tick_s - (time.perf_counter() - began)))
        return out

    engine.step = paced
    worker = EngineWorker(engine).start()
    server = make_server(create_app(worker, model, cfg), cfg)
    event_loop_runner()(server.serve(sockets=[bind_socket("127.0.0.1", port)]))


async def path_cpu(url: str, pid: int, streams: int, tokens: int, light: bool) -> tuple[float, float, int]:
    """(loop ms, client ms) of CPU a frame, and the frames counted."""
    def loop_cpu() -> float:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9

    logs = [StreamLog() for _ in range(streams)]
    frames = lambda: sum(len(g.token_times) for g in logs)  # noqa: E731
    async with new_client() as client:
        body = completion_body("Hello world, the quick brown fox " * 2, tokens)
        tasks = [asyncio.create_task(light_stream_request(url + "/v1/completions", body, g) if light else
                                     stream_request(client, url + "/v1/completions", body, g)) for g in logs]
        for _ in range(6000):  # the first frames (request set-up) stay out of the count
            if frames() >= 20 * streams or all(g.ended for g in logs):
                break
            await asyncio.sleep(0.005)
        m0, c0, n0 = loop_cpu(), time.thread_time(), frames()
        while not all(g.ended for g in logs) and frames() < n0 + (tokens // 4) * streams:
            await asyncio.sleep(0.02)
        m1, c1, n1 = loop_cpu(), time.thread_time(), frames()
        await asyncio.gather(*tasks)
    errors = [g.error for g in logs if g.error]
    if errors or n1 <= n0:
        raise RuntimeError(f"no frames measured: {errors}")
    return 1000 * (m1 - m0) / (n1 - n0), 1000 * (c1 - c0) / (n1 - n0), n1 - n0


def serve_path_main() -> None:
    ap = argparse.ArgumentParser(description=SERVE_PATH_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--client", nargs="+", default=["light", "httpx"], choices=["light", "httpx"])
    ap.add_argument("--tick-ms", type=float, default=15.0)
    ap.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_port:
        return paced_server(args.serve_port, args.tick_ms / 1000)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench", "serve-path", "--serve-port", str(port),
                             "--tick-ms", str(args.tick_ms)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        for streams in args.streams:
            for client in args.client:
                loop_ms, client_ms, n = asyncio.run(path_cpu(f"http://127.0.0.1:{port}", proc.pid, streams,
                                                            args.tokens, client == "light"))
                print(f"{streams} stream(s), {client} client: loop {loop_ms:.3f} ms, client {client_ms:.3f} ms "
                      f"of CPU a frame ({n} frames; load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


# ---- models --------------------------------------------------------------------------------------

MODELS_DOC = """Several models behind one server: the time to first token of a cold model (its load included)
and of a resident one, and how two resident models share the cores while both decode.

    python -m bench models [--runs 3] [--tokens 48] [--model PATH]

Serves the model twice, as `a` and `b` (two engines over the same file), on 127.0.0.1 port 0.
Prints one line per measurement; nothing is asserted (numbers depend on the machine and its load).
"""


MODELS_PROMPT = "Write one sentence about the sea."


def _two_models(path: str):
    from mlxcel_py.config import resolve
    from mlxcel_py.flags import ServeFlags, build
    from mlxcel_py.models.cpu.blas import preload_blas
    from mlxcel_py.server.app import create_app
    from mlxcel_py.server.http.serving import bind_socket, make_server

    cfg = resolve("serve", build(ServeFlags, dict(port=0, model=(f"a={path}", f"b={path}"), log_level="warning")), env={})
    preload_blas(cfg.blas)
    app = create_app(None, None, cfg)
    sock = bind_socket("127.0.0.1", 0)
    server = make_server(app, cfg)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, app.state.registry


def _ttft(client: httpx.Client, model: str, tokens: int = 1) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, tokens) of one greedy streamed completion."""
    body = {"model": model, "prompt": MODELS_PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "cache_prompt": False, "ignore_eos": True}
    start, first, count = time.perf_counter(), None, 0
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = first or time.perf_counter()
                count += 1
    return (first or time.perf_counter()) - start, time.perf_counter() - start, count


def _decode_rate(client: httpx.Client, model: str, tokens: int) -> float:
    ttft, total, count = _ttft(client, model, tokens)
    return (count - 1) / (total - ttft) if count > 1 and total > ttft else 0.0


def models_main() -> None:
    from mlxcel_py.models import default_model_path

    parser = argparse.ArgumentParser(description=MODELS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    url, server, _ = _two_models(args.model or default_model_path())
    with httpx.Client(base_url=url, timeout=600) as client:
        cold, warm = [], []
        for _ in range(args.runs):
            cold.append(_ttft(client, "a")[0])  # loads a first
            warm += [_ttft(client, "a")[0] for _ in range(3)]
            client.post("/models/unload", json={"model": "a"}).raise_for_status()
        print(f"ttft cold (load included): median {statistics.median(cold):.2f} s  runs {[round(c, 2) for c in cold]}")
        print(f"ttft resident:             median {statistics.median(warm) * 1000:.0f} ms  runs "
              f"{[round(w * 1000) for w in warm]}")
        for name in ("a", "b"):
            client.post("/models/load", json={"model": name}).raise_for_status()
        _ttft(client, "a", 4), _ttft(client, "b", 4)  # warm both
        alone = statistics.median(_decode_rate(client, "a", args.tokens) for _ in range(args.runs))
        print(f"decode alone:        {alone:.1f} tok/s (model a, {args.tokens} tokens)")
        both = []
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(args.runs):
                both.append(list(pool.map(lambda m: _decode_rate(client, m, args.tokens), ["a", "b"])))
        a_rate = statistics.median(r[0] for r in both)
        b_rate = statistics.median(r[1] for r in both)
        print(f"decode both at once: a {a_rate:.1f} tok/s, b {b_rate:.1f} tok/s, sum {a_rate + b_rate:.1f} tok/s")
    server.should_exit = True


# ---- mixed-embeddings ----------------------------------------------------------------------------

MIXED_DOC = """A mixed load: four chat streams decoding while 32 embedding requests of 300 tokens arrive.

    python -m bench mixed-embeddings [--model M] [--streams 4] [--embeddings 32]
        [--tokens 300] [--parallel 8] [--json out.json]

One `serve` (default flags, --parallel 8: four slots decode, the others embed). Measured, in order:
- each embedding computed alone (one request at a time, nothing decoding);
- the contended figure: the streams' quiet inter-token p95 plus the time of one lone prefill piece of the
  chunk policy's contended size (512 tokens, an embedding of that length), i.e. what a tick holding one
  decode step and one full contended piece costs;
- the mixed run: the streams decoding, all embeddings sent at once; the worst stream's inter-token p95
  over the embeddings' span, against the figure; every embedding compared with its alone vector.
"""


CONTENDED_CHUNK = 512  # the policy's chunk while another sequence decodes (docs/CONTINUOUS_BATCHING.md)
QUIET_S = 5.0


async def embed(client: httpx.AsyncClient, url: str, text: str) -> tuple[np.ndarray, float, float]:
    """(vector, sent, done) of one /v1/embeddings request."""
    sent = time.perf_counter()
    reply = await client.post(url + "/v1/embeddings", json={"input": text, "encoding_format": "float"})
    reply.raise_for_status()
    return np.array(reply.json()["data"][0]["embedding"]), sent, time.perf_counter()


async def embed_alone(url: str, texts: list[str]) -> list[np.ndarray]:
    """Every text embedded alone, one request at a time."""
    async with httpx.AsyncClient(timeout=600) as client:
        return [(await embed(client, url, t))[0] for t in texts]


async def piece_ms(url: str, text: str, rounds: int = 3) -> float:
    """Median latency of embedding `text` alone (one prefill piece when it fits the chunk)."""
    times = []
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(rounds):
            _, sent, done = await embed(client, url, text)
            times.append((done - sent) * 1000)
    return float(np.median(times))


async def mixed(url: str, prompts: list[str], texts: list[str], eos_ids: frozenset[int],
                quiet_s: float) -> dict:
    """Streams decode; quiet window; then every embedding at once; streams run until the last is back."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        tasks = [asyncio.create_task(stream_request(client, url + "/v1/completions",
                                                    completion_body(p, 3000, eos_ids=eos_ids), log, changed))
                 for p, log in zip(prompts, logs)]
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: all(len(g.token_times) >= 2 for g in logs)), 600)
            quiet_start = time.perf_counter()
            await asyncio.sleep(quiet_s)
            quiet_end = time.perf_counter()
            got = await asyncio.gather(*(embed(client, url, t) for t in texts))
            if any(g.ended for g in logs):
                raise RuntimeError(f"a stream ended during the run: {[(g.finish_reason, g.error) for g in logs]}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    start, end = min(g[1] for g in got), max(g[2] for g in got)
    quiet = [percentile(itls_within(g.token_times, quiet_start, quiet_end), 95) * 1000 for g in logs]
    loaded = [percentile(itls_overlapping(g.token_times, start, end), 95) * 1000 for g in logs]
    return {"vectors": [g[0] for g in got], "quiet_p95_ms": quiet, "mixed_p95_ms": loaded,
            "embeddings_span_s": end - start}


def mixed_run(args: argparse.Namespace) -> dict:
    encode, eos_ids = load_encoder(args.model)
    texts = [build_prompt(encode, args.tokens, round_seed(0, 0, "embed", i)) for i in range(args.embeddings)]
    prompts = [build_prompt(encode, 32, round_seed(0, 0, "stream", i)) for i in range(args.streams)]
    spec = mlxcel_spec(Arm("ours"), args.parallel, args.model)
    with ManagedServer(spec, health_timeout_s=600) as server:
        url = server.spec.url
        asyncio.run(warm_up(url, encode, eos_ids, 0))
        t0 = time.perf_counter()
        solo = asyncio.run(embed_alone(url, texts))
        print(f"{len(texts)} embeddings alone: {time.perf_counter() - t0:.1f} s", flush=True)
        piece = asyncio.run(piece_ms(url, build_prompt(encode, CONTENDED_CHUNK, round_seed(0, 0, "piece"))))
        print(f"a lone {CONTENDED_CHUNK}-token piece: {piece:.0f} ms", flush=True)
        got = asyncio.run(mixed(url, prompts, texts, eos_ids, args.quiet_s))
    diffs = [float(np.abs(a - b).max()) for a, b in zip(got.pop("vectors"), solo)]
    figure = max(got["quiet_p95_ms"]) + piece
    return {**got, "piece_512_ms": piece, "contended_figure_ms": figure,
            "worst_mixed_p95_ms": max(got["mixed_p95_ms"]), "within_figure": max(got["mixed_p95_ms"]) <= figure,
            "max_abs_diff_vs_alone": max(diffs), "all_equal_alone": max(diffs) <= 1e-5}


def mixed_embeddings_main() -> None:
    ap = argparse.ArgumentParser(description=MIXED_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF or mlx-lm directory (default: the bundled model)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--embeddings", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--quiet-s", type=float, default=QUIET_S)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    # A SIGTERM (timeout, Ctrl-C's cousin) unwinds, so the server started here is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(machine(), flush=True)
    result = mixed_run(args)
    print(f"end: {machine()}")
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")


# ---- distributed ---------------------------------------------------------------------------------

DISTRIBUTED_DOC = """One process vs two tensor-parallel ranks on this machine (ring backend over loopback).

    python -m bench distributed                  # the ~180M random llama, then the tiny one
    python -m bench distributed --models tiny    # protocol overhead only
    OPENBLAS_NUM_THREADS=1 python -m bench distributed   # one core per process
    python -m bench distributed --ranks 2 --rank-threads 1  # one BLAS thread per rank

Each arm starts `mlxcel-py serve` (one plain process, or two ranks the way `mlx.launch
--backend ring` starts them), then measures, with medians over --reps runs: single-stream
decode tokens/s and ms per token (the server's own timings), a 512-token prefill's tokens/s,
and four concurrent streams' total tokens/s. Two ranks on one machine share its cores and
pay loopback all-reduces, so expect them slower here: the point of the numbers is the
overhead, not a speed-up (docs/DISTRIBUTED.md).
"""


# About TinyLlama's proportions at a sixth of its width: 16 layers, 16 heads, 4 kv heads.
MEDIUM = ScaledDims(hidden=1024, layers=16, heads=16, kv_heads=4, ffn=2816, context=4096, vocab=512)
GREEDY = {"temperature": 0.0}


def launch(model: str, ranks: int, folder: Path, threads: int = 0) -> tuple[list[subprocess.Popen], str]:
    port = free_port()
    hostfile = folder / f"hosts{ranks}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
    cmd = [str(Path(sys.executable).parent / "mlxcel-py"), "serve", "-m", model, "--port", str(port),
           "--no-prompt-cache", "--log-level", "warning"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    procs = []
    for rank in range(ranks):
        env = base if ranks == 1 else base | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        if threads and ranks > 1:  # ranks sharing one host's cores: split the BLAS threads
            env = env | {"OPENBLAS_NUM_THREADS": str(threads)}
        log = open(folder / f"arm{ranks}-rank{rank}.log", "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a rank exited during startup; see {folder}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return procs, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the server did not start in 300 s")


def _complete(url: str, prompt, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, **GREEDY}
    response = httpx.post(url + "/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def concurrent_tps(url: str, streams: int, max_tokens: int) -> float:
    out: list[int] = [0] * streams

    def _one(i: int) -> None:
        out[i] = _complete(url, f"Request {i}: the quick brown fox", max_tokens)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=_one, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out) / (time.perf_counter() - start)


def dist_measure(url: str, reps: int, long_prompt: list[int]) -> dict[str, float]:
    _complete(url, "warm up", 8)
    decode = [_complete(url, "The quick brown fox", 64)["timings"] for _ in range(reps)]
    prefill = [_complete(url, long_prompt, 1)["timings"] for _ in range(reps)]
    return {
        "decode tok/s": statistics.median(t["predicted_per_second"] for t in decode),
        "ms/token": statistics.median(t["predicted_per_token_ms"] for t in decode),
        "prefill 512 tok/s": statistics.median(t["prompt_per_second"] for t in prefill),
        "4 streams tok/s": statistics.median(concurrent_tps(url, 4, 48) for _ in range(reps)),
    }


def distributed_main() -> None:
    parser = argparse.ArgumentParser(description=DISTRIBUTED_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="medium,tiny", help="comma list of: medium, tiny")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", default="1,2", help="comma list of rank counts to run")
    parser.add_argument("--rank-threads", type=int, default=0,
                        help="OPENBLAS_NUM_THREADS for each rank of a multi-rank arm (0: OpenBLAS's default)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mlxcel-bench-dist-"))
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny

    paths = {"medium": str(write_scaled_gguf(folder / "medium.gguf", MEDIUM)),
             "tiny": str(tiny.write_tiny_gguf(folder / "tiny.gguf"))}
    prompt = [3 + i % 390 for i in range(512)]  # 512 plain token ids (both vocabularies have 400)
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; logs in {folder}")
    rows = []
    for name in args.models.split(","):
        for ranks in (int(r) for r in args.ranks.split(",")):
            procs, url = launch(paths[name], ranks, folder, args.rank_threads)
            try:
                rows.append((name, ranks, dist_measure(url, args.reps, prompt)))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(60)
            print(f"  {name} x{ranks}: {rows[-1][2]}", flush=True)
    keys = list(rows[0][2])
    print("\n| model | ranks | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, ranks, values in rows:
        print(f"| {name} | {ranks} | " + " | ".join(f"{values[k]:.1f}" for k in keys) + " |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
