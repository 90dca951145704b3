"""Greedy agreement of each --cache-type-k/-v with the model's own KV, KV bytes per token, and
the decode step's time, on one model (default: the embedded SmolLM2-135M-Instruct).

    PYTHONPATH=$PWD python scripts/kv_types_measure.py [--model PATH] [--tokens 48] [--types q8_0,f16] [--plain 2]

Prompts: four chat questions and four 128-token random-word prompts (loadtest/prompts.py).
Every request runs alone through the real engine (build_engine), one slot, no prompt cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from mlxcel_py.config import resolve
from mlxcel_py.flags import ServeFlags, build
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.loadtest.prompts import build_prompt
from mlxcel_py.models import encode_chat, load_model

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a KV cache is in two sentences.", "List three prime numbers and say why they are prime.")


def prompts(loaded) -> list[tuple[int, ...]]:
    chats = [tuple(encode_chat(loaded.tokenizer, [{"role": "user", "content": q}]).ids) for q in QUESTIONS]
    words = [tuple(loaded.tokenizer.encode(build_prompt(loaded.tokenizer.encode, 128, seed))) for seed in range(4)]
    return chats + words


def greedy(loaded, kv_type, ids, n) -> tuple[list[int], float]:
    from mlxcel_py.engine import TokenDelta

    cfg = resolve("serve", build(ServeFlags, dict(parallel=1, prompt_cache=False, cache_type_k=kv_type, cache_type_v=kv_type)), env={})
    engine = build_engine(cfg.engine, loaded)
    engine.add_request(Request("r", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)))
    out = [e.token_id for e in engine.step() if isinstance(e, TokenDelta)]
    start = time.perf_counter()
    while engine.has_work():
        out += [e.token_id for e in engine.step() if isinstance(e, TokenDelta)]
    return out, (time.perf_counter() - start) / max(len(out) - 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--types", default="q8_0,f16,q4_0,bf16")
    parser.add_argument("--plain", type=int, default=2, help="prompts also decoded without the CPU decode step")
    args = parser.parse_args()
    loaded = load_model(args.model)
    ps = prompts(loaded)
    base = [greedy(loaded, None, p, args.tokens) for p in ps]
    print(f"{loaded.description}; {len(ps)} prompts x {args.tokens} greedy tokens; "
          f"model dtype: {sum(t for _, t in base) / len(base) * 1000:.1f} ms per decode tick", flush=True)
    plain = dataclasses.replace(loaded, cpu_decode=None)  # the model dtype through mlx-lm's forward
    runs = [greedy(plain, None, p, args.tokens) for p in ps[: args.plain]]
    print(f"model dtype without the CPU decode step: identical {sum(r == b for (r, _), (b, _) in zip(runs, base))}"
          f"/{len(runs)}, {sum(t for _, t in runs) / max(len(runs), 1) * 1000:.1f} ms per decode tick", flush=True)
    for kv_type in args.types.split(","):
        engine = build_engine(resolve("serve", build(ServeFlags, dict(parallel=1, cache_type_k=kv_type, cache_type_v=kv_type)),
                                      env={}).engine, loaded)
        runs = [greedy(loaded, kv_type, p, args.tokens) for p in ps]
        same = sum(r == b for (r, _), (b, _) in zip(runs, base))
        agree = [next((i for i, (x, y) in enumerate(zip(r, b)) if x != y), len(b)) for (r, _), (b, _) in zip(runs, base)]
        print(f"{kv_type:5s} {engine.kv.bytes_per_token:6d} B/token  identical {same}/{len(ps)}  "
              f"first divergence {agree}  {sum(t for _, t in runs) / len(runs) * 1000:.1f} ms per decode tick", flush=True)


if __name__ == "__main__":
    main()
