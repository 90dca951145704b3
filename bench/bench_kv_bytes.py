"""Resident KV bytes per token, ours against llama-server, same model and context, one run.

Usage: bench/bench_kv_bytes.py [--gguf PATH] [--prompt 2048] [--ctx 16384] [--parallel 4] [--types f16 q8_0]
Ours (each type in a fresh process, the engine `serve` builds, in process): the KV arrays' bytes while
the long row decodes (the engine's own rows: their resident pages, read from /proc/self/smaps), divided
by the row's positions, and the process's RSS growth over the request (after mx.clear_cache()).
llama-server (`-c CTX -np N -t 2 -ctk T -ctv T -lv 4`, `-fa on` for a quantized V): the KV buffer its
log states (allocated and cleared for every cell at startup) over the context, and its RSS growth
over the same prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mlxcel_py.models.footprint import mapped_resident_bytes, resident_bytes as rss  # noqa: E402

LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"  # scripts/build_llama_server.sh


def kv_bytes(runner) -> tuple[int, int]:
    """(bytes, positions) of the decode batch's KV."""
    from mlxcel_py.engine.runner.kv_rows import RowKV

    batch = runner._batch
    if isinstance(batch, RowKV):
        return mapped_resident_bytes({b.ctypes.data for b in batch.keys + batch.values}), max(batch.lengths)
    parts = [p for layer in batch for held in (layer.keys, layer.values)
             for p in (held if isinstance(held, tuple) else (held,))]
    return sum(p.nbytes for p in parts), int(batch[0]._idx)


def ours(path: str, kv_type: str, prompt: int, ctx: int, parallel: int) -> dict:
    import mlx.core as mx

    from mlxcel_py.config import resolve
    from mlxcel_py.engine import Request, SamplingParams, build_engine
    from mlxcel_py.models import load_model

    lm = load_model(path, threads=2)
    types = {} if kv_type == "default" else {"cache_type_k": kv_type, "cache_type_v": kv_type}
    engine = build_engine(resolve("serve", env={}, parallel=parallel, ctx_size=ctx, **types).engine, lm)
    greedy = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    run(engine, Request("warm", tuple(range(5, 40)), greedy, cache_prompt=False))
    mx.clear_cache()
    before = rss()
    seen = []
    execute = engine.runner.execute
    engine.runner.execute = lambda step: (execute(step), step.decode and not seen and seen.append(kv_bytes(engine.runner)))[0]
    ids = tuple(random.Random(0).randrange(5, 1000) for _ in range(prompt))
    run(engine, Request("long", ids, greedy))
    mx.clear_cache()
    nbytes, positions = seen[0]
    return {"server": "ours", "type": kv_type, "kv_bytes": nbytes, "positions": positions,
            "bytes_per_token": nbytes / positions, "rss_growth_per_token": (rss() - before) / (prompt + 8),
            "stated_bytes_per_token": engine.scheduler.prompt_cache.bytes_per_token
            if engine.scheduler.prompt_cache else None}


def run(engine, request) -> None:
    engine.add_request(request)
    for _ in range(100_000):
        if not engine.has_work():
            return
        engine.step()


def llama(path: str, kv_type: str, prompt: int, ctx: int, parallel: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
        post(base, list(range(5, 40)))
        before = rss(str(proc.pid))
        ids = [random.Random(0).randrange(5, 1000) for _ in range(prompt)]
        post(base, ids)
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


def post(base: str, ids: list[int]) -> None:
    body = json.dumps({"prompt": ids, "n_predict": 8, "temperature": 0, "cache_prompt": True}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=900).read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
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
        fn = ours if a.child[0] == "ours" else llama
        print(json.dumps(fn(path, a.child[1], a.prompt, a.ctx, a.parallel)))
        return
    for kv_type in ["default", *a.types]:
        for server in ("ours", "llama"):
            if server == "llama" and kv_type == "default":
                continue
            cmd = [sys.executable, __file__, "--gguf", path, "--prompt", str(a.prompt), "--ctx", str(a.ctx),
                   "--parallel", str(a.parallel), "--child", server, kv_type]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            print(out, flush=True)


if __name__ == "__main__":
    main()
