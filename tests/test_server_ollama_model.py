"""Ollama's API on the default model (SmolLM2-135M), where the output must mean something: the
official `ollama` client gets the right answer, streamed as whole, and schema-valid JSON."""

import json

import jsonschema
import ollama
import pytest

from mlxcel_py.models import load_model
from server_helpers import start_server, stop_server

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name the capital of France."}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["country", "capital"],
          "properties": {"country": {"type": "string", "maxLength": 20}, "capital": {"type": "string", "maxLength": 20}}}


@pytest.fixture(scope="module")
def client():
    running = start_server(parallel=2, model=load_model(None))
    yield ollama.Client(host=running.url, timeout=120)
    stop_server(running)


def test_the_answer_streamed_and_whole(client):
    kwargs = {"model": "smollm2", "messages": ASK, "options": {"temperature": 0, "num_predict": 24}}
    whole = client.chat(**kwargs)
    assert "Paris" in whole.message.content
    assert "".join(p.message.content for p in client.chat(stream=True, **kwargs)) == whole.message.content


def test_format_schema_on_the_default_model(client):
    reply = client.chat(model="smollm2", messages=[{"role": "user", "content": "Name France's capital as JSON."}],
                        format=SCHEMA, options={"temperature": 0, "num_predict": 80})
    value = json.loads(reply.message.content)
    jsonschema.validate(value, SCHEMA)
    assert reply.done_reason == "stop" and reply.eval_count < 80


def test_ps_reports_no_vram_for_the_cpu_block_weights(client):
    """The default model on the CPU holds the GGUF's blocks (`--cpu-weights native` on AVX2) or float32."""
    (entry,) = client.ps().models
    assert entry.size > 0 and entry.size_vram == 0
