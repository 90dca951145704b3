"""Constrained decoding on the default model (SmolLM2-135M-Instruct), one mode a subcommand:

    constraints   the per-token cost of a constraint next to a decode step, with the engine's own sampling path
    grammar-libs  the three constrained-decoding libraries compared (llguidance, xgrammar, outlines-core)

Below them: the grammar cases both use (COVERAGE, GENERATIONS, PERSON, WEATHER_TOOL) and the adapters over
the three libraries (ADAPTERS), each library imported lazily. MLX reads its BLAS once, when it loads: the BLAS
named by $MLXCEL_BLAS (default auto) is preloaded below, before anything imports MLX.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from mlxcel_py.models.cpu.blas import preload_blas

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.engine.core.request import ConstraintSpec, SamplingParams  # noqa: E402
from mlxcel_py.engine.runner.constraints import ConstraintCompiler  # noqa: E402
from mlxcel_py.engine.runner.logits import apply_bitmask as engine_apply_bitmask  # noqa: E402
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step  # noqa: E402
from mlxcel_py.models import encode_chat, load_model  # noqa: E402
from mlxcel_py.tool_calls import call_constraint, tool_format, tool_messages, tool_request  # noqa: E402


# ---- constraints ---------------------------------------------------------------------------------

CONSTRAINTS_DOC = """Constrained decoding cost on the default model: per-token mask cost next to a decode step.

Usage: python -m bench constraints [--max-tokens 96] [--runs 3]
For json_object, a nested schema and a forced tool call, greedy and temperature 1, it
decodes with the real sampling path (engine/runner/sampling.py) and prints, per token:
  model    the model's forward step (batch 1)
  free     sampling at the same temperature without a constraint (greedy: the one-argmax fast path)
  fill     computing the grammar's bitmask (llguidance)
  overhead a constrained sample_step (fill + mask + sample + advance) minus `free`
and the one-off costs: the tokenizer tables (once per model), compile (once per grammar,
then cached) and a new sequence's matcher (a copy of the compiled one).
"""


def constraint_cases(lm):
    """(name, prompt ids, constraint) for the three measured grammars."""
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    req = tool_request([WEATHER_TOOL], "required", False)
    fmt = tool_format(lm.tokenizer)
    messages, tools = tool_messages(user("What is the weather in Paris?"), req, fmt)
    return [
        ("json_object", encode_chat(lm.tokenizer, user("Describe a cat as a JSON object.")).ids,
         ConstraintSpec("json_object")),
        ("nested", encode_chat(lm.tokenizer, user("Give me a JSON record for a user named Ann in Paris.")).ids,
         ConstraintSpec("json_schema", json.dumps(PERSON))),
        ("tool_call", encode_chat(lm.tokenizer, messages, tools=tools).ids, call_constraint(req, fmt)),
    ]


def constrained_decode(lm, compiler, ids, spec, temperature: float, seed: int, max_tokens: int) -> dict[str, list[float]]:
    """One constrained generation; per-token timings in ms."""
    params = SamplingParams(temperature=temperature, seed=seed, constraint=spec, max_tokens=max_tokens)
    bound = SequenceSampler(params, matcher=compiler.matcher(spec))
    free = SequenceSampler(SamplingParams(temperature=temperature, seed=seed))  # the same sampling, unconstrained
    print_row = np.empty(compiler.num_words, dtype=np.int32)
    cache = make_prompt_cache(lm.model)
    logits = lm.model(mx.array([list(ids)]), cache=cache)[:, -1, :]
    times: dict[str, list[float]] = {"model": [], "free": [], "fill": [], "overhead": []}
    for _ in range(max_tokens):
        t0 = time.perf_counter()
        mx.eval(logits)
        t1 = time.perf_counter()
        sample_step(logits, [free])
        t2 = time.perf_counter()
        bound.matcher.fill(print_row)  # read-only: the same fill sample_step does next
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


def constraints_main() -> None:
    ap = argparse.ArgumentParser(description=CONSTRAINTS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3, help="generations per case: one greedy, the rest temperature 1")
    args = ap.parse_args()
    lm = load_model(None)
    print(f"model: {lm.description}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    all_cases = constraint_cases(lm)
    one_offs(lm, [(name, spec) for name, _, spec in all_cases])
    compiler = ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)
    print(f"{'per token, ms':>16} {'model':>13} {'free':>12} {'fill':>12} {'overhead':>12} {'overhead/step':>14} tokens")
    print(f"{'':>16} {'median':>6} {'p99':>6} {'median':>6} {'p99':>5} {'median':>6} {'p99':>5} {'median':>6} {'p99':>5}")
    for name, ids, spec in all_cases:
        for temperature, seeds in ((0.0, [0]), (1.0, range(1, args.runs))):
            times: dict[str, list[float]] = {}
            for seed in seeds:
                for key, values in constrained_decode(lm, compiler, ids, spec, temperature, seed, args.max_tokens).items():
                    times.setdefault(key, []).extend(values)
            if times:
                print_row(f"{name} t={temperature:g}", times)


def print_row(label: str, times: dict[str, list[float]]) -> None:
    cols = " ".join(f"{statistics.median(times[k]):>6.2f} {pct(times[k], 0.99):>5.2f}"
                    for k in ("model", "free", "fill", "overhead"))
    step = statistics.median(times["model"]) + statistics.median(times["free"])
    ratio = 100 * statistics.median(times["overhead"]) / step
    print(f"{label:>16} {cols} {ratio:>13.1f}% {len(times['model'])}")

if __name__ == "__main__":
    constraints_main()


# ---- grammar-libs --------------------------------------------------------------------------------

GRAMMAR_LIBS_DOC = """Compare constrained-decoding libraries on the default model (SmolLM2-135M-Instruct).

Run once per library, each from its own scratch venv (the library plus this package), from the repository root:
    $VENV_LLGUIDANCE/bin/python -m bench grammar-libs --lib llguidance
    $VENV_XGRAMMAR/bin/python -m bench grammar-libs --lib xgrammar
    $VENV_OUTLINES/bin/python -m bench grammar-libs --lib outlines-core
Prints: tokenizer setup time; schema coverage (each feature compiled, and enforced: valid
examples accepted token by token, invalid ones refused); compile time per grammar; and the
per-token CPU cost of the mask (fill + apply to the logits row) and of the advance, measured
on real generations, next to the model's decode step.
"""


adapter_vocab = eos = 0  # set by grammar_libs_main from the model


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


def lib_coverage(adapter, tok) -> list[tuple[str, str]]:
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


def lib_generate(lm, adapter, compiled, prompt_ids, temp: float, seed: int, max_tokens: int):
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


def grammar_libs_main() -> None:
    global adapter_vocab, eos
    ap = argparse.ArgumentParser(description=GRAMMAR_LIBS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    for feature, verdict in lib_coverage(adapter, hf):
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
            out, times, end = lib_generate(lm, adapter, compiled, ids, temp, seed, args.max_tokens)
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


if __name__ == "__main__":
    grammar_libs_main()


# ---- the grammar cases ----------------------------------------------------------------------------
# Grammar cases shared by grammar-libs and constraints.
# 
# COVERAGE: (feature, schema or (kind, text), valid examples, invalid examples); a library
# "enforces" a feature when every valid example passes token by token and no invalid one does.
# GENERATIONS: (name, kind, text, prompt) for the per-token cost on real generations.

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

TOOL_CALL_SCHEMA = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER_TOOL["function"]["parameters"]},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_CALL = json.dumps({"begin": "<tool_call>\n", "schema": TOOL_CALL_SCHEMA, "end": "\n</tool_call>"})

# llama.cpp grammars/arithmetic.gbnf
ARITHMETIC_GBNF = r"""root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""
YES_NO_GBNF = 'root ::= ("yes" | "no") " because " [a-z ]{1,40} "."\n'

COVERAGE = [
    ("nested objects", {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "string"}}, "required": ["b"]}}, "required": ["a"]},
     ['{"a": {"b": "x"}}'], ['{"a": {}}', '{"a": 1}']),
    ("enum", {"enum": ["red", "green", 3]}, ['"red"', "3"], ['"blue"', "4"]),
    ("array minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
     ["[1, 2]", "[1,2,3]"], ["[1]", "[1, 2, 3, 4]"]),
    ("integer minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 12},
     ["7", "12"], ["0", "13", "-5", "100"]),
    ("string minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 4},
     ['"ab"', '"abcd"'], ['"a"', '"abcde"']),
    ("string pattern", {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"}, ['"abc-12"'], ['"ab-12"', '"abc-1"']),
    ("string format date", {"type": "string", "format": "date"}, ['"2024-01-31"'], ['"yesterday"']),
    ("string format email", {"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"not an email"']),
    ("$ref/$defs", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                    "type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}}, "required": ["p"]},
     ['{"p": {"x": 1}}'], ['{"p": {"x": "1"}}']),
    ("recursive $ref", {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"},
     ['{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}'], ['{"kids": []}']),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "enum": ["none"]}]}, ["5", '"none"'], ['"x"']),
    ("additionalProperties false", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                    "additionalProperties": False}, ['{"a": 1}'], ['{"a": 1, "b": 2}', "{}"]),
    ("number exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, ["0.5", "3"], ["0", "-1"]),
    ("integer range 10..999", {"type": "integer", "minimum": 10, "maximum": 999}, ["10", "999", "57"],
     ["9", "1000", "-10"]),
    ("number minimum/maximum", {"type": "number", "minimum": -1.5, "maximum": 2.5}, ["-1.5", "0.25", "2"],
     ["-2", "2.6", "30"]),
    ("const", {"const": "fixed"}, ['"fixed"'], ['"other"']),
    ("oneOf", {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, ["true", "null"], ["1"]),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a": 1, "b": "x"}'], ['{"a": 1}']),
    ("prefixItems (tuple)", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                             "items": False}, ['[1, "a"]'], ['["a", 1]', '[1, "a", 2]']),
    ("deep recursion (depth 6)", {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
                                  "$ref": "#/$defs/n"},
     ['{"c": {"c": {"c": {"c": {"c": {"c": {}}}}}}}'], ['{"c": 1}']),
    ("json_object (any object)", ("json_object", ""), ['{"x": [1, {"y": null}]}', "{}"], ["[1]", '"s"']),
    ("gbnf", ("gbnf", YES_NO_GBNF), ["yes because it is."], ["maybe because x."]),
    ("regex", ("regex", r"\d{4}-\d{2}-\d{2}"), ["2024-01-31"], ["2024-1-31"]),
]

GENERATIONS = [
    ("json_object", "json_object", "", "Describe a cat as a JSON object."),
    ("nested", "json_schema", json.dumps(PERSON), "Give me a JSON record for a user named Ann who lives in Paris."),
    ("tool_call", "tool_call", TOOL_CALL, "What is the weather in Paris?"),
    ("gbnf", "gbnf", ARITHMETIC_GBNF, "Write two arithmetic equations."),
    ("regex", "regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "What is today's date?"),
]


# ---- the library adapters -------------------------------------------------------------------------
# Adapters over the three constrained-decoding libraries we compared (llguidance, xgrammar,
# outlines-core), used only by grammar-libs. Each is imported lazily: run the
# comparison under a scratch venv that has the one library installed.
# 
# Every adapter fills the same int32 bitmask (bit i of word w allows token 32*w + i).

class Unsupported(Exception):
    """The library has no way to express this kind of grammar."""


def _tool_parts(text: str) -> tuple[str, dict, str]:
    spec = json.loads(text)
    return spec["begin"], spec["schema"], spec["end"]


class LLGuidance:
    name = "llguidance"

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: list[int]):
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(hf_tokenizer.backend_tokenizer.to_str(), n_vocab=vocab_size,
                                          eos_token=eos_ids)

    def compile(self, kind: str, text: str) -> Any:
        M = self.ll.LLMatcher
        if kind == "json_schema":
            grammar = M.grammar_from_json_schema(text)
        elif kind == "json_object":
            grammar = M.grammar_from_json_schema('{"type": "object"}')
        elif kind == "gbnf":
            grammar = self.ll.grammar_from("gbnf", text)
        elif kind == "regex":
            grammar = M.grammar_from_regex(text)
        else:
            begin, schema, end = _tool_parts(text)
            grammar = M.grammar_from_lark(
                f"start: {json.dumps(begin)} call {json.dumps(end)}\ncall: %json {json.dumps(schema)}"
            )
        error = M.validate_grammar(grammar, self.tok)
        if error:
            raise ValueError(error)
        return grammar

    def matcher(self, compiled: Any) -> "LLGuidanceMatcher":
        return LLGuidanceMatcher(self.ll.LLMatcher(self.tok, compiled, log_level=0))


class LLGuidanceMatcher:
    def __init__(self, m):
        self.m = m

    def fill(self, row: np.ndarray) -> None:
        self.m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def accept(self, token: int) -> bool:
        return self.m.consume_token(token)

    def accepting(self) -> bool:
        return self.m.is_accepting()

    def stopped(self) -> bool:
        return self.m.is_stopped()


class XGrammar:
    name = "xgrammar"

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: list[int]):
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=eos_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, kind: str, text: str) -> Any:
        xgr, c = self.xgr, self.compiler
        if kind == "json_schema":
            return c.compile_json_schema(text)
        if kind == "json_object":
            return c.compile_json_schema('{"type": "object"}')
        if kind == "gbnf":
            return c.compile_grammar(text)
        if kind == "regex":
            return c.compile_regex(text)
        begin, schema, end = _tool_parts(text)
        return c.compile_grammar(xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(begin)}"),
            xgr.Grammar.from_json_schema(json.dumps(schema)),
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(end)}"),
        ))

    def matcher(self, compiled: Any) -> "XGrammarMatcher":
        return XGrammarMatcher(self.xgr, compiled)


class XGrammarMatcher:
    def __init__(self, xgr, compiled):
        self.m = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)

    def fill(self, row: np.ndarray) -> None:
        self.m.fill_next_token_bitmask(self.bitmask)
        row[:] = self.bitmask.numpy()[0, : row.shape[0]]

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)

    def accepting(self) -> bool:
        return self.m.is_completed()

    def stopped(self) -> bool:
        return self.m.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: list[int]):
        import outlines_core as oc
        from mlx_lm.tokenizer_utils import _byte_decoder

        self.oc = oc
        decoder = _byte_decoder()
        special = set(hf_tokenizer.all_special_ids)
        table: dict[bytes, list[int]] = {}
        for token, i in hf_tokenizer.get_vocab().items():
            if i in special or i >= vocab_size:
                continue
            table.setdefault(bytes(decoder[c] for c in token), []).append(i)
        self.vocab = oc.Vocabulary(eos_ids[0], table)

    def compile(self, kind: str, text: str) -> Any:
        schema = self.oc.json_schema.build_regex_from_schema
        if kind == "json_schema":
            regex = schema(text)
        elif kind == "json_object":
            regex = schema('{"type": "object"}')
        elif kind == "regex":
            regex = text
        elif kind == "tool_call":
            begin, spec, end = _tool_parts(text)
            regex = _regex_literal(begin) + schema(json.dumps(spec)) + _regex_literal(end)
        else:
            raise Unsupported("outlines-core compiles regular languages only (no CFG/GBNF)")
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled: Any) -> "OutlinesMatcher":
        return OutlinesMatcher(self.oc.Guide(compiled))


class OutlinesMatcher:
    def __init__(self, guide):
        self.g = guide

    def fill(self, row: np.ndarray) -> None:
        self.g.write_mask_into(row.ctypes.data, row.shape[0], 4)

    def accept(self, token: int) -> bool:
        try:
            self.g.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False

    def accepting(self) -> bool:
        return self.g.is_finished()

    def stopped(self) -> bool:
        return self.g.is_finished() and len(self.g.get_tokens()) <= 1


def _regex_literal(text: str) -> str:
    import re

    return re.escape(text)


ADAPTERS = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines-core": OutlinesCore}
