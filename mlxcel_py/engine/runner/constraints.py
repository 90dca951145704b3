"""Constrained decoding on llguidance: compile a ConstraintSpec against the model's tokenizer
once, and give each sequence a matcher that says which tokens may come next.

No MLX here: masks are numpy int32 bitmasks (bit i of word w allows token 32*w + i), which
engine/runner/logits.py applies to the logits. See docs/STRUCTURED_OUTPUT.md."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable, Optional

import llguidance
import numpy as np

from ...errors import RequestError
from ...models.vocab import backend_tokenizer, hf_tokenizer
from ..core.request import ConstraintSpec

if TYPE_CHECKING:
    from ...models import LoadedModel

# llama.cpp json-schema-to-grammar's `space`: one space, or a newline and up to 20 indent
# characters. Unbounded whitespace lets a small model loop on newlines forever.
JSON_WHITESPACE = r"(\x20|\n[\x20\t]{0,20})?"
JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}


class GrammarError(RequestError):
    """A constraint the grammar library cannot compile; the message names the problem.

    `param` is left to the HTTP layer, which knows which field carried the grammar."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"invalid {kind} constraint: {message}")
        self.kind = kind


class ConstraintsUnavailable(RequestError):
    """This model's tokenizer cannot drive constrained decoding (it is not a `tokenizers` one)."""


class ConstraintViolation(RuntimeError):
    """A token the grammar forbids reached a matcher: a bug, since the mask forbade it."""


def _first_lines(message: str, limit: int = 300) -> str:
    # llguidance appends a parser-state dump after the error; the user needs the error.
    head = " ".join(line.strip() for line in message.split("<state>")[0].splitlines() if line.strip())
    return head[:limit] or "the grammar does not compile"


def _json_document(kind: str, text: str) -> Any:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(kind, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise GrammarError(kind, "must be a JSON object")
    return doc


def _schema(schema: dict) -> dict:
    """The schema with our whitespace rule; the schema's own x-guidance options win."""
    own = schema.get("x-guidance", {})
    if not isinstance(own, dict):
        raise GrammarError("json_schema", "x-guidance must be an object")
    options = {**JSON_OPTIONS, **own}
    return {**schema, "x-guidance": options}


def _tool_call_lark(kind: str, text: str, literal) -> str:
    spec = _json_document(kind, text)
    missing = [k for k in ("start", "end", "schema") if k not in spec]
    if missing:
        raise GrammarError(kind, f"missing {', '.join(missing)}")
    if not isinstance(spec["schema"], dict):
        raise GrammarError(kind, "schema must be a JSON object")
    calls = 'call ("\\n" call)*' if spec.get("parallel") else "call"
    return (
        f"start: {calls}\n"
        f'call: {literal(spec["start"])} "\\n" body "\\n" {literal(spec["end"])}\n'
        f"body: %json {json.dumps(_schema(spec['schema']))}\n"
    )


def grammar_text(spec: ConstraintSpec, literal=json.dumps) -> str:
    """The llguidance grammar for a spec (no tokenizer needed); raises GrammarError."""
    M = llguidance.LLMatcher
    if spec.kind == "json_object":
        return M.grammar_from_json_schema(_schema({"type": "object"}))
    if spec.kind == "json_schema":
        return M.grammar_from_json_schema(_schema(_json_document(spec.kind, spec.text)))
    if spec.kind == "regex":
        return M.grammar_from_regex(spec.text)
    if spec.kind == "gbnf":
        try:
            return llguidance.grammar_from("gbnf", spec.text)
        except ValueError as exc:
            raise GrammarError(spec.kind, _first_lines(str(exc))) from None
    return M.grammar_from_lark(_tool_call_lark(spec.kind, spec.text, literal))


def _backend_json(tokenizer: Any) -> str:
    """The `tokenizers` JSON of an mlx-lm TokenizerWrapper, a transformers fast tokenizer or a Tokenizer."""
    backend = backend_tokenizer(tokenizer)
    if backend is None:
        raise ConstraintsUnavailable("constrained decoding needs a `tokenizers` (fast) tokenizer; "
                                     f"this model's is {type(hf_tokenizer(tokenizer)).__name__}")
    return backend.to_str()


class ConstraintCompiler:
    """One per model: llguidance's tokenizer tables (built on first use, about 1 s) and a
    bounded LRU of compiled grammars keyed by (kind, text). Thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int], cache_size: int = 64):
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self._source = tokenizer
        self._ll_tokenizer: Optional[llguidance.LLTokenizer] = None
        self._special: dict[str, int] = {}
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._executor: Optional[llguidance.LLExecutor] = None

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    _backend_json(self._source), n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids))
                self._special = _special_tokens(self._source, self._ll_tokenizer)
            return self._ll_tokenizer

    def _literal(self, text: str) -> str:
        # A marker that is one special token (e.g. Qwen's <tool_call>) must be matched as that token.
        token = self._special.get(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    def compile(self, spec: ConstraintSpec) -> llguidance.LLMatcher:
        """The pristine matcher for a spec, compiled once; raises GrammarError."""
        key = (spec.kind, spec.text)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        tokenizer = self.ll_tokenizer
        grammar = grammar_text(spec, self._literal)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(spec.kind, _first_lines(matcher.get_error()))
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return matcher

    def matcher(self, spec: ConstraintSpec) -> "ConstraintMatcher":
        """A fresh matcher for one sequence (a copy of the compiled one: microseconds)."""
        trigger = self.trigger_ids(spec.trigger) if spec.trigger else ()
        return ConstraintMatcher(self.compile(spec).deep_copy(), self.num_words, trigger)

    def trigger_ids(self, text: str) -> tuple[int, ...]:
        """The token ids of a lazy grammar's trigger: the vocabulary's own token where the text is one."""
        tokenizer = self.ll_tokenizer
        token = self._special.get(text)
        return (token,) if token is not None else tuple(tokenizer.tokenize_str(text, parse_special=True))

    def fill_bitmasks(self, matchers: list[tuple["ConstraintMatcher", int]], out: np.ndarray) -> None:
        """Fill row `i` of the (B, words) int32 `out` for each (matcher, i), in parallel threads."""
        if len(matchers) == 1:
            matcher, row = matchers[0]
            matcher.fill(out[row])
            return
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr(
            [(m.ll, i) for m, i in matchers], out.ctypes.data, self.num_words * 4, out.shape[0])


def _special_tokens(tokenizer: Any, ll: llguidance.LLTokenizer) -> dict[str, int]:
    # llguidance treats every added token as special (Qwen3's <tool_call> too, which is not
    # `special` in its tokenizer.json): text cannot spell them, only the token can.
    decoder = getattr(backend_tokenizer(tokenizer), "get_added_tokens_decoder", lambda: {})()
    return {tok.content: i for i, tok in decoder.items() if getattr(tok, "special", False) or ll.is_special_token(i)}


class ConstraintMatcher:
    """One sequence's grammar state: the mask of allowed next tokens, and the tokens taken.

    With `trigger` ids (a lazy grammar) it stays inactive, allowing anything, until the output
    ends with them; they are then fed to the grammar, which constrains from there on."""

    def __init__(self, ll: llguidance.LLMatcher, num_words: int, trigger: tuple[int, ...] = ()):
        self.ll = ll
        self.num_words = num_words
        self.trigger = trigger
        self.active = not trigger
        self._recent: list[int] = []  # the latest tokens, while waiting for the trigger

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed-token bitmask into a contiguous int32 row of `num_words` words."""
        if row.dtype != np.int32 or row.shape != (self.num_words,) or not row.flags["C_CONTIGUOUS"]:
            raise ValueError(f"the bitmask row must be a contiguous int32 array of {self.num_words} words")
        self.ll.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def bitmask(self) -> np.ndarray:
        row = np.empty(self.num_words, dtype=np.int32)
        self.fill(row)
        return row

    def allows(self, token: int) -> bool:
        """Whether the grammar would take `token` now (nothing is consumed)."""
        return self.ll.validate_tokens([int(token)]) == 1

    def accept(self, token: int) -> None:
        """Advance over a sampled token (EOS included, once the grammar accepts)."""
        if not self.active:
            self._recent = (self._recent + [int(token)])[-len(self.trigger):]
            if tuple(self._recent) != self.trigger:
                return
            self.active = True
            if not self.ll.consume_tokens(list(self.trigger)):
                raise ConstraintViolation(f"the trigger {self.trigger} does not open the grammar: "
                                          f"{_first_lines(self.ll.get_error())}")
            return
        if not self.ll.consume_token(int(token)):
            raise ConstraintViolation(f"token {token} is not allowed here: {_first_lines(self.ll.get_error())}")

    @property
    def done(self) -> bool:
        """Nothing but EOS can follow (or EOS was taken): the sequence can stop."""
        return self.active and self.ll.is_stopped()


def compiler_for(loaded: "LoadedModel") -> ConstraintCompiler:
    """The model's grammar compiler (its tokenizer tables are built on the first constrained request)."""
    return ConstraintCompiler(loaded.tokenizer, vocab_size=loaded.logits_width, eos_token_ids=loaded.eos_token_ids)
