"""Context shift (--context-shift): the two ways to rebuild a shifted row, timed, and their
next-token logits against a fresh prefill of the shifted token list, in process.

    .venv/bin/python bench/bench_context_shift.py [--contexts 512 2048] [--n-keep 32] [--rounds 3]

On the default model (SmolLM2-135M-Instruct): a row of C - 1 tokens of English text (the point
where llama-server shifts), n_keep kept, half of the rest discarded. Per mode ("prefill": forward
the kept tokens afresh; "rotate": re-rotate the tail keys, llama.cpp's way), the median time of
the shift, the max |logit error|, the KL divergence (nats) and whether the top token agrees with
the fresh prefill's, and how many of the next 32 greedy tokens agree. One decode step at C is
timed for scale. Prints the CPU and the load first (figures are under whatever load is there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

import mlx.core as mx  # noqa: E402

from bench_speculative import PARAGRAPH, machine  # noqa: E402
from mlxcel_py.engine import SamplingParams  # noqa: E402
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Shift, Step  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402

FOLLOW = 32  # greedy tokens compared after the shift


def text_ids(tokenizer, n: int) -> tuple[int, ...]:
    story = (PARAGRAPH + " The librarian kept a diary of every visitor, and this is what it said. ") * 200
    ids = tuple(tokenizer.encode(story))
    assert len(ids) >= n, "the text is too short"
    return ids[:n]


def shifted(lm, mode: str, ids: tuple[int, ...], keep: int, discard: int) -> tuple[ModelRunner, float]:
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels)
    runner.shift_mode = mode
    begin = BeginSequence(SamplingParams(), ())
    runner.execute(Step(prefill=PrefillPiece(1, 0, ids, len(ids), True, None, begin)))
    kept = ids[:keep] + ids[keep + discard:]
    start = time.perf_counter()
    runner.execute(Step(shift=(Shift(1, keep, discard, kept),)))
    return runner, time.perf_counter() - start


def greedy_after(model, cache, token: int, n: int) -> tuple[mx.array, list[int]]:
    logits = model(mx.array([[token]]), cache=cache)[0, -1]
    first, out = logits, []
    for _ in range(n):
        out.append(mx.argmax(logits).item())
        logits = model(mx.array([[out[-1]]]), cache=cache)[0, -1]
    return first, out


def measure(lm, context: int, n_keep: int, rounds: int) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    ids = text_ids(lm.tokenizer, context)
    row, last = ids[: context - 1], ids[context - 1]
    discard = (len(row) - n_keep) // 2
    kept = row[:n_keep] + row[n_keep + discard:]
    fresh = make_prompt_cache(lm.model)
    lm.model(mx.array([kept]), cache=fresh)
    want, want_next = greedy_after(lm.model, fresh, last, FOLLOW)
    p_want = mx.softmax(want.astype(mx.float32))
    print(f"context {context}: row {len(row)} tokens, n_keep {n_keep}, n_discard {discard}")
    for mode in ("prefill", "rotate"):
        times = []
        for _ in range(rounds):
            runner, seconds = shifted(lm, mode, row, n_keep, discard)
            times.append(seconds)
        got, got_next = greedy_after(lm.model, runner._batch, last, FOLLOW)
        p_got = mx.softmax(got.astype(mx.float32))
        kl = (p_want * (mx.log(p_want + 1e-30) - mx.log(p_got + 1e-30))).sum().item()
        err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        same = sum(a == b for a, b in zip(got_next, want_next))
        print(f"  {mode:8s} shift {statistics.median(times) * 1000:8.1f} ms  max|dlogit| {err:.4f}  KL {kl:.5f}  "
              f"top-1 {'same' if got_next[0] == want_next[0] else 'DIFFERENT'}  next {FOLLOW}: {same} same", flush=True)
    runner.execute(Step(decode=(1,)))  # the CPU decode step copies the rebuilt row into its own buffer once
    start = time.perf_counter()
    for _ in range(5):
        runner.execute(Step(decode=(1,)))
    print(f"  one decode step at this context: {(time.perf_counter() - start) / 5 * 1000:.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--n-keep", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for line in machine():
        print(line, flush=True)
    lm = load_model(None)
    for context in args.contexts:
        measure(lm, context, args.n_keep, args.rounds)


if __name__ == "__main__":
    main()
