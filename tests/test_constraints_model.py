"""The default model (SmolLM2-135M-Instruct), whose template knows no tools, makes a valid forced call.

Random sampling under schemas is covered on the tiny model (test_constraints_sampling.py)."""

import json

import jsonschema
import pytest

from mlxcel_py.engine.runner.constraints import ConstraintCompiler
from mlxcel_py.engine.runner.sampling import SequenceSampler
from mlxcel_py.engine.core.request import SamplingParams
from mlxcel_py.models import encode_chat
from mlxcel_py.tool_calls import call_constraint, tool_format, tool_messages, tool_request

from constrained import generate
from tool_call_helpers import parse_tool_calls

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def real():
    from mlxcel_py.models import load_model

    lm = load_model(None)
    return lm, ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)


def reply(lm, compiler, messages, spec, tools=None) -> str:
    prompt = encode_chat(lm.tokenizer, messages, tools=tools)
    sampler = SequenceSampler(SamplingParams(constraint=spec), matcher=compiler.matcher(spec))
    return generate(lm, prompt.ids, sampler, compiler, 160)


@pytest.mark.slow
def test_the_default_model_makes_a_valid_required_tool_call(real):
    lm, compiler = real
    req = tool_request([WEATHER], "required", False)
    fmt = tool_format(lm.tokenizer)
    messages, tools = tool_messages([{"role": "user", "content": "Weather in Paris?"}], req, fmt)
    text = reply(lm, compiler, messages, call_constraint(req, fmt), tools)
    content, calls = parse_tool_calls(text, fmt, req.as_openai(), req.parallel)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
