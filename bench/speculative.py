"""Decode tok/s at one stream with and without prompt lookup (--lookup-ngram), in process.

    python -m bench speculative [--ngram 3] [--draft-max 16] [--rounds 3] [--max-tokens 160]
                                [--draft-model PATH|self] [--streams 4] [--ignore-eos]
                                [--llama-server PATH]

`--draft-model` adds a third arm drafting with that model (`self`: the default model drafting
for itself, the ceiling of acceptance at the cost of a second forward of the same size).

Two prompts on the default model (SmolLM2-135M-Instruct), greedy: `rewrite` (copy a given
paragraph, the case prompt lookup is for) and `chat` (free text, where the adaptive pause
must keep the loss small). A request ends at EOS (the rewrite's output is the paragraph; past it
the model writes free text), up to --max-tokens; --ignore-eos forces --max-tokens as before.
The arms alternate within each round, so load swings hit both. `--llama-server PATH` adds
llama-server's plain and `ngram-simple` arms on the same prompt ids (bench/peers.py's LlamaServer).
Prints the CPU (model, avx2/avx512f) and the load first, then per prompt the median decode
tok/s of each arm (the timings' decode_tps), drafted/accepted tokens, and whether the output
was token-identical; last, the cost of one verify forward of k+1 tokens against a CPU decode step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from mlxcel_py.models.cpu.blas import preload_blas

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX: its matmuls ~10x faster

from bench.peers import LlamaServer, llama_spec_args, machine_lines  # noqa: E402

PARAGRAPH = (
    "The city library opened its doors in 1902 with four thousand books and a single reading room. "
    "Over the next century it grew into a network of twelve branches, each with its own children's "
    "corner, a local history shelf and a quiet room for study. Volunteers still run the Saturday "
    "story hour, and the oldest branch keeps the original oak tables, worn smooth by generations of readers."
)
PROMPTS = {
    "rewrite": "Repeat the following paragraph exactly, word for word, with no other text:\n\n" + PARAGRAPH,
    "chat": "Write a short story about a dragon who learns to cook soup for the village.",
}


def run_once(loaded, prompt_ids, ngram: int, draft_max: int, max_tokens: int, draft=None, streams: int = 1,
             ignore_eos: bool = True):
    """(decode tok/s, tokens, drafted, accepted) of `streams` identical greedy requests on a fresh engine
    of that many slots: one stream's tok/s is its timings' decode_tps; several streams' is the sum of
    their tokens over the time from the last first token to the last finish (all decoding together)."""
    from mlxcel_py.config import resolve
    from mlxcel_py.flags import ServeFlags, build
    from mlxcel_py.engine import Finished, Request, SamplingParams, TokenDelta, build_engine

    cfg = resolve("serve", build(ServeFlags, dict(parallel=streams, lookup_ngram=ngram or None, draft_max=draft_max,
                                              max_tokens=max_tokens)), env={})
    engine = build_engine(cfg.engine, loaded, draft=draft)
    for i in range(streams):
        engine.add_request(Request(f"r{i}", tuple(prompt_ids), SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)))
    tokens, done, first, counted = [], [], {}, 0
    while engine.has_work():
        for e in engine.step():
            if isinstance(e, TokenDelta):
                if e.request_id == "r0":
                    tokens.append(e.token_id)
                first.setdefault(e.request_id, time.perf_counter())
                counted += 1 if len(first) == streams else 0
            elif isinstance(e, Finished):
                done.append(e)
    end = time.perf_counter()
    engine.close()
    drafted = sum(d.timings.draft_n for d in done)
    accepted = sum(d.timings.draft_n_accepted for d in done)
    tps = done[0].timings.decode_tps if streams == 1 else counted / (end - max(first.values()))
    return tps, tokens, drafted, accepted


def verify_costs(loaded, context: int = 300, reps: int = 10) -> list[str]:
    """Median ms of a CPU decode step and of a verify forward of k+1 tokens at `context` positions."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model = loaded.model
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5] * context]), cache=cache))
    batch = [layer.merge([layer]) for layer in cache]

    def timed(fn) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    def decode():
        mx.eval(loaded.cpu_decode([7], batch))
        for layer in batch:
            layer.trim(1)

    def verify(width, fast):
        def run():
            if fast:
                mx.eval(loaded.cpu_decode.verify([[7] * width], batch))
            else:
                with loaded.cpu_kernels or _null():
                    mx.eval(model(mx.array([[7] * width]), cache=batch))
            for layer in batch:
                layer.trim(width)
        return run

    lines = []
    if loaded.cpu_decode is not None:
        timed(decode)  # warm
        lines.append(f"decode step (CPU fast path), context {context}: {timed(decode):.1f} ms")
        for k in (2, 4, 8, 16):
            lines.append(f"verify of 1+{k} tokens (CPU span step): {timed(verify(1 + k, True)):.1f} ms")
    for k in (0, 4, 16):
        lines.append(f"verify of 1+{k} tokens (mlx-lm forward): {timed(verify(1 + k, False)):.1f} ms")
    return lines


def report(runs, rounds: int) -> str:
    """Each arm's median tok/s (range), its ratio to the first arm, drafted/accepted, identical output."""
    rates = {arm: [] for arm, _ in runs}
    outputs, drafts = {}, {}
    for _ in range(rounds):
        for arm, run in runs:
            tps, tokens, drafted, accepted = run()
            rates[arm].append(tps)
            outputs[arm], drafts[arm] = tokens, (drafted, accepted)
    first = runs[0][0]
    base = statistics.median(rates[first])
    parts = [f"{first} {base:.1f} tok/s ({min(rates[first]):.1f}-{max(rates[first]):.1f}), {len(outputs[first])} tokens"]
    for arm, _ in runs[1:]:
        spec = statistics.median(rates[arm])
        parts.append(f"{arm} {spec:.1f} tok/s ({min(rates[arm]):.1f}-{max(rates[arm]):.1f}) x{spec / base:.2f} "
                     f"drafted {drafts[arm][0]} accepted {drafts[arm][1]} identical {outputs[first] == outputs[arm]}")
    return "; ".join(parts)


def llama_arms(args, ids, eos: bool) -> str:
    """llama-server plain vs ngram-simple on the same prompt ids (one server per arm, alternating)."""
    from mlxcel_py.models import default_model_path

    servers = [(arm, LlamaServer(args.llama_server, default_model_path(), args.threads, args.streams, spec))
               for arm, spec in (("llama plain", []), ("llama ngram", llama_spec_args(args.ngram, args.draft_max)))]
    try:
        return report([(arm, lambda s=s: s.run(list(ids), args.max_tokens, not eos)) for arm, s in servers], args.rounds)
    finally:
        for _, s in servers:
            s.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--draft-max", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=1, help="1 on a shared machine (docs/CPU_DECODE.md)")
    parser.add_argument("--draft-model", help="a third arm drafting with this model ('self': the default model)")
    parser.add_argument("--streams", type=int, default=1, help="concurrent identical requests (slots)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens past EOS (earlier runs)")
    parser.add_argument("--llama-server", help="llama-server binary: adds its plain and ngram-simple arms")
    parser.add_argument("--no-costs", action="store_true", help="skip the verify cost table")
    args = parser.parse_args()
    for line in machine_lines():
        print(line, flush=True)
    from mlxcel_py.models import default_model_path, load_draft, load_model

    loaded = load_model(str(default_model_path()), threads=args.threads)
    arms = [("plain", 0, None), ("lookup", args.ngram, None)]
    if args.draft_model:
        path = str(default_model_path()) if args.draft_model == "self" else args.draft_model
        arms.append(("draft", 0, load_draft(path, loaded, threads=args.threads)))
    warm = loaded.tokenizer.encode("warm up " * 8)
    for _, ngram, draft in arms:  # compiles the span kernels
        run_once(loaded, warm, ngram, args.draft_max, 8, draft)
    eos = not args.ignore_eos
    for name, text in PROMPTS.items():
        ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        runs = [(arm, lambda ngram=ngram, draft=draft: run_once(
            loaded, ids, ngram, args.draft_max, args.max_tokens, draft, args.streams, not eos)) for arm, ngram, draft in arms]
        print(f"{name}: {args.streams} stream(s), prompt {len(ids)} tokens; " + report(runs, args.rounds), flush=True)
        if args.llama_server:
            print(f"{name} (llama-server): " + llama_arms(args, ids, eos), flush=True)
    if not args.no_costs:
        for line in verify_costs(loaded):
            print(line, flush=True)
    print("uptime: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())

