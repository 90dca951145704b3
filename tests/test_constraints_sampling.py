"""Random sampling from random logits under a grammar mask always yields documents that a
second implementation (`jsonschema`) validates: the whole pipeline of engine/runner/sampling.py."""

import json

import jsonschema
import mlx.core as mx
import pytest

from mlxcel_py.engine.runner.constraints import ConstraintCompiler
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step
from mlxcel_py.engine.core.request import ConstraintSpec, SamplingParams

from tiny import tiny_model

MAX_STEPS = 1500
TEXT = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "nested with enum and bounds": {
        "type": "object",
        "properties": {
            "name": TEXT,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", 7, None]},
            "address": {"type": "object", "properties": {"city": TEXT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False},
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": False,
    },
    "array with min and max items": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                                     "minItems": 2, "maxItems": 4},
    "refs and anyOf": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1}},
                            "required": ["x"], "additionalProperties": False}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"}, "q": {"anyOf": [{"type": "boolean"}, {"const": "none"}]},
                       "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["p", "q"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def setup():
    lm = tiny_model()
    return lm, ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)


def sample_document(lm, compiler, spec: ConstraintSpec, seed: int) -> str:
    """Sample under the mask from random logits (temperature 1) until EOS."""
    sampler = SequenceSampler(SamplingParams(temperature=1.0, seed=seed), matcher=compiler.matcher(spec))
    key, tokens = mx.random.key(1000 + seed), []
    for _ in range(MAX_STEPS):
        key, sub = mx.random.split(key)
        logits = 3.0 * mx.random.normal((1, lm.model.args.vocab_size), key=sub)
        (out,) = sample_step(logits, [sampler], compiler)
        if out.token_id in lm.eos_token_ids:
            assert sampler.matcher.done
            return lm.tokenizer.decode(tokens)
        tokens.append(out.token_id)
    raise AssertionError(f"no EOS after {MAX_STEPS} tokens: {lm.tokenizer.decode(tokens)[:200]!r}")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("seed", range(4))
def test_random_sampling_under_a_schema_always_validates(setup, name, seed):
    lm, compiler = setup
    schema = SCHEMAS[name]
    text = sample_document(lm, compiler, ConstraintSpec("json_schema", json.dumps(schema)), seed)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("seed", range(3))
def test_random_sampling_under_a_tool_call_yields_a_call_whose_arguments_validate(setup, seed):
    lm, compiler = setup
    arguments = {"type": "object", "properties": {"city": TEXT, "unit": {"enum": ["celsius", "fahrenheit"]}},
                 "required": ["city", "unit"], "additionalProperties": False}
    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": arguments},
              "required": ["name", "arguments"], "additionalProperties": False}
    spec = ConstraintSpec("tool_call", json.dumps(
        {"start": "<tool_call>", "end": "</tool_call>", "schema": schema, "parallel": False}))
    text = sample_document(lm, compiler, spec, seed)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], arguments)
