"""Adapters over the three constrained-decoding libraries we compared (llguidance, xgrammar,
outlines-core), used only by bench/compare_grammar_libs.py. Each is imported lazily: run the
comparison under a scratch venv that has the one library installed.

Every adapter fills the same int32 bitmask (bit i of word w allows token 32*w + i)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

KINDS = ("json_schema", "json_object", "gbnf", "regex", "tool_call")


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
