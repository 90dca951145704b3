"""Constrained decoding cost on the default model: per-token mask cost next to a decode step.

Usage: .venv/bin/python bench/bench_constraints.py [--max-tokens 96] [--runs 3]
For json_object, a nested schema and a forced tool call, greedy and temperature 1, it
decodes with the real sampling path (engine/runner/sampling.py) and prints, per token:
  model    the model's forward step (batch 1)
  free     sampling at the same temperature without a constraint (greedy: the one-argmax fast path)
  fill     computing the grammar's bitmask (llguidance)
  overhead a constrained sample_step (fill + mask + sample + advance) minus `free`
and the one-off costs: the tokenizer tables (once per model), compile (once per grammar,
then cached) and a new sequence's matcher (a copy of the compiled one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from grammar_cases import PERSON, WEATHER_TOOL  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.engine.runner.constraints import ConstraintCompiler  # noqa: E402
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step  # noqa: E402
from mlxcel_py.engine.core.request import ConstraintSpec, SamplingParams  # noqa: E402
from mlxcel_py.models import encode_chat, load_model  # noqa: E402
from mlxcel_py.tool_calls import call_constraint, tool_format, tool_messages, tool_request  # noqa: E402


def cases(lm):
    """(name, prompt ids, constraint) for the three measured grammars."""
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    req = tool_request([WEATHER_TOOL], "required", False)
    fmt = tool_format(lm.tokenizer)
    messages, tools = tool_messages(user("What is the weather in Paris?"), req, fmt)
    return [
        ("json_object", encode_chat(lm.tokenizer, user("Describe a cat as a JSON object.")).ids,
         ConstraintSpec("json_object")),
        ("nested", encode_chat(lm.tokenizer, user("Give me a JSON record for a user named Ann in Paris.")).ids,
         ConstraintSpec("json_schema", __import__("json").dumps(PERSON))),
        ("tool_call", encode_chat(lm.tokenizer, messages, tools=tools).ids, call_constraint(req, fmt)),
    ]


def decode(lm, compiler, ids, spec, temperature: float, seed: int, max_tokens: int) -> dict[str, list[float]]:
    """One constrained generation; per-token timings in ms."""
    params = SamplingParams(temperature=temperature, seed=seed, constraint=spec, max_tokens=max_tokens)
    bound = SequenceSampler(params, matcher=compiler.matcher(spec))
    free = SequenceSampler(SamplingParams(temperature=temperature, seed=seed))  # the same sampling, unconstrained
    row = np.empty(compiler.num_words, dtype=np.int32)
    cache = make_prompt_cache(lm.model)
    logits = lm.model(mx.array([list(ids)]), cache=cache)[:, -1, :]
    times: dict[str, list[float]] = {"model": [], "free": [], "fill": [], "overhead": []}
    for _ in range(max_tokens):
        t0 = time.perf_counter()
        mx.eval(logits)
        t1 = time.perf_counter()
        sample_step(logits, [free])
        t2 = time.perf_counter()
        bound.matcher.fill(row)  # read-only: the same fill sample_step does next
        t3 = time.perf_counter()
        (token,) = sample_step(logits, [bound], compiler)
        t4 = time.perf_counter()
        for name, ms in (("model", t1 - t0), ("free", t2 - t1), ("fill", t3 - t2), ("overhead", (t4 - t3) - (t2 - t1))):
            times[name].append(ms * 1e3)
        if token.token_id in lm.eos_token_ids:
            break
        logits = lm.model(mx.array([[token.token_id]]), cache=cache)[:, -1, :]
    return times


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def one_offs(lm, specs) -> None:
    compiler = ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)
    t = time.perf_counter()
    compiler.ll_tokenizer
    print(f"tokenizer tables (once per model): {1e3 * (time.perf_counter() - t):.0f} ms")
    for name, spec in specs:
        t = time.perf_counter()
        compiler.compile(spec)
        compile_ms = 1e3 * (time.perf_counter() - t)
        t = time.perf_counter()
        compiler.matcher(spec)
        print(f"{name:>12}: compile {compile_ms:.1f} ms (cached after), new sequence's matcher "
              f"{1e3 * (time.perf_counter() - t):.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3, help="generations per case: one greedy, the rest temperature 1")
    args = ap.parse_args()
    lm = load_model(None)
    print(f"model: {lm.description}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    all_cases = cases(lm)
    one_offs(lm, [(name, spec) for name, _, spec in all_cases])
    compiler = ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)
    print(f"{'per token, ms':>16} {'model':>13} {'free':>12} {'fill':>12} {'overhead':>12} {'overhead/step':>14} tokens")
    print(f"{'':>16} {'median':>6} {'p99':>6} {'median':>6} {'p99':>5} {'median':>6} {'p99':>5} {'median':>6} {'p99':>5}")
    for name, ids, spec in all_cases:
        for temperature, seeds in ((0.0, [0]), (1.0, range(1, args.runs))):
            times: dict[str, list[float]] = {}
            for seed in seeds:
                for key, values in decode(lm, compiler, ids, spec, temperature, seed, args.max_tokens).items():
                    times.setdefault(key, []).extend(values)
            if times:
                row(f"{name} t={temperature:g}", times)


def row(label: str, times: dict[str, list[float]]) -> None:
    cols = " ".join(f"{statistics.median(times[k]):>6.2f} {pct(times[k], 0.99):>5.2f}"
                    for k in ("model", "free", "fill", "overhead"))
    step = statistics.median(times["model"]) + statistics.median(times["free"])
    ratio = 100 * statistics.median(times["overhead"]) / step
    print(f"{label:>16} {cols} {ratio:>13.1f}% {len(times['model'])}")

if __name__ == "__main__":
    main()
