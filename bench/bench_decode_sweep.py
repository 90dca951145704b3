"""One-stream decode's products against the memory bus, swept over the row width (the hidden size).

Usage: .venv/bin/python bench/bench_decode_sweep.py [--hidden 1536 2048 2560 3072 3584 4096] [--ffn 8960]
                                                    [--layers 4] [--threads 1 2] [--steps 10] [--context 32]
                                                    [--out DIR] [--keep] [--bw-mib 1024]
       (or `python -m bench decode-sweep ...`)

For each hidden size it writes a llama-shaped Q4_K_M file with bench/make_synthetic_gguf.py's `write`
(heads of 128 columns, a quarter of them KV heads; into `--out`, by default a temporary directory that
is deleted after unless `--keep`), loads it and profiles FusedDecoder's batch-1 step per product kind as
`bench_decode_step.py --profile` does (the step with only that kind's phases, less the step with none).
Columns: `hidden`; `kind` (qkv, o, gate_up, down, head; `step` is the whole step, the call included);
`types` (the kind's block types in the file); `MB` (weight bytes the kind reads a step, every layer);
`ms` (best wall); `GB/s` (MB / ms); `of bus` (GB/s over the machine's read bandwidth at that thread
count, measured at the start: numpy `a.sum()` over a `--bw-mib` float32 array, best of 3, one thread
or the threads each summing their share). Defaults (6 sizes, 4 layers, 10 steps, threads 1 and 2) take
about 30 s on 2 cores (a Zen 4 KVM guest); the files, ~0.2-0.55 GB each, exist one at a time.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from bench_decode_step import load_model, profile  # noqa: E402  (its import sets up the paths and BLAS)
from make_synthetic_gguf import write  # noqa: E402

from mlxcel_py.models.gguf_file import read_gguf  # noqa: E402

PRODUCTS = {  # product kind (bench_decode_step.KINDS) -> the gguf tensors (blk.N.<name>) it reads
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni")


def cpu_line() -> str:
    """lscpu's model name and which of VECTOR_FLAGS the CPU has."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", "?").strip()
    flags = set(fields.get("Flags", "").split())
    have = " ".join(f"{f}{'+' if f in flags else '-'}" for f in VECTOR_FLAGS)
    return f"{model}, {os.cpu_count()} CPUs, {have}"


def read_bandwidth(threads: int, mib: int = 1024, reps: int = 3) -> float:
    """GB/s of a STREAM-like read: `a.sum()` over a float32 array of `mib` MiB, best of `reps`; with
    threads > 1 each thread sums its contiguous share at once (numpy releases the GIL). One untimed
    pass first (thread start-up, frequency ramp)."""
    a = np.ones(mib * 2**20 // 4, np.float32)  # written once, so every page is resident
    parts = np.array_split(a, threads)
    best = float("inf")
    for rep in range(reps + 1):
        if threads == 1:
            t = time.perf_counter()
            a.sum()
            best = best if rep == 0 else min(best, time.perf_counter() - t)
            continue
        go = threading.Barrier(threads + 1)

        def run(part):
            go.wait()
            part.sum()

        workers = [threading.Thread(target=run, args=(p,)) for p in parts]
        for w in workers:
            w.start()
        go.wait()
        t = time.perf_counter()
        for w in workers:
            w.join()
        best = best if rep == 0 else min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def product_bytes(path: Path) -> dict:
    """{kind: (bytes read a step, "Q4_K+Q6_K")} from the file's tensors; head is output or the tied embedding."""
    tensors = read_gguf(path).tensors
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    named = {kind: [t for t in tensors.values() if t.name.split(".")[-2] in names and t.name.startswith("blk.")]
             for kind, names in PRODUCTS.items()}
    named["head"] = [tensors[head]]
    return {kind: (sum(t.data.nbytes for t in ts), "+".join(sorted({t.type_name for t in ts})))
            for kind, ts in named.items()}


def sweep_one(path: Path, threads: list[int], steps: int, context: int) -> list[tuple]:
    """Rows (threads, kind, types, bytes, ms) of one file, the products then the whole step."""
    sizes, rows = product_bytes(path), []
    lm = load_model(str(path), threads=max(threads))
    for t in threads:
        got = profile(lm, path, 1, t, steps, context)
        base = got["none"][0]
        for kind, (nbytes, types) in sizes.items():
            rows.append((t, kind, types, nbytes, got[kind][0] - base))
        rows.append((t, "step", "all", sum(b for b, _ in sizes.values()), got["all"][0]))
    del lm
    gc.collect()
    return rows


HEADER = f"{'hidden':>6} {'thr':>3} {'kind':8s} {'types':14s} {'MB':>8} {'ms':>8} {'GB/s':>7} {'of bus':>6}"


def row_line(hidden: int, row: tuple, bus: dict) -> str:
    t, kind, types, nbytes, ms = row
    gbs = nbytes / (ms * 1e6) if ms > 0 else float("nan")
    return (f"{hidden:6d} {t:3d} {kind:8s} {types:14s} {nbytes / 1e6:8.1f} {ms:8.2f} {gbs:7.2f} "
            f"{gbs / bus[t]:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[1536, 2048, 2560, 3072, 3584, 4096])
    ap.add_argument("--ffn", type=int, default=8960)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--out", default=None, help="folder for the files (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the files (a temporary folder too)")
    ap.add_argument("--bw-mib", type=int, default=1024, help="the bandwidth probe's array, MiB")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="decode-sweep-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {cpu_line()}")
    all_threads = os.cpu_count() or 1
    bus = {t: read_bandwidth(t, args.bw_mib) for t in sorted({1, all_threads, *args.threads})}
    print("read bandwidth: " + ", ".join(f"{bus[t]:.1f} GB/s on {t} thread(s)" for t in sorted(bus)))
    print(f"llama Q4_K_M, {args.layers} layers, ffn {args.ffn}, batch 1, KV {args.context} tokens, "
          f"best of {args.steps} steps; products less the call, the step with it")
    print(HEADER, flush=True)
    made = []
    try:
        for hidden in args.hidden:
            heads = max(1, hidden // 128)
            path = out / f"sweep-h{hidden}-l{args.layers}-f{args.ffn}.gguf"
            write(path, args.layers, hidden, args.ffn, heads, max(1, heads // 4))
            made.append(path)
            for row in sweep_one(path, args.threads, args.steps, args.context):
                print(row_line(hidden, row, bus), flush=True)
            if not args.keep:
                path.unlink()
    finally:
        if not args.keep:
            for path in made:
                path.unlink(missing_ok=True)
            if not args.out:
                shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
