"""One process vs two tensor-parallel ranks on this machine (ring backend over loopback).

    .venv/bin/python bench/bench_distributed.py                  # the ~180M random llama, then the tiny one
    .venv/bin/python bench/bench_distributed.py --models tiny    # protocol overhead only
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_distributed.py   # one core per process
    .venv/bin/python bench/bench_distributed.py --ranks 2 --rank-threads 1  # one BLAS thread per rank

Each arm starts `mlxcel-py serve` (one plain process, or two ranks the way `mlx.launch
--backend ring` starts them), then measures, with medians over --reps runs: single-stream
decode tokens/s and ms per token (the server's own timings), a 512-token prefill's tokens/s,
and four concurrent streams' total tokens/s. Two ranks on one machine share its cores and
pay loopback all-reduces, so expect them slower here: the point of the numbers is the
overhead, not a speed-up (docs/DISTRIBUTED.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlxcel_py.loadtest.scaled import ScaledDims, write_scaled_gguf  # noqa: E402

# About TinyLlama's proportions at a sixth of its width: 16 layers, 16 heads, 4 kv heads.
MEDIUM = ScaledDims(hidden=1024, layers=16, heads=16, kv_heads=4, ffn=2816, context=4096, vocab=512)
GREEDY = {"temperature": 0.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def complete(url: str, prompt, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, **GREEDY}
    response = httpx.post(url + "/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def concurrent_tps(url: str, streams: int, max_tokens: int) -> float:
    out: list[int] = [0] * streams

    def run(i: int) -> None:
        out[i] = complete(url, f"Request {i}: the quick brown fox", max_tokens)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out) / (time.perf_counter() - start)


def measure(url: str, reps: int, long_prompt: list[int]) -> dict[str, float]:
    complete(url, "warm up", 8)
    decode = [complete(url, "The quick brown fox", 64)["timings"] for _ in range(reps)]
    prefill = [complete(url, long_prompt, 1)["timings"] for _ in range(reps)]
    return {
        "decode tok/s": statistics.median(t["predicted_per_second"] for t in decode),
        "ms/token": statistics.median(t["predicted_per_token_ms"] for t in decode),
        "prefill 512 tok/s": statistics.median(t["prompt_per_second"] for t in prefill),
        "4 streams tok/s": statistics.median(concurrent_tps(url, 4, 48) for _ in range(reps)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="medium,tiny", help="comma list of: medium, tiny")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", default="1,2", help="comma list of rank counts to run")
    parser.add_argument("--rank-threads", type=int, default=0,
                        help="OPENBLAS_NUM_THREADS for each rank of a multi-rank arm (0: OpenBLAS's default)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mlxcel-bench-dist-"))
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
                rows.append((name, ranks, measure(url, args.reps, prompt)))
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


if __name__ == "__main__":
    main()
