"""Constrained decoding on llguidance with the tiny model's tokenizer: exact masks, EOS exactly
when the grammar accepts, compile errors that name the problem, and the compile cache."""

import json

import numpy as np
import pytest

from mlxcel_py.engine.runner.constraints import ConstraintCompiler, ConstraintViolation, GrammarError
from mlxcel_py.engine.core.request import ConstraintSpec
from mlxcel_py.errors import RequestError

from tiny import tiny_model

EOS = 2


def allowed_ids(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids a bitmask row allows."""
    return np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab_size])


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


@pytest.fixture(scope="module")
def compiler(lm):
    return ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)


def allowed(matcher, vocab) -> set[int]:
    return set(allowed_ids(matcher.bitmask(), vocab).tolist())


def token_texts(lm) -> dict[int, str]:
    vocab = lm.model.args.vocab_size
    return {i: lm.tokenizer.decode([i]) for i in range(vocab)}


def drive(matcher, ids, vocab) -> None:
    """Feed tokens one by one, checking each was allowed by the mask before it."""
    for t in ids:
        assert t in allowed(matcher, vocab), f"token {t} was masked"
        matcher.accept(t)


def test_matcher_accepts_a_valid_json_document_token_by_token(lm, compiler):
    vocab = lm.model.args.vocab_size
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"]}
    m = compiler.matcher(ConstraintSpec("json_schema", json.dumps(schema)))
    ids = lm.tokenizer.encode('{"a": [1, 23]}', add_special_tokens=False)
    assert not m.ll.is_accepting() and EOS not in allowed(m, vocab)
    drive(m, ids[:-1], vocab)
    assert not m.ll.is_accepting() and EOS not in allowed(m, vocab)
    drive(m, ids[-1:], vocab)
    assert m.ll.is_accepting() and m.done and allowed(m, vocab) == set(lm.eos_token_ids)  # every end-of-turn id
    m.accept(EOS)
    assert m.done


def test_the_mask_is_exactly_the_tokens_that_keep_a_word_of_the_language_reachable(lm, compiler):
    # A second implementation: over a finite language, a token is allowed iff its text is a
    # prefix of what remains of some word, and EOS iff the text so far is a whole word.
    texts, vocab = token_texts(lm), lm.model.args.vocab_size
    words = ["the cat", "the dog", "thermal", "7"]
    m = compiler.matcher(ConstraintSpec("regex", "|".join(words)))
    done = ""
    for step in "the d":
        expect = {i for i, t in texts.items() if t and i != EOS and any(w.startswith(done + t) for w in words)}
        assert allowed(m, vocab) == expect
        (token,) = lm.tokenizer.encode(step, add_special_tokens=False)
        m.accept(token)
        done += step
    assert allowed(m, vocab) == {i for i, t in texts.items() if t and "the dog".startswith(done + t)}


def test_eos_is_allowed_exactly_when_the_grammar_accepts(lm, compiler):
    vocab = lm.model.args.vocab_size
    m = compiler.matcher(ConstraintSpec("regex", "(ab)+"))
    a, b = (lm.tokenizer.encode(c, add_special_tokens=False)[0] for c in "ab")
    for token, accepting in ((a, False), (b, True), (a, False), (b, True)):
        m.accept(token)
        assert m.ll.is_accepting() is accepting and (EOS in allowed(m, vocab)) is accepting
        assert not m.done  # more "ab" may follow


def test_a_forbidden_token_raises_rather_than_corrupting_the_state(lm, compiler):
    m = compiler.matcher(ConstraintSpec("regex", "[0-9]+"))
    (letter,) = lm.tokenizer.encode("x", add_special_tokens=False)
    with pytest.raises(ConstraintViolation, match=f"token {letter} is not allowed"):
        m.accept(letter)


def test_gbnf_and_json_object(lm, compiler):
    vocab = lm.model.args.vocab_size
    gbnf = 'root ::= ("yes" | "no") " because " [a-z ]{1,40} "."\n'
    m = compiler.matcher(ConstraintSpec("gbnf", gbnf))
    drive(m, lm.tokenizer.encode("no because it is.", add_special_tokens=False), vocab)
    assert m.done
    m = compiler.matcher(ConstraintSpec("json_object"))
    (bracket,) = lm.tokenizer.encode("[", add_special_tokens=False)
    assert bracket not in allowed(m, vocab)
    drive(m, lm.tokenizer.encode('{"x": [1, {"y": null}]}', add_special_tokens=False), vocab)
    assert m.ll.is_accepting()


def tool_spec(parallel: bool, start: str = "<tool_call>") -> ConstraintSpec:
    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["name", "arguments"]}
    return ConstraintSpec("tool_call", json.dumps(
        {"start": start, "end": "</tool_call>", "schema": schema, "parallel": parallel}))


def test_tool_call_structure_single_and_parallel(lm, compiler):
    vocab = lm.model.args.vocab_size
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    single = compiler.matcher(tool_spec(False))
    drive(single, lm.tokenizer.encode(call, add_special_tokens=False), vocab)
    assert single.done  # one call only: EOS must follow
    parallel = compiler.matcher(tool_spec(True))
    drive(parallel, lm.tokenizer.encode(call + "\n" + call, add_special_tokens=False), vocab)
    assert parallel.ll.is_accepting() and not parallel.done
    wrong = compiler.matcher(tool_spec(False))
    drive(wrong, lm.tokenizer.encode('<tool_call>\n{"name": "', add_special_tokens=False), vocab)
    (o,) = lm.tokenizer.encode("o", add_special_tokens=False)
    assert allowed(wrong, vocab) == set(lm.tokenizer.encode("g", add_special_tokens=False))  # "get_weather" only
    with pytest.raises(ConstraintViolation):
        wrong.accept(o)


def test_a_marker_that_is_a_special_token_is_matched_as_that_token(lm, compiler):
    m = compiler.matcher(tool_spec(False, start="<|im_start|>"))
    assert allowed(m, lm.model.args.vocab_size) == {1}


@pytest.mark.parametrize("spec, message", [
    (ConstraintSpec("json_schema", "{not json"), "invalid json_schema constraint: not valid JSON"),
    (ConstraintSpec("json_schema", "[1]"), "invalid json_schema constraint: must be a JSON object"),
    (ConstraintSpec("json_schema", '{"type": "array", "uniqueItems": true}'), "Unimplemented keys: [\"uniqueItems\"]"),
    (ConstraintSpec("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}'), "minimum (5) is greater"),
    (ConstraintSpec("json_schema", '{"$ref": "#/$defs/nope"}'), "'/$defs/nope' does not exist"),
    (ConstraintSpec("regex", "a("), "invalid regex constraint: .*unclosed group"),
    (ConstraintSpec("gbnf", "root ::= foo"), "invalid gbnf constraint: .*Rule 'foo' not found"),
    (ConstraintSpec("tool_call", '{"start": "<a>"}'), "invalid tool_call constraint: missing end, schema"),
])
def test_a_spec_that_cannot_compile_raises_a_grammar_error_naming_the_problem(compiler, spec, message):
    with pytest.raises(GrammarError, match=message if ".*" in message else None) as info:
        compiler.compile(spec)
    assert isinstance(info.value, RequestError) and info.value.kind == spec.kind
    if ".*" not in message:
        assert message in str(info.value)


def test_compiled_grammars_are_cached_by_kind_and_text_in_a_bounded_lru(lm):
    small = ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids, cache_size=2)
    a, b, c = (ConstraintSpec("regex", r) for r in ("a+", "b+", "c+"))
    first_a, first_b = small.compile(a), small.compile(b)
    assert small.compile(ConstraintSpec("regex", "a+")) is first_a  # same (kind, text): a hit; b is now oldest
    small.compile(c)  # evicts b
    assert small.compile(a) is first_a
    assert small.compile(b) is not first_b  # compiled again


def test_matchers_from_one_compiled_grammar_are_independent(lm, compiler):
    vocab = lm.model.args.vocab_size
    spec = ConstraintSpec("regex", "ab|cd")
    m1, m2 = compiler.matcher(spec), compiler.matcher(spec)
    m1.accept(lm.tokenizer.encode("a", add_special_tokens=False)[0])
    assert allowed(m2, vocab) != allowed(m1, vocab)
    assert allowed(m2, vocab) == allowed(compiler.matcher(spec), vocab)


def test_parallel_fill_equals_one_fill_per_matcher(lm, compiler):
    specs = [ConstraintSpec("regex", "[0-9]+"), ConstraintSpec("json_object"), ConstraintSpec("regex", "x|yz")]
    matchers = [compiler.matcher(s) for s in specs]
    out = np.full((4, compiler.num_words), -1, dtype=np.int32)
    compiler.fill_bitmasks([(m, i) for i, m in zip((0, 2, 3), matchers)], out)
    for i, m in zip((0, 2, 3), matchers):
        assert np.array_equal(out[i], m.bitmask())
    assert (out[1] == -1).all()


def test_constraint_spec_is_plain_validated_data():
    with pytest.raises(RequestError, match="constraint kind must be one of"):
        ConstraintSpec("yaml", "x")
    with pytest.raises(RequestError, match="the regex constraint is empty"):
        ConstraintSpec("regex", " ")
    with pytest.raises(RequestError, match="the gbnf constraint is too long"):
        ConstraintSpec("gbnf", "x" * (1 << 20 | 1))
    with pytest.raises(RequestError, match="the json_object constraint takes no text"):
        ConstraintSpec("json_object", '{"type": "object"}')
    assert ConstraintSpec("json_object") == ConstraintSpec("json_object", "")


def test_a_tokenizer_without_tokenizers_tables_is_refused_with_a_clear_error():
    from mlxcel_py.engine.runner.constraints import ConstraintsUnavailable

    class SlowTokenizer:
        pass

    compiler = ConstraintCompiler(SlowTokenizer(), 100, [2])
    with pytest.raises(ConstraintsUnavailable, match="needs a `tokenizers` .* this model's is SlowTokenizer"):
        compiler.compile(ConstraintSpec("regex", "a"))
