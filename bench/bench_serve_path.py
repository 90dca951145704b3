"""The HTTP path's CPU a token, apart from the decode step's (docs/CPU_DECODE.md, "The server's share").

    PYTHONPATH=$PWD .venv/bin/python bench/bench_serve_path.py [--streams 1 4] [--tokens 300] [--client light httpx]

A server in its own process runs the real app, worker and engine over the tiny test model, each tick
padded to --tick-ms by a sleep (no CPU), so the event loop thread's CPU can be read from
/proc/PID/task/PID/schedstat; the client (loadtest.client, in this process) reads its own thread time.
Prints ms of CPU a token frame for the loop and the client, between the 20th frame and the last 20.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def serve(port: int, tick_s: float) -> None:
    """The paced server (this script with --serve-port): uvicorn on this process's main thread."""
    from mlxcel_py.models.cpu.blas import preload_blas

    preload_blas("auto")
    from mlxcel_py.config import resolve
    from mlxcel_py.engine import build_engine
    from mlxcel_py.engine.core.worker import EngineWorker
    from mlxcel_py.server.app import create_app
    from mlxcel_py.server.http.serving import bind_socket, event_loop_runner, make_server
    from tiny import tiny_model

    cfg = resolve("serve", env={}, port=port, parallel=4, ctx_size=16384, threads=1)
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


async def measure(url: str, pid: int, streams: int, tokens: int, light: bool) -> tuple[float, float, int]:
    """(loop ms, client ms) of CPU a frame, and the frames counted."""
    from mlxcel_py.loadtest.client import StreamLog, completion_body, light_stream_request, new_client, stream_request

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--client", nargs="+", default=["light", "httpx"], choices=["light", "httpx"])
    ap.add_argument("--tick-ms", type=float, default=15.0)
    ap.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_port:
        return serve(args.serve_port, args.tick_ms / 1000)
    import httpx

    from mlxcel_py.loadtest.servers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-port", str(port), "--tick-ms", str(args.tick_ms)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        for streams in args.streams:
            for client in args.client:
                loop_ms, client_ms, n = asyncio.run(measure(f"http://127.0.0.1:{port}", proc.pid, streams,
                                                            args.tokens, client == "light"))
                print(f"{streams} stream(s), {client} client: loop {loop_ms:.3f} ms, client {client_ms:.3f} ms "
                      f"of CPU a frame ({n} frames; load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
