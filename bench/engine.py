"""The model in process, as the engine and the loader run it: one mode a subcommand.

    engine       the engine's aggregate decode tok/s beside mlx-lm's BatchGenerator, same model, same run
    generate     one-shot generation: our engine (`mlxcel-py generate`) beside mlx-lm's stream_generate
    fast-path    prefill and decode of the default model on the CPU: the fast path against stock MLX, per arm
    prefill      one prompt's prefill per chunk size, with and without the numpy CPU kernels; --routes
    cpu-weights  `--cpu-weights f32` against `native`: decode tok/s of `mlxcel-py generate`; --prefill
    memory       resident memory of a GGUF after load and after a prefill + decode

MLX reads its BLAS once, when it loads: the BLAS named by $MLXCEL_BLAS (default auto: OpenBLAS where it
is installed) is preloaded below, before `import mlx.core`; the fast-path arms and the memory and cpu-weights
runs each take a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mlxcel_py.models.cpu.blas import preload_blas

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from bench.peers import ROOT  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402


# ---- engine --------------------------------------------------------------------------------------

ENGINE_DOC = """Aggregate decode tok/s of the engine next to mlx-lm's BatchGenerator, same model, same run.

Usage: python -m bench engine [--model PATH] [--tokens 64] [--concurrency 1 4 8]
Prints one row per concurrency: ours, BatchGenerator, the ratio, and the engine's per-tick
overhead (step time minus the runner's model calls).
"""


TOPICS = ["the sea", "a dragon", "Paris", "bread", "rain", "chess", "the moon", "a robot", "music", "winter"]


def chat_prompts(lm, n: int) -> list[tuple[int, ...]]:
    from mlxcel_py.models import encode_chat

    return [encode_chat(lm.tokenizer, [{"role": "user", "content": f"Write a story about {TOPICS[i % 10]}."}]).ids for i in range(n)]


def run_ours(lm, ps, tokens: int) -> tuple[float, float]:
    """(aggregate decode tok/s while all decode, mean non-model ms per decode tick)."""
    from mlxcel_py.config import resolve
    from mlxcel_py.flags import GenerateFlags, ServeFlags, build
    from mlxcel_py.engine import Finished, Request, SamplingParams, build_engine

    cfg = resolve("serve", build(ServeFlags, dict(parallel=len(ps), prompt_cache=False)), env={})
    engine = build_engine(cfg.engine, lm)
    model_time = [0.0]
    execute = engine.runner.execute

    def timed(step):
        t = time.perf_counter()
        out = execute(step)
        if step.decode:
            model_time[0] += time.perf_counter() - t
        return out

    engine.runner.execute = timed
    for i, p in enumerate(ps):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=tokens, ignore_eos=True), cache_prompt=False))
    while engine.scheduler.waiting or engine.scheduler.prefilling:  # admit and prefill everyone first
        engine.step()
    model_time[0], steps, done = 0.0, 0, 0
    generated_before = engine.stats().num_generated_tokens
    start = time.perf_counter()
    while engine.has_work():
        events = engine.step()
        steps += 1
        done += sum(isinstance(e, Finished) for e in events)
    elapsed = time.perf_counter() - start
    generated = engine.stats().num_generated_tokens - generated_before
    return generated / elapsed, (elapsed - model_time[0]) / steps * 1000.0


def run_batch_generator(lm, ps, tokens: int) -> float:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(lm.model, max_tokens=tokens, completion_batch_size=len(ps), prefill_batch_size=len(ps))
    gen.insert([list(p) for p in ps], max_tokens=[tokens] * len(ps))
    first = gen.next_generated()  # prefill and the first token of everyone
    count, start = 0, time.perf_counter()
    remaining = len(ps) - sum(r.finish_reason is not None for r in first)
    while remaining:
        responses = gen.next_generated()
        count += len(responses)
        remaining -= sum(r.finish_reason is not None for r in responses)
    elapsed = time.perf_counter() - start
    gen.close()
    return count / elapsed


def engine_main() -> None:
    ap = argparse.ArgumentParser(description=ENGINE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    lm = load_model(args.model)
    print(f"model: {lm.description}")
    print(f"{'seqs':>4} {'ours tok/s':>11} {'BatchGenerator':>15} {'ratio':>6} {'overhead ms/tick':>17}")
    for c in args.concurrency:
        ps = chat_prompts(lm, c)
        run_ours(lm, ps, 8)  # warm-up
        ours, overhead = run_ours(lm, ps, args.tokens)
        theirs = run_batch_generator(lm, ps, args.tokens)
        print(f"{c:>4} {ours:>11.1f} {theirs:>15.1f} {ours / theirs:>6.2f} {overhead:>17.2f}")
        mx.clear_cache()


# ---- generate ------------------------------------------------------------------------------------

GENERATE_DOC = """One-shot generation: our engine (what `mlxcel-py generate` runs) next to mlx-lm's own
`stream_generate`, on the same weights in the same process, alternating, best of N.

Usage: python -m bench generate [--prompt-tokens 512] [--max-tokens 128] [--rounds 3]
Prints prompt tok/s, generation tok/s and TTFT for both. The stock path (quantized weights,
reference BLAS) is measured by `fast-path`, in its own process.
"""


def generate_ours(lm, ids: list[int], max_tokens: int) -> tuple[float, float, float]:
    from mlxcel_py.config import resolve
    from mlxcel_py.flags import GenerateFlags, ServeFlags, build
    from mlxcel_py.engine import Finished, Request, SamplingParams, build_engine
    from mlxcel_py.engine.core.worker import EngineWorker

    cfg = resolve("generate", build(GenerateFlags, dict(max_tokens=max_tokens)), env={})
    worker = EngineWorker(build_engine(cfg.engine, lm)).start()
    try:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        done = [e for e in worker.submit(Request("bench", tuple(ids), params, cache_prompt=False))][-1]
    finally:
        worker.stop()
    assert isinstance(done, Finished) and done.usage.completion_tokens == max_tokens
    return done.timings.prompt_tps, done.timings.decode_tps, done.timings.ttft_ms


def generate_theirs(lm, ids: list[int], max_tokens: int) -> tuple[float, float, float]:
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    start, first, last = time.perf_counter(), None, None
    for response in stream_generate(lm.model, lm.tokenizer, mx.array(ids), max_tokens=max_tokens,
                                    sampler=make_sampler(0.0)):
        if first is None:
            first = time.perf_counter()
        last = response
    # mlx-lm reports its own prompt and generation speeds; TTFT is measured here.
    return last.prompt_tps, last.generation_tps, (first - start) * 1000.0


def generate_main() -> None:
    ap = argparse.ArgumentParser(description=GENERATE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lm = load_model(None)
    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(args.prompt_tokens)]
    print(f"model: {lm.description}")
    print(f"{args.prompt_tokens}-token prompt, {args.max_tokens} generated tokens, greedy, best of {args.rounds}")
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for name, fn in (("mlxcel-py engine", generate_ours), ("mlx_lm stream_generate", generate_theirs)):
            p, g, t = fn(lm, ids, args.max_tokens)
            old = best.get(name, (0.0, 0.0, float("inf")))
            best[name] = (max(old[0], p), max(old[1], g), min(old[2], t))
    print(f"{'':>24} {'prompt tok/s':>13} {'gen tok/s':>10} {'TTFT ms':>8}")
    for name, (p, g, t) in best.items():
        print(f"{name:>24} {p:>13.1f} {g:>10.1f} {t:>8.0f}")
    (p1, g1, _), (p2, g2, _) = best.values()
    print(f"ratio ours/mlx_lm: prompt {p1 / p2:.2f}, generation {g1 / g2:.2f}")


# ---- fast-path -----------------------------------------------------------------------------------

FAST_PATH_DOC = """Prefill/decode timings of the default model on the CPU: the fast path against stock MLX.

Each arm runs in its own process, because the BLAS preload must precede `import mlx.core`.
    python -m bench fast-path            # all arms
    python -m bench fast-path --arm dense-openblas --tokens 512
"""


# name -> (MLXCEL_BLAS, weights, prefill tokens, prefill runs); slow arms use 128 tokens, one run.
FAST_PATH_ARMS = {
    "dense-openblas": ("auto", "dense", 512, 3),
    "dense-reference": ("off", "dense", 512, 1),
    "quantized-stock": ("off", "quantized", 128, 1),
    "float16-openblas": ("auto", "float16", 128, 1),
}
DECODE_TOKENS = 16


def run_arm(blas: str, weights: str, num_tokens: int, runs: int) -> dict:
    """Load the default model one way; time a cold prefill (best of `runs`) and greedy decode steps. The BLAS
    was preloaded on import: the parent starts each arm with its $MLXCEL_BLAS."""
    info = preload_blas(blas)
    model = load_model(None, dense=weights != "quantized")
    if weights == "float16":
        model.model.set_dtype(mx.float16)
    ids = mx.array([[(i * 7919) % 40000 + 100 for i in range(num_tokens)]])
    kernels = model.cpu_kernels or contextlib.nullcontext()  # the CPU prefill kernels' scope
    kernels.__enter__()
    mx.eval(model.model(ids[:, :8]))  # warm-up: first-call allocations
    head_s = time_lm_head(model.model, num_tokens)
    prefill = float("inf")
    for _ in range(runs):  # the machine may be shared: the best run is the least disturbed
        cache = make_prompt_cache(model.model)
        start = time.perf_counter()
        logits = model.model(ids, cache=cache)
        mx.eval(logits)
        prefill = min(prefill, time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        logits = model.model(mx.argmax(logits[:, -1:], axis=-1), cache=cache)
        mx.eval(logits)
    decode = (time.perf_counter() - start) / DECODE_TOKENS
    kernels.__exit__(None, None, None)
    label = "float16" if weights == "float16" else model.weights
    return {"blas": info.name, "weights": label, "tokens": num_tokens,
            "prefill_s": round(prefill, 3), "prefill_tok_s": round(num_tokens / prefill, 1),
            "decode_ms": round(decode * 1000, 1), "lm_head_s": round(head_s, 3)}


def time_lm_head(model, num_tokens: int) -> float:
    """Seconds of the output projection over every prompt position (prefill needs only the last)."""
    hidden = mx.random.normal((1, num_tokens, model.args.hidden_size)).astype(model.model.norm.weight.dtype)
    mx.eval(hidden)
    start = time.perf_counter()
    head = model.lm_head if not model.args.tie_word_embeddings else model.model.embed_tokens.as_linear
    mx.eval(head(hidden))
    return time.perf_counter() - start


def fast_path_main() -> None:
    parser = argparse.ArgumentParser(description=FAST_PATH_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=sorted(FAST_PATH_ARMS))
    parser.add_argument("--tokens", type=int, help="prefill length (default: per arm)")
    args = parser.parse_args()
    if args.arm:
        blas, weights, tokens, runs = FAST_PATH_ARMS[args.arm]
        print(json.dumps({"arm": args.arm, **run_arm(blas, weights, args.tokens or tokens, runs)}), flush=True)
        return
    print(f"{'arm':18} {'blas':10} {'weights':14} {'tokens':>6} {'prefill s':>10} {'tok/s':>8} "
          f"{'decode ms':>10} {'lm head s':>10}")
    for arm in FAST_PATH_ARMS:
        cmd = [sys.executable, "-m", "bench", "fast-path", "--arm", arm] + (["--tokens", str(args.tokens)] if args.tokens else [])
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "MLXCEL_BLAS": FAST_PATH_ARMS[arm][0]})
        if out.returncode != 0:
            print(f"{arm:18} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{arm:18} {r['blas']:10} {r['weights']:14} {r['tokens']:>6} {r['prefill_s']:>10} "
              f"{r['prefill_tok_s']:>8} {r['decode_ms']:>10} {r['lm_head_s']:>10}", flush=True)


# ---- prefill -------------------------------------------------------------------------------------

PREFILL_DOC = """Prefill time of one prompt at several chunk sizes, with and without the numpy CPU kernels.

Usage: python -m bench prefill [--tokens 2048] [--chunks 512 1024 2048]
Run once as is, and once with OPENBLAS_CORETYPE=Prescott to see what Debian's OpenBLAS
picks on its own on a recent Xeon. Prints one row per (kernels, chunk).

`--routes [--model FILE] [--tokens 512 2048]`: one whole prefill through the engine's runner, as
rows of the fused decode step (the exact route, engine/runner/row_prefill.py) and as the mlx-lm
forward over dequantized tiles, interleaved, `--rounds` each (docs/CPU_FAST_PATH.md, "One kernel
family").
"""


def prefill_seconds(model, ids: list[int], chunk: int) -> float:
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    for s in range(0, len(ids), chunk):
        model.model(mx.array([ids[s : s + chunk]]), cache=cache)
        mx.eval([c.state for c in cache])
    return time.perf_counter() - start


def _prompted(lm, n: int, seed: int, max_tokens: int) -> tuple:
    """(a fresh runner, seconds): one `n`-token prompt of random ids prefilled through it as sequence 1."""
    from mlxcel_py.engine.core.request import SamplingParams
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step
    from mlxcel_py.engine.runner.model_runner import ModelRunner

    ids = tuple(random.Random(seed).randrange(100, 40000) for _ in range(n))
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, verify=lm.cpu_decode.verify, kernels=lm.cpu_kernels)
    begin = BeginSequence(SamplingParams(max_tokens=max_tokens, temperature=0.0), ())
    start = time.perf_counter()
    runner.execute(Step(prefill=PrefillPiece(1, 0, ids, n, True, None, begin)))
    return runner, time.perf_counter() - start


def routes_seconds(lm, n: int, rows: bool = True) -> float:
    """Seconds of one `n`-token prefill through a fresh runner, as rows of the fused step (or tiles)."""
    from mlxcel_py.engine.runner import row_prefill

    runs_rows = row_prefill.runs_rows
    row_prefill.runs_rows = runs_rows if rows else (lambda decoder: False)
    try:
        return _prompted(lm, n, 1, 1)[1]
    finally:
        row_prefill.runs_rows = runs_rows


def decode_seconds(lm, context: int, steps: int) -> float:
    """Median seconds of one decode step of one sequence through a fresh runner (the server's path: the
    engine's KV rows), after a `context`-token prompt."""
    from mlxcel_py.engine.core.step import Step

    runner, _ = _prompted(lm, context, 2, steps + 8)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        runner.execute(Step(decode=(1,)))
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])  # the first two warm the decode path


def routes(model: str | None, tokens: list[int], rounds: int) -> None:
    """Seconds of one prefill through the runner: as rows of the fused step, then as tiles."""
    lm = load_model(model)
    print(f"model: {lm.description}; BLAS {BLAS.name} {BLAS.note}")
    for n in tokens:
        seconds: dict[str, list[float]] = {"rows": [], "tiles": []}
        for _ in range(rounds):
            for route in seconds:
                seconds[route].append(routes_seconds(lm, n, route == "rows"))
        print(f"{n} tokens: " + "; ".join(f"{r} {' '.join(f'{t:.2f}' for t in ts)} s" for r, ts in seconds.items()),
              flush=True)


def prefill_main() -> None:
    ap = argparse.ArgumentParser(description=PREFILL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048])
    ap.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--routes", action="store_true", help="rows of the fused step against tiles, through the runner")
    ap.add_argument("--model", default=None, help="--routes: a GGUF (default: the default model)")
    args = ap.parse_args()
    if args.routes:
        return routes(args.model, args.tokens, args.rounds)
    args.tokens = args.tokens[0]
    lm = load_model(None)
    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(args.tokens)]
    print(f"model: {lm.description}; BLAS {BLAS.name} {BLAS.note}; {args.tokens}-token prompt, best of {args.rounds}")
    print(f"{'kernels':>8} {'chunk':>6} {'prefill s':>10} {'tok/s':>8}")
    # The numpy kernels run only inside their scope (LoadedModel.cpu_kernels; None off the CPU path).
    for label, scope in (("numpy", lm.cpu_kernels), ("mlx", contextlib.nullcontext())):
        if scope is None:
            continue
        with scope:
            prefill_seconds(lm.model, ids[:256], 256)  # warm-up
            for chunk in args.chunks:
                best = min(prefill_seconds(lm.model, ids, chunk) for _ in range(args.rounds))
                print(f"{label:>8} {chunk:>6} {best:>10.2f} {args.tokens / best:>8.0f}", flush=True)


# ---- cpu-weights ---------------------------------------------------------------------------------

CPU_WEIGHTS_DOC = """`--cpu-weights f32` (float32 copies of the GGUF's weights) against `native` (the GGUF blocks), interleaved.

    python -m bench cpu-weights [--runs 3] [--max-tokens 128] [extra generate flags, e.g. --threads 1]
    python -m bench cpu-weights --prefill [--model GGUF] [--tokens 512] [--chunk 512] [--runs 2]

Decode (the default): `mlxcel-py generate` on the default model (or --model), each weights mode in its own
process, alternating `--runs` times (the machine may be shared); prints each run's "Generation:" line
(tokens and tokens-per-sec), with the CPU, its vector flags and the load before and after. Flags this
mode does not know go to `generate` as they are.

--prefill: one prompt's prefill time, both models loaded as `serve` loads them (numpy prefill kernels on,
GGUF blocks through dequantized tiles), interleaved; prints seconds per run and the last hidden state's gap.
"""


def prefill_hidden(lm, ids: list[int], chunk: int) -> tuple[float, np.ndarray]:
    cache = make_prompt_cache(lm.model)
    start = time.perf_counter()
    with lm.cpu_kernels:
        for s in range(0, len(ids), chunk):
            h = lm.model.model(mx.array([ids[s : s + chunk]]), cache=cache)
            mx.eval(h, [c.state for c in cache])
    return time.perf_counter() - start, np.array(h[0, -1])


def cpu_weights_prefill(opts: argparse.Namespace) -> None:
    models = {w: load_model(opts.gguf, cpu_weights=w) for w in ("f32", "native")}
    ids = [random.Random(0).randrange(3, min(1000, models["f32"].vocab_size)) for _ in range(opts.tokens)]
    print(f"{models['f32'].name}: {opts.tokens} tokens in chunks of {opts.chunk}, BLAS {BLAS.name}")
    hidden = {}
    for run in range(opts.runs or 2):
        for name, lm in models.items():
            seconds, hidden[name] = prefill_hidden(lm, ids, opts.chunk)
            print(f"  run {run + 1} {name:<6} [{lm.weights}] {seconds:.2f} s", flush=True)
    print(f"  last hidden state gap {np.abs(hidden['f32'] - hidden['native']).max():.2e}")


def cpu_weights_decode(opts: argparse.Namespace, extra: list[str]) -> None:
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((line for line in cpu.splitlines() if line.startswith("Model name")), "Model name: ?"))
    flags = set(open("/proc/cpuinfo").read().split())
    print("flags: " + " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags))
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    model = ["--model", opts.gguf] if opts.gguf else []
    for run in range(opts.runs or 3):
        for weights in ("f32", "native"):
            cmd = [sys.executable, "-m", "mlxcel_py", "generate", "--cpu-weights", weights, "--max-tokens",
                   str(opts.max_tokens), *model, *extra, "Write a short story about a lighthouse keeper."]
            got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            rate = next((line for line in got.stderr.splitlines() if line.startswith("Generation:")),
                        f"failed: {got.stderr.strip().splitlines()[-1:]}")
            print(f"run {run + 1} {weights}: {rate}", flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def cpu_weights_main() -> None:
    ap = argparse.ArgumentParser(description=CPU_WEIGHTS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", dest="gguf", default=None, help="a GGUF (default: the default model)")
    ap.add_argument("--prefill", action="store_true", help="time one prompt's prefill instead of generate's decode")
    ap.add_argument("--runs", type=int, default=None, help="rounds of both modes (default: 3 decode, 2 --prefill)")
    ap.add_argument("--max-tokens", type=int, default=128, help="decode: tokens generate writes")
    ap.add_argument("--tokens", type=int, default=512, help="--prefill: the prompt's length")
    ap.add_argument("--chunk", type=int, default=512, help="--prefill: the prefill chunk")
    opts, extra = ap.parse_known_args()
    if opts.prefill:
        if extra:
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
        return cpu_weights_prefill(opts)
    return cpu_weights_decode(opts, extra)


# ---- memory --------------------------------------------------------------------------------------

MEMORY_DOC = """Resident memory (VmRSS) of a GGUF loaded for the CPU, after load and after a prefill + decode.

Usage: python -m bench memory [GGUF ...] [--cpu-weights f32 native] [--prompt 256] [--decode 32]
Each (file, --cpu-weights) runs in a fresh process: load_model as `serve` does, then one prompt of
--prompt random tokens prefilled and --decode greedy steps through the loader's decode path
(cpu_decode when it installed one). Prints MiB and the ratio to the file's size.
"""


def rss_mib() -> float:
    from mlxcel_py.models.footprint import resident_bytes

    return resident_bytes() / (1 << 20)


def memory_child(path: str, cpu_weights: str, prompt: int, decode: int) -> dict:
    base = rss_mib()
    lm = load_model(path, cpu_weights=cpu_weights)
    loaded = rss_mib()
    ids = [random.Random(0).randrange(3, min(1000, lm.vocab_size)) for _ in range(prompt)]
    cache = make_prompt_cache(lm.model)
    with lm.cpu_kernels:
        logits = lm.model(mx.array([ids]), cache=cache)[:, -1]
    mx.eval(logits)
    batch = [layer.merge([layer]) for layer in cache]
    token = [int(logits.argmax(-1).item())]
    for _ in range(decode):
        out = lm.cpu_decode(token, batch) if lm.cpu_decode else lm.model(mx.array(token)[:, None], cache=batch)[:, -1]
        token = [int(mx.argmax(out, -1).item())]
    return {"imports": base, "loaded": loaded, "decoded": rss_mib(), "weights": lm.weights}


def memory_main() -> None:
    ap = argparse.ArgumentParser(description=MEMORY_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="*")
    ap.add_argument("--cpu-weights", nargs="+", default=["f32", "native"])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        print(json.dumps(memory_child(*opts.child, opts.prompt, opts.decode)))
        return
    from mlxcel_py.models.loader import default_model_path

    for path in opts.gguf or [default_model_path()]:
        size = Path(path).stat().st_size / 2**20
        for weights in opts.cpu_weights:
            cmd = [sys.executable, "-m", "bench", "memory", "--child", path, weights, "--prompt", str(opts.prompt),
                   "--decode", str(opts.decode)]
            got = json.loads(subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(f"{Path(path).name} ({size:.0f} MiB) --cpu-weights {weights} [{got['weights']}]: "
                  f"imports {got['imports']:.0f} MiB, after load {got['loaded']:.0f} MiB "
                  f"({got['loaded'] / size:.2f}x file), after prefill+decode {got['decoded']:.0f} MiB "
                  f"({got['decoded'] / size:.2f}x file)", flush=True)


# Gemma 3 4B/12B/27B's vision side (SigLIP so400m at 896 px, 4,096 patches pooled to 256 image tokens).
GEMMA3_VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                 "patch_size": 14, "image_size": 896, "model_type": "siglip_vision_model", "layer_norm_eps": 1e-6,
                 "num_channels": 3}
GEMMA3_TEXT_HIDDEN = {"4b": 2560, "12b": 3840, "27b": 5376}


def vision_main() -> None:
    """`python -m bench vision-encode`: one image through Gemma 3's vision tower and projector at their real
    shapes (random weights: time and memory, not features), as mlx-vlm's classes run it on this machine."""
    import resource
    import time

    import mlx.core as mx
    from mlx_vlm.models.gemma3.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
    from mlx_vlm.models.gemma3.vision import VisionModel

    from bench.decode import cpu_line

    parser = argparse.ArgumentParser(description=vision_main.__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(GEMMA3_TEXT_HIDDEN), default="4b")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention", nargs="+", choices=["numpy", "mlx"], default=["numpy", "mlx"],
                        help="the encoder's attention: the server's on the CPU (numpy, float32 only) and/or MLX's")
    args = parser.parse_args()
    config = ModelConfig.from_dict({
        "model_type": "gemma3", "mm_tokens_per_image": 256, "vision_config": VisionConfig.from_dict(GEMMA3_VISION),
        "text_config": TextConfig.from_dict({"model_type": "gemma3_text", "hidden_size": GEMMA3_TEXT_HIDDEN[args.model],
                                             "num_hidden_layers": 1, "intermediate_size": 1}),  # the projector reads the width
    })
    print(cpu_line())
    runs = [(d, a) for d in args.dtypes for a in args.attention if a == "mlx" or d == "float32"]
    for dtype, attention in runs:
        tower, projector = VisionModel(config.vision_config), Gemma3MultiModalProjector(config)
        for part in (tower, projector):
            part.set_dtype(getattr(mx, dtype))
            mx.eval(part.parameters())
        if attention == "numpy":
            from mlxcel_py.models.cpu.prefill_attention import set_threads
            from mlxcel_py.models.vision_attention import install

            set_threads(os.cpu_count() or 1)  # as the server's loader (--threads: every core)
            install(tower)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        pixels = mx.random.normal((1, 896, 896, 3)).astype(getattr(mx, dtype))
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            hidden, _, _ = tower(pixels, output_hidden_states=True)
            features = projector(hidden)
            mx.eval(features)
            times.append(time.perf_counter() - start)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
        params = sum(v.size for _, v in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(
            [tower.parameters(), projector.parameters()]))
        print(f"gemma3-{args.model} vision {dtype}, {attention} attention: {params / 1e6:.0f}M parameters, "
              f"features {features.shape}, one 896x896 image {min(times):.2f}-{max(times):.2f} s "
              f"over {args.rounds} rounds, "
              f"peak RSS +{grown:.0f} MiB while encoding")
        del tower, projector
