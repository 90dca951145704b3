"""The CPU decode step in process, one mode a subcommand:

    decode-step   the CPU decoder's step alone, per decoder class; --profile: per phase kind; --hold
    decode-sweep  one stream's step products per row width (hidden size) against the memory bus
    arch-decode   per architecture: mlx-lm's batched forward against the numba CPU step; --prefill-ab

MLX reads its BLAS once, when it loads: the BLAS named by $MLXCEL_BLAS (default auto) is preloaded below,
before anything imports MLX. tests/ is on the path for its model fixtures (test_cpu_decode, tiny).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.peers import ROOT

sys.path.insert(0, str(ROOT / "tests"))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

import numba  # noqa: E402
import numpy as np  # noqa: E402
from test_cpu_decode import make_batch, prompt  # noqa: E402

from bench.synthetic import write  # noqa: E402
from mlxcel_py.models import default_model_path, load_model  # noqa: E402
from mlxcel_py.models.cpu.native import NativeDecoder, _ModuleBlocks, blocks_of  # noqa: E402
from mlxcel_py.models.cpu.fused_step import FusedDecoder  # noqa: E402
from mlxcel_py.models.gguf_blocks import has_blocks  # noqa: E402
from mlxcel_py.models.gguf_file import read_gguf  # noqa: E402


# ---- decode-step ---------------------------------------------------------------------------------

DECODE_STEP_DOC = """The CPU decoder's step alone, per decoder class: ms a step at batch 1 and 4, on 1 and 2 threads.

Usage: python -m bench decode-step [--model PATH] [--batch 1 4] [--threads 1 2]
                                   [--steps 25] [--context 32] [--profile]
                                   [--hold --start-at EPOCH]

Classes: `native` is NativeDecoder (one numba call per product, Python between them), `fused`
FusedDecoder (the whole step in one numba call, quant/step.py), over the same block weights.
Each row's KV holds `--context` prompt tokens. The classes' steps are interleaved within one
process so that a shared machine's load falls on both alike; per class it prints the best and
the median wall time and the best calling-thread CPU time (with one thread, the step's compute
without the time other processes took; with two, the calling thread's share).

`--profile`: where FusedDecoder's step goes, per phase kind (quant/step.py): the step run with only
that kind's phases (every layer's), less the step with none (the call's Python and numba dispatch),
best wall and best thread-CPU time; every step decodes at the same KV position (context + 1).

`--hold`: FusedDecoder's whole step alone at that fixed position, median and best wall and thread CPU;
with `--start-at EPOCH` the timed steps begin at that time, so that two checkouts (main and a branch,
each with its own PYTHONPATH) started together measure in the same window of a shared machine's load."""


def step_times(lm, path, batch: int, threads: int, steps: int, context: int) -> dict:
    """{class: (best wall ms, median wall ms, best thread-CPU ms)} for one batch size and thread count."""
    blocks = _ModuleBlocks() if has_blocks(lm.model) else blocks_of(lm.model, path)
    decoders = {name: cls(lm.model, blocks, threads)
                for name, cls in (("native", NativeDecoder), ("fused", FusedDecoder))}
    caches = {name: make_batch(lm.model, [prompt(context, i) for i in range(batch)]) for name in decoders}
    tokens, wall, cpu = [5] * batch, {n: [] for n in decoders}, {n: [] for n in decoders}
    for name, decoder in decoders.items():
        decoder(tokens, caches[name])  # compile / warm
    for _ in range(steps):
        for name, decoder in decoders.items():
            t, c = time.perf_counter(), time.thread_time()
            decoder(tokens, caches[name])
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.thread_time() - c)
    return {n: (1e3 * min(wall[n]), 1e3 * statistics.median(wall[n]), 1e3 * min(cpu[n])) for n in decoders}


def _subset(phases, tasks, kinds) -> tuple:
    """The plan's phases of `kinds` only, their tasks renumbered: (phases, tasks)."""
    out_phases, out_tasks = [], []
    for kind, layer, _, count, row in phases:  # an ATTEND phase's count is set per step (step_phases)
        if kind in kinds:
            out_phases.append((kind, layer, len(out_tasks), count, len(out_tasks)))
            out_tasks += [tuple(t) for t in tasks[row : row + count]]
    return np.array(out_phases, np.int64).reshape(-1, 5), np.array(out_tasks, np.int64).reshape(-1, 3)


def profile(lm, path, batch: int, threads: int, steps: int, context: int) -> dict:
    """{phase kind name: (best wall ms, best thread-CPU ms)} of FusedDecoder's step, 'all' and 'none' included."""
    decoder, caches, tokens, rewind = _held_decoder(lm, path, batch, threads, context)
    phases, weights = decoder._phases, decoder._weights
    plans = {"all": set(range(len(KINDS))), "none": set()} | {name: {k} for k, name in enumerate(KINDS)}
    plans = {name: _subset(phases, weights[0], kinds) for name, kinds in plans.items()}
    wall, cpu = {n: [] for n in plans}, {n: [] for n in plans}
    for rep in range(steps + 1):
        for name, (ph, tasks) in plans.items():
            decoder._phases, decoder._weights = ph, (tasks, *weights[1:])
            t, c = time.perf_counter(), time.thread_time()
            decoder(tokens, caches)
            if rep:  # the first round warms each plan
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.thread_time() - c)
            rewind()  # back to the same position
    decoder._phases, decoder._weights = phases, weights
    return {n: (1e3 * min(wall[n]), 1e3 * min(cpu[n])) for n in plans}


def held_step(lm, path, batch: int, threads: int, steps: int, context: int, start_at: float) -> tuple:
    """(median wall, best wall, median CPU, best CPU) ms of FusedDecoder's step at one fixed KV position."""
    decoder, caches, tokens, rewind = _held_decoder(lm, path, batch, threads, context)
    while time.time() < start_at:
        time.sleep(0.01)
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.thread_time()
        decoder(tokens, caches)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        rewind()
    return tuple(1e3 * f(v) for v in (wall, cpu) for f in (statistics.median, min))


def _held_decoder(lm, path, batch: int, threads: int, context: int) -> tuple:
    """(FusedDecoder, caches, tokens, rewind): rewind() puts every cache back at the first step's position."""
    blocks = _ModuleBlocks() if has_blocks(lm.model) else blocks_of(lm.model, path)
    decoder = FusedDecoder(lm.model, blocks, threads)
    caches, tokens = make_batch(lm.model, [prompt(context, i) for i in range(batch)]), [5] * batch
    decoder(tokens, caches)  # the decoder's own KV buffers from here on
    keep = [(c._idx, c.offset) for c in caches]

    def rewind():
        for cache, (idx, offset) in zip(caches, keep):
            cache._idx, cache.offset = idx, offset

    for _ in range(3):
        decoder(tokens, caches)
        rewind()
    return decoder, caches, tokens, rewind


KINDS = ("norm1", "qkv", "rope+kv", "attend", "quant_attn", "o", "norm2", "gate_up", "silu", "down", "final", "head")


def decode_step_main() -> None:
    ap = argparse.ArgumentParser(description=DECODE_STEP_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--profile", action="store_true", help="FusedDecoder's step per phase kind")
    ap.add_argument("--hold", action="store_true", help="FusedDecoder's whole step at a fixed KV position")
    ap.add_argument("--start-at", type=float, default=0.0, help="with --hold: time.time() to start timing at")
    args = ap.parse_args()
    path = Path(args.model or default_model_path())
    lm = load_model(args.model, threads=max(args.threads))
    print(f"{path.name}, KV {args.context} tokens a row; ms a step (best / median wall, best thread CPU)")
    for batch in args.batch:
        for threads in args.threads:
            if args.hold:
                med, best, cmed, cbest = held_step(lm, path, batch, threads, args.steps, args.context, args.start_at)
                print(f"B={batch} threads={threads} fused, held: {med:.2f} / {best:.2f} ms wall (median / best), "
                      f"{cmed:.2f} / {cbest:.2f} ms cpu", flush=True)
                continue
            if args.profile:
                got = profile(lm, path, batch, threads, args.steps, args.context)
                base_wall, base_cpu = got.pop("none")
                print(f"B={batch} threads={threads} whole step {got['all'][0]:.2f} ms wall, {got['all'][1]:.2f} cpu; "
                      f"call alone {base_wall:.2f} wall, {base_cpu:.2f} cpu; per kind, less the call:")
                for name in KINDS:
                    print(f"  {name:10s} {got[name][0] - base_wall:7.2f} ms wall {got[name][1] - base_cpu:7.2f} ms cpu", flush=True)
                continue
            for name, (best, median, cpu) in step_times(lm, path, batch, threads, args.steps, args.context).items():
                print(f"B={batch} threads={threads} {name:6s}: {best:7.2f} / {median:7.2f} ms wall, {cpu:7.2f} ms cpu", flush=True)


# ---- decode-sweep --------------------------------------------------------------------------------

DECODE_SWEEP_DOC = """One-stream decode's products against the memory bus, swept over the row width (the hidden size).

Usage: python -m bench decode-sweep [--hidden 1536 2048 2560 3072 3584 4096] [--ffn 8960]
                                    [--layers 4] [--threads 1 2] [--steps 10] [--context 32]
                                    [--out DIR] [--keep] [--bw-mib 1024]

For each hidden size it writes a llama-shaped Q4_K_M file with bench/synthetic.py's `write`
(heads of 128 columns, a quarter of them KV heads; into `--out`, by default a temporary directory that
is deleted after unless `--keep`), loads it and profiles FusedDecoder's batch-1 step per product kind as
`decode-step --profile` does (the step with only that kind's phases, less the step with none).
Columns: `hidden`; `kind` (qkv, o, gate_up, down, head; `step` is the whole step, the call included);
`types` (the kind's block types in the file); `MB` (weight bytes the kind reads a step, every layer);
`ms` (best wall); `GB/s` (MB / ms); `of bus` (GB/s over the machine's read bandwidth at that thread
count, measured at the start: numpy `a.sum()` over a `--bw-mib` float32 array, best of 3, one thread
or the threads each summing their share). Defaults (6 sizes, 4 layers, 10 steps, threads 1 and 2) take
about 30 s on 2 cores (a Zen 4 KVM guest); the files, ~0.2-0.55 GB each, exist one at a time.
"""


PRODUCTS = {  # product kind (KINDS) -> the gguf tensors (blk.N.<name>) it reads
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

        def _sum_part(part):
            go.wait()
            part.sum()

        workers = [threading.Thread(target=_sum_part, args=(p,)) for p in parts]
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


def decode_sweep_main() -> None:
    ap = argparse.ArgumentParser(description=DECODE_SWEEP_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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


# ---- arch-decode ---------------------------------------------------------------------------------

ARCH_DECODE_DOC = """Decode A/B per architecture, in process: mlx-lm's batched forward against the numba CPU step.

    python -m bench arch-decode [--steps 16] [--rows 1 4] [--threads 1] [--prefill 256] [--prefill-ab 2048]

For each architecture (llama, qwen2, qwen3, gemma3, phi3): a random float32 model of one shape
(12 layers, hidden 640, ffn 2048, vocab 32,768; gemma3 with its 4 x 256 heads, 1 KV head and a
window of 512 on five layers of six, the others 10 x 64 heads and 2 KV heads; ~100M parameters) built
from mlx-lm's own classes, then from identical prefilled caches (`--prefill` tokens a row) `--steps`
greedy decode steps each way. Prints ms per step and tokens/s, and the speed-up. Also the tiny GGUF
fixtures (tests/fixtures/gguf), where the step's fixed costs dominate. `--prefill-ab N`: one N-token
prefill per synthetic model through mlx-lm without and with the numpy prefill kernels.
"""


SHAPE = dict(hidden_size=640, num_hidden_layers=12, intermediate_size=2048, vocab_size=32768,
             rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True)
PER_ARCH = {
    "llama": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=10000.0),
    "qwen2": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=1e6),
    "qwen3": dict(num_attention_heads=10, num_key_value_heads=2, head_dim=64, rope_theta=1e6),
    "gemma3_text": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                        sliding_window_pattern=6, query_pre_attn_scalar=256, rope_theta=1e6),
    "phi3": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=10000.0),
}


def synthetic_model(arch: str):
    import mlx.core as mx
    from mlxcel_py.models.gguf_fixups import _full_kv_caches

    module = importlib.import_module(f"mlx_lm.models.{arch}")
    args = module.ModelArgs.from_dict({"model_type": arch, **SHAPE, **PER_ARCH[arch]})
    model = module.Model(args)
    if arch == "gemma3_text":
        model.tie_word_embeddings = True
        model.pop("lm_head")
        _full_kv_caches(model)  # as the GGUF loader does: a KVCache and a window mask per layer
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def time_steps(step, tokens, steps: int) -> float:
    """Seconds per step (after one warm-up step), greedy on the step's own logits."""
    import mlx.core as mx

    tokens = np.array(step(tokens)).argmax(-1).tolist()
    start = time.perf_counter()
    for _ in range(steps):
        logits = step(tokens)
        mx.eval(logits)
        tokens = np.array(logits).argmax(-1).tolist()
    return (time.perf_counter() - start) / steps


def arch_ab(name: str, model, rows: int, prefill: int, steps: int, threads: int) -> None:
    import mlx.core as mx

    from mlxcel_py.models.cpu.decoder import decoder_for
    from mlxcel_py.models.cpu.prefill_kernels import kernels_for

    decoder = decoder_for(model, threads)
    assert decoder is not None, name
    prompts = [prompt(prefill - 7 * r, r) for r in range(rows)]
    with kernels_for(model):  # the numpy prefill kernels: the caches only
        theirs, ours = make_batch(model, prompts), make_batch(model, prompts)
    first = [p[-1] for p in prompts]
    mlx_s = time_steps(lambda t: model(mx.array(t)[:, None], cache=theirs)[:, -1, :], first, steps)
    ours_s = time_steps(lambda t: decoder(t, ours), first, steps)
    print(f"{name:14s} rows {rows}: mlx-lm {mlx_s * 1e3:7.1f} ms/step ({rows / mlx_s:6.1f} tok/s)  "
          f"numba step {ours_s * 1e3:7.1f} ms/step ({rows / ours_s:6.1f} tok/s)  x{mlx_s / ours_s:.2f}", flush=True)


def prefill_ab(arch: str, model, tokens: int) -> None:
    """One prefill of `tokens` tokens (one piece, a fresh cache) through mlx-lm, without and with the
    numpy prefill kernels; logits compared."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.models.cpu.prefill_kernels import kernels_for

    ids = mx.array([prompt(tokens, 9)])

    def once():
        start = time.perf_counter()
        out = model(ids, cache=make_prompt_cache(model))[:, -1]
        mx.eval(out)
        return time.perf_counter() - start, np.array(out)

    plain, want = once()
    with kernels_for(model):
        fast, got = once()
    print(f"{arch}-100M prefill {tokens}: mlx-lm {plain:6.2f} s, with the numpy kernels {fast:6.2f} s  "
          f"x{plain / fast:.2f} (last logits within {float(np.abs(got - want).max()):.1e})", flush=True)


def arch_decode_main() -> None:
    parser = argparse.ArgumentParser(description=ARCH_DECODE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--archs", nargs="+", default=list(PER_ARCH))
    parser.add_argument("--no-fixtures", action="store_true")
    parser.add_argument("--prefill-ab", type=int, default=0, help="also time one prefill of this many tokens")
    opts = parser.parse_args()
    from mlxcel_py.models.cpu.blas import loaded_blas, set_blas_threads

    set_blas_threads(opts.threads)

    print(f"BLAS {loaded_blas().name} {loaded_blas().note}; cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; threads {opts.threads}, "
          f"prefill {opts.prefill} tokens a row, {opts.steps} steps")
    for arch in opts.archs:
        model = synthetic_model(arch)
        for rows in opts.rows:
            arch_ab(f"{arch}-100M", model, rows, opts.prefill, opts.steps, opts.threads)
        if opts.prefill_ab:
            prefill_ab(arch, model, opts.prefill_ab)
        del model
    if opts.no_fixtures:
        return
    for name in ("llama-f16", "qwen2-f16", "qwen3-f16", "gemma3-f16", "phi3long-f16"):
        lm = load_model(str(ROOT / "tests/fixtures/gguf" / f"{name}.gguf"), threads=opts.threads, cpu_weights="f32")
        for rows in opts.rows:
            arch_ab(name, lm.model, rows, 64, opts.steps, opts.threads)


# ---- roofline ------------------------------------------------------------------------------------

ROOFLINE_DOC = """This machine's limits, and each model's decode and prefill as a fraction of them.

Usage: python -m bench roofline [--models A.gguf ...] [--threads 2] [--context 512] [--steps 20]
       [--prefill-tokens 512] [--bw-mib 1024]

Limits (each the best of a few runs, on 1 thread and on `--threads`):
- read: a float32 sum over `--bw-mib` MiB, each thread its contiguous share (`read_bandwidth`);
- triad: STREAM's a = b + s * c over three arrays of `--bw-mib` / 3 MiB, each thread its share, counted
  as STREAM does (three arrays' bytes a pass);
- float32 products: numpy's BLAS sgemm of 2,048 x 2,048 matrices (GFLOP/s);
- int8 products: the repacked Q4_K kernel (quant/kquant_r8.py) over 64 int8 input rows, its weights in
  L2 (one thread's MACs a second; the figure for more threads is that times the threads, the kernel
  being compute-bound there).
Per model (default: the default model):
- decode: one sequence's decode step through the engine's runner (the server's path, its own KV rows)
  after a `--context`-token prompt, the median of `--steps`: the bytes it reads a token (every weight product's bytes in the file, the LM head's included,
  and the context's float32 K/V) over the read bandwidth give the bus's tok/s; the step's tok/s as a
  fraction of it (the goal: 0.8 and over);
- prefill: a `--prefill-tokens` prompt through the engine's runner (rows of the fused step, as
  `prefill --routes`): its MACs (every layer's weights a token, and the causal attention's QK and PV)
  a second as a fraction of the int8 peak.
"""


@numba.njit(parallel=True, fastmath=True)
def _triad(a, b, c, s):  # pragma: no cover - jitted
    """a = b + s * c, numba's threads each a contiguous share."""
    for i in numba.prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


def triad_bandwidth(threads: int, mib: int = 1024, reps: int = 3) -> float:
    """GB/s of STREAM's triad a = b + s * c (float32, three arrays of `mib` / 3 MiB; three arrays'
    bytes a pass, as STREAM counts), on `threads` of numba's threads, best of `reps` after an untimed pass."""
    n = mib * 2**20 // 12
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32)
    numba.set_num_threads(threads)
    best = float("inf")
    for rep in range(reps + 1):
        t = time.perf_counter()
        _triad(a, b, c, np.float32(3.0))
        best = best if rep == 0 else min(best, time.perf_counter() - t)
    return 3 * a.nbytes / best / 1e9


def sgemm_gflops(threads: int, n: int = 2048, reps: int = 3) -> float:
    """GFLOP/s of numpy's BLAS sgemm of n x n float32 matrices on `threads` BLAS threads."""
    from mlxcel_py.models.cpu.blas import numpy_blas_threads

    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    with numpy_blas_threads(threads):
        x @ x
        best = min(_seconds(lambda: x @ x) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def int8_gmacs(width: int = 2048, inputs: int = 64) -> float:
    """One thread's GMAC/s of the repacked Q4_K product, weights in L2 (bench/kernels.py's probe)."""
    from bench.kernels import _r8_in_l2

    _, ns = _r8_in_l2("Q4_K", width, inputs, np.random.default_rng(0))
    return 256 / ns


def _shape(lm) -> tuple[int, int, int, int]:
    """(layers, heads, kv_heads, head_dim) of a loaded model's CPU decoder."""
    d = lm.cpu_decode
    return len(d._layers), d.heads, d.kv_heads, d.head_dim


def model_roofline(path: Path, threads: int, context: int, steps: int, tokens: int, bus: float, peak: float) -> list:
    """(what, figure, limit) lines for one model: decode against the bus, prefill against the int8 peak."""
    from bench.engine import decode_seconds, routes_seconds

    lm = load_model(str(path), threads=threads)
    layers, heads, kv_heads, dim = _shape(lm)
    weights = sum(b for b, _ in product_bytes(path).values())
    kv = layers * kv_heads * dim * 2 * 4 * context
    seconds = decode_seconds(lm, context, steps)
    limit = bus * 1e9 / (weights + kv)
    lines = [(f"decode at {context} positions: {(weights + kv) / 1e6:.0f} MB a token", 1 / seconds, limit)]
    params = sum(int(np.prod(t.shape)) for t in read_gguf(path).tensors.values()
                 if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2)
    macs = params * tokens + layers * heads * dim * 2 * tokens * (tokens + 1) / 2
    seconds = routes_seconds(lm, tokens)
    lines.append((f"prefill of {tokens} tokens: {macs / 1e9:.0f} GMAC", macs / seconds / 1e9, peak))
    del lm
    gc.collect()
    return lines


def roofline_main() -> None:
    ap = argparse.ArgumentParser(description=ROOFLINE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--bw-mib", type=int, default=1024)
    args = ap.parse_args()
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {cpu_line()}")
    counts = sorted({1, args.threads})
    flops = {t: sgemm_gflops(t) for t in counts}  # first: numba's threads, once started, spin a while
    read = {t: read_bandwidth(t, args.bw_mib) for t in counts}
    triad = {t: triad_bandwidth(t, args.bw_mib) for t in counts}
    int8 = int8_gmacs()
    for name, unit, got in (("read", "GB/s", read), ("triad", "GB/s", triad), ("sgemm", "GFLOP/s", flops)):
        print(f"{name:6s} " + ", ".join(f"{got[t]:.1f} {unit} on {t} thread(s)" for t in counts))
    print(f"int8   {int8:.1f} GMAC/s on 1 thread (repacked Q4_K, 64 input rows, in L2); "
          f"{int8 * args.threads:.1f} taken as {args.threads} threads' peak")
    print(f"{'model':40s} {'what':44s} {'got':>9s} {'limit':>9s} {'of limit':>8s}")
    for model in args.models or [default_model_path()]:
        path = Path(model)
        for what, got, limit in model_roofline(path, args.threads, args.context, args.steps, args.prefill_tokens,
                                               read[args.threads], int8 * args.threads):
            unit = "tok/s" if what.startswith("decode") else "GMAC/s"
            print(f"{path.name[:40]:40s} {what:44s} {got:9.1f} {limit:9.1f} {got / limit:8.2f}  ({unit})", flush=True)
