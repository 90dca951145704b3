"""Compare constrained-decoding libraries on the default model (SmolLM2-135M-Instruct).

Run once per library, each from its own scratch venv (the library plus this package):
    $VENV_LLGUIDANCE/bin/python bench/compare_grammar_libs.py --lib llguidance
    $VENV_XGRAMMAR/bin/python bench/compare_grammar_libs.py --lib xgrammar
    $VENV_OUTLINES/bin/python bench/compare_grammar_libs.py --lib outlines-core
Prints: tokenizer setup time; schema coverage (each feature compiled, and enforced: valid
examples accepted token by token, invalid ones refused); compile time per grammar; and the
per-token CPU cost of the mask (fill + apply to the logits row) and of the advance, measured
on real generations, next to the model's decode step.
"""

from __future__ import annotations

import argparse
import json
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
from grammar_libs import ADAPTERS, Unsupported  # noqa: E402
from grammar_cases import COVERAGE, GENERATIONS  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.engine.runner.logits import apply_bitmask as engine_apply_bitmask  # noqa: E402
from mlxcel_py.models import encode_chat, load_model  # noqa: E402



def apply_bitmask(logits: mx.array, words: np.ndarray) -> mx.array:
    """-inf where the bitmask forbids: the engine's op, the same for every library."""
    return engine_apply_bitmask(logits, words[None])


def feed(adapter, compiled, ids: list[int]) -> bool:
    """Drive a fresh matcher over `ids` (plus EOS); True when every token is allowed and it ends accepting."""
    m = adapter.matcher(compiled)
    row = np.zeros((adapter_vocab + 31) // 32, dtype=np.int32)
    for t in ids:
        m.fill(row)
        if not (row[t // 32] >> (t % 32)) & 1 or not m.accept(t):
            return False
    m.fill(row)
    return bool(m.accepting() and (row[eos // 32] >> (eos % 32)) & 1)


def coverage(adapter, tok) -> list[tuple[str, str]]:
    rows = []
    for feature, schema, valid, invalid in COVERAGE:
        kind, text = ("json_schema", json.dumps(schema)) if isinstance(schema, dict) else schema
        try:
            compiled = adapter.compile(kind, text)
        except Unsupported:
            rows.append((feature, "unsupported"))
            continue
        except Exception as exc:  # noqa: BLE001 - each library raises its own types
            rows.append((feature, f"compile error: {str(exc).splitlines()[0][:90]}"))
            continue
        ok_valid = all(feed(adapter, compiled, tok.encode(v, add_special_tokens=False)) for v in valid)
        bad = [v for v in invalid if feed(adapter, compiled, tok.encode(v, add_special_tokens=False))]
        verdict = "yes" if ok_valid and not bad else ("rejects valid" if not ok_valid else f"accepts {bad[0]!r}")
        rows.append((feature, verdict))
    return rows


def generate(lm, adapter, compiled, prompt_ids, temp: float, seed: int, max_tokens: int):
    """One constrained generation; per-token timings in ms (fill, apply, advance, step)."""
    m = adapter.matcher(compiled)
    row = np.zeros((adapter_vocab + 31) // 32, dtype=np.int32)
    cache = make_prompt_cache(lm.model)
    logits = lm.model(mx.array([prompt_ids]), cache=cache)[:, -1, :]
    key, out, times = mx.random.key(seed), [], []
    for _ in range(max_tokens):
        t0 = time.perf_counter()
        mx.eval(logits)
        t1 = time.perf_counter()
        m.fill(row)
        t2 = time.perf_counter()
        masked = apply_bitmask(logits, row)
        mx.eval(masked)
        t3 = time.perf_counter()
        if temp == 0:
            tok = int(mx.argmax(masked, axis=-1).item())
        else:
            key, sub = mx.random.split(key)
            tok = int(mx.random.categorical(masked * (1 / temp), key=sub).item())
        t4 = time.perf_counter()
        if tok == eos:
            break
        ok = m.accept(tok)
        t5 = time.perf_counter()
        times.append(((t2 - t1) * 1e3, (t3 - t2) * 1e3, (t5 - t4) * 1e3, (t1 - t0) * 1e3))
        out.append(tok)
        if not ok:
            return out, times, "rejected"
        logits = lm.model(mx.array([[tok]]), cache=cache)[:, -1, :]
    return out, times, ("eos" if len(out) < max_tokens else "length")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    global adapter_vocab, eos
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", choices=sorted(ADAPTERS), required=True)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-generate", action="store_true")
    args = ap.parse_args()
    lm = load_model(None)
    hf = lm.tokenizer._tokenizer
    adapter_vocab, eos = lm.model.args.vocab_size, sorted(lm.eos_token_ids)[0]
    t = time.perf_counter()
    adapter = ADAPTERS[args.lib](hf, adapter_vocab, sorted(lm.eos_token_ids))
    print(f"{args.lib}: tokenizer setup {1e3 * (time.perf_counter() - t):.0f} ms")
    for feature, verdict in coverage(adapter, hf):
        print(f"  coverage {feature:<28} {verdict}")
    if args.no_generate:
        return
    for name, kind, text, prompt in GENERATIONS:
        try:
            t = time.perf_counter()
            compiled = adapter.compile(kind, text)
            compile_ms = 1e3 * (time.perf_counter() - t)
            t = time.perf_counter()
            adapter.matcher(compiled)
            matcher_ms = 1e3 * (time.perf_counter() - t)
        except Unsupported as exc:
            print(f"  {name:<12} unsupported: {exc}")
            continue
        ids = list(encode_chat(lm.tokenizer, [{"role": "user", "content": prompt}]).ids)
        fills, applies, advances, steps, ends = [], [], [], [], []
        for temp, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
            out, times, end = generate(lm, adapter, compiled, ids, temp, seed, args.max_tokens)
            for f, a, adv, s in times:
                fills.append(f), applies.append(a), advances.append(adv), steps.append(s)
            ends.append(f"{end}:{len(out)}")
            if temp == 0:
                sample = lm.tokenizer.decode(out)
        print(f"  {name:<12} compile {compile_ms:8.1f} ms, new matcher {matcher_ms:6.2f} ms, "
              f"ends {' '.join(ends)}")
        print(f"  {'':<12} per token ms: fill median {statistics.median(fills):.3f} p99 {pct(fills, .99):.3f}; "
              f"apply median {statistics.median(applies):.3f} p99 {pct(applies, .99):.3f}; "
              f"advance median {statistics.median(advances):.3f} p99 {pct(advances, .99):.3f}; "
              f"model step median {statistics.median(steps):.1f}")
        print(f"  {'':<12} greedy: {sample[:160]!r}")


adapter_vocab = eos = 0

if __name__ == "__main__":
    main()
