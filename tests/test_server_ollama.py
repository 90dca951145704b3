"""Ollama's native API with the official `ollama` client against a real server on the tiny model:
chat and generate (streamed and whole), list, show, ps, version, tools, `format`, options, the
statistics, and Ollama-shaped errors."""

import json
import time

import httpx
import jsonschema
import ollama
import pytest

from mlxcel_py.engine import Finished, Timings, TokenDelta, Usage
from mlxcel_py.server.generation.assembler import Assembler, Shape, ToolParsing
from mlxcel_py.server.ollama.shapes import OllamaFramer, OllamaReply, whole_json
from mlxcel_py.tool_calls import tool_format
from server_helpers import start_server, stop_server, wait_for
from tiny import tiny_model

HELLO = [{"role": "user", "content": "Hello, how are you today?"}]
GREEDY = {"temperature": 0, "num_predict": 8}
STATS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
         "eval_duration")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "n"],
          "properties": {"city": {"enum": ["Paris", "Rome"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2, model_alias="local-model")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host=srv.url, timeout=60)


@pytest.fixture(scope="module")
def http(srv):
    with srv.client() as c:
        yield c


def check_stats(reply) -> None:
    """Every statistic is there, in nanoseconds, and the parts fit in the whole."""
    values = {name: getattr(reply, name) for name in STATS}
    assert all(isinstance(v, int) and v >= 0 for v in values.values()), values
    assert values["eval_count"] > 0 and values["prompt_eval_count"] > 0 and values["eval_duration"] > 0
    assert values["total_duration"] >= values["prompt_eval_duration"] + values["eval_duration"]


def test_chat(client):
    reply = client.chat(model="any-name", messages=HELLO, options=GREEDY)
    assert reply.model == "local-model"  # any name is accepted; the served id is reported
    assert reply.message.role == "assistant" and reply.message.content and not reply.message.tool_calls
    assert (reply.done, reply.done_reason, reply.eval_count) == (True, "length", 8)
    assert reply.created_at.endswith("Z")
    check_stats(reply)


def test_streamed_chat_is_the_whole_reply(client):
    kwargs = {"model": "m", "messages": [{"role": "user", "content": "Tell me about foxes."}],
              "options": {**GREEDY, "num_predict": 16, "seed": 7}}
    whole = client.chat(**kwargs)
    pieces = list(client.chat(stream=True, **kwargs))
    assert [p.done for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert "".join(p.message.content for p in pieces) == whole.message.content
    last = pieces[-1]
    assert (last.message.content, last.done_reason, last.eval_count) == ("", "length", 16)
    assert all(p.total_duration is None for p in pieces[:-1])  # the statistics come last
    check_stats(last)


def test_the_stream_is_ndjson_by_default(srv):
    body = {"model": "m", "messages": HELLO, "options": GREEDY}
    with httpx.stream("POST", srv.url + "/api/chat", json=body, timeout=60) as resp:
        assert resp.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert lines[0].keys() == {"model", "created_at", "message", "done"}
    assert lines[-1]["done"] is True and set(STATS) <= lines[-1].keys()


def _tokenize(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]


def test_generate_raw_context_and_eval_count(client, http):
    reply = client.generate(model="m", prompt="The quick brown fox", raw=True, options={**GREEDY, "num_predict": 6})
    prompt = _tokenize(http, "The quick brown fox")
    assert reply.context[:len(prompt)] == prompt  # context: the prompt's ids, then the reply's
    assert len(reply.context) - len(prompt) == reply.eval_count == 6 and reply.done_reason == "length"
    detokenized = http.post("/detokenize", json={"tokens": reply.context[len(prompt):]}).json()["content"]
    assert detokenized == reply.response
    check_stats(reply)
    again = client.generate(model="m", prompt=" jumps", raw=True, context=reply.context, options=GREEDY)
    assert again.context[:len(reply.context)] == reply.context  # the conversation continues


def test_streamed_generate_is_the_whole_reply(client):
    kwargs = {"model": "m", "prompt": "Say hello", "system": "You are terse.", "options": {**GREEDY, "num_predict": 12}}
    whole = client.generate(**kwargs)
    pieces = list(client.generate(stream=True, **kwargs))
    assert "".join(p.response for p in pieces) == whole.response
    assert pieces[-1].context == whole.context and pieces[-1].eval_count == 12
    plain = client.generate(model="m", prompt="Say hello", options={**GREEDY, "num_predict": 12})
    assert plain.context != whole.context  # the system turn is part of the prompt


def test_stop_option(client):
    full = client.generate(model="m", prompt="Hello", options={**GREEDY, "num_predict": 24}).response
    stop = next(full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].isalnum())
    reply = client.generate(model="m", prompt="Hello", options={**GREEDY, "num_predict": 24, "stop": [stop]})
    assert reply.done_reason == "stop" and reply.response == full[: full.index(stop)]
    assert reply.eval_count < 24


def test_list_show_ps_version(client, srv, http):
    (entry,) = client.list().models
    assert entry.model == "local-model" and entry.details.format == "gguf" and entry.details.family == "llama"
    assert len(entry.digest) == 64
    shown = client.show("whatever")
    assert shown.template == tiny_model().tokenizer.chat_template
    assert shown.modelinfo["llama.context_length"] == tiny_model().context_length
    assert shown.capabilities == ["completion", "tools"] and "temperature" in shown.parameters
    (loaded,) = client.ps().models
    assert loaded.model == "local-model" and loaded.context_length == srv.worker.stats().slot_context
    assert loaded.expires_at.year == 9999  # never unloaded
    assert http.get("/api/version").json()["version"] == "0.12.0"


def test_format_schema(client):
    reply = client.chat(model="m", messages=[{"role": "user", "content": "Pick a city."}], format=SCHEMA,
                        options={"temperature": 0, "num_predict": 60})
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content), SCHEMA)
    anything = client.generate(model="m", prompt="JSON please", format="json",
                               options={"temperature": 0, "num_predict": 3})
    assert anything.response.lstrip().startswith("{")


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
      city: The city's name
    """
    return "Sunny"


def test_tools_and_a_tool_round_trip_render_as_on_the_openai_route(client, http):
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    offered = client.chat(model="m", messages=[ask], tools=[get_weather], options=GREEDY)
    bare = client.chat(model="m", messages=[ask], options=GREEDY)
    assert offered.message.content != bare.message.content  # the tools are in the prompt
    history = [ask, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 24 C"}]
    reply = client.chat(model="m", messages=history, tools=[WEATHER], options=GREEDY)
    openai_history = [ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "Sunny, 24 C"}]
    same = http.post("/v1/chat/completions", json={"messages": openai_history, "tools": [WEATHER],
                                                   "temperature": 0, "max_tokens": 8}).json()
    assert reply.message.content == same["choices"][0]["message"]["content"]


def _events(text: str):
    ids = range(10, 10 + len(text))
    return [TokenDelta("r", i, ch) for i, ch in zip(ids, text)] + [
        Finished("r", "stop", Usage(5, len(text), 0), Timings(1.0, 2.0, 3.0, 4.0, 0.0, 0.0))]


def test_a_model_written_tool_call_is_ollamas_shape():
    """The model's own call format -> message.tool_calls with arguments as an object, streamed and whole."""
    fmt = tool_format(tiny_model().tokenizer)
    text = f'{fmt.start}{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}{fmt.end}'
    reply = OllamaReply("chat", "m", time.perf_counter(), (1, 2), Shape(tools=ToolParsing(fmt, (WEATHER,), True)))
    framer = OllamaFramer(reply)
    lines = [json.loads(line) for event in _events(text) for line in framer.frames(event)]
    chunks = [ollama.ChatResponse(**obj) for obj in lines]
    (call,) = [c for chunk in chunks for c in chunk.message.tool_calls or ()]
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert chunks[-1].done and chunks[-1].done_reason == "stop" and chunks[-1].eval_count == len(text)
    assert (chunks[-1].prompt_eval_duration, chunks[-1].eval_duration, chunks[-1].load_duration) == (
        3_000_000, 4_000_000, 1_000_000)
    assembler = Assembler(reply.shape)
    parts = [p for event in _events(text) for p in assembler.feed(event)]
    whole = ollama.ChatResponse(**whole_json(reply, parts, _events(text)[-1], ()))
    assert whole.message.content == "" and whole.message.tool_calls[0].function.arguments == {"city": "Paris"}


def test_logprobs(client):
    kwargs = {"model": "m", "messages": HELLO, "logprobs": True, "top_logprobs": 3, "options": GREEDY}
    reply = client.chat(**kwargs)
    assert len(reply.logprobs) == reply.eval_count == 8
    for lp in reply.logprobs:  # greedy: the chosen token is the best alternative
        assert len(lp.top_logprobs) == 3 and lp.top_logprobs[0].token == lp.token
        assert lp.top_logprobs[0].logprob == lp.logprob <= 0
    streamed = [lp for piece in client.chat(stream=True, **kwargs) for lp in piece.logprobs or ()]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in reply.logprobs]
    assert client.generate(model="m", prompt="Hi", options=GREEDY).logprobs is None  # only when asked


def _error(resp: httpx.Response) -> str:
    assert set(resp.json()) == {"error"}, resp.text
    return resp.json()["error"]


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/api/chat", {"messages": [{"role": "user", "content": "Hi", "images": ["AAAA"]}]}, 400,
     "messages[0].images[0]: m takes text only; images need a vision-language model"),
    ("/api/generate", {"prompt": "Hi", "images": ["AAAA"]}, 400,
     "images[0]: m takes text only; images need a vision-language model"),
    ("/api/generate", {"prompt": "Hi", "template": "{{ .Prompt }}"}, 400, "'template' is not supported"),
    ("/api/generate", {"prompt": "Hi", "suffix": "end"}, 400, "no fill-in-the-middle tokens"),
    ("/api/generate", {"prompt": "Hi", "raw": True, "system": "Be terse"}, 400, "system has no effect with raw"),
    ("/api/chat", {"messages": HELLO, "think": True}, 400, '"m" does not support thinking'),  # as Ollama: the name sent
    ("/api/chat", {"messages": HELLO, "think": "high"}, 400, "'think' value \"high\" is not supported"),
    ("/api/generate", {"prompt": "Hi", "raw": True, "think": True}, 400, '"m" does not support thinking'),
    ("/api/chat", {"messages": HELLO, "top_logprobs": 2}, 400, "top_logprobs needs logprobs: true"),
    ("/api/chat", {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/api/chat", {"messages": HELLO, "options": {"mirostat": 3}}, 400, "options.mirostat must be 0 (off), 1 or 2"),
    ("/api/chat", {"messages": HELLO, "options": {"bogus": 1}}, 400, "unknown field 'options.bogus'"),
    ("/api/chat", {"messages": HELLO, "nonsense": 1}, 400, "unknown field 'nonsense'"),
    ("/api/chat", {"messages": HELLO, "options": {"num_predict": 0}}, 400, "options.num_predict"),
    ("/api/chat", {"messages": HELLO, "options": {"num_ctx": 5}}, 400, "options.num_ctx is 5"),
    ("/api/chat", {"messages": HELLO, "options": {"temperature": "hot"}}, 400, "options.temperature"),
    ("/api/chat", {"messages": HELLO, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"messages": [], "keep_alive": 0}, 400, "keep_alive 0 asks to unload"),
    ("/api/pull", {"model": "llama3.2"}, 501, "--model"),
    ("/api/push", {"model": "llama3.2"}, 501, "--model"),
    ("/api/create", {"model": "x", "from": "llama3.2"}, 501, "--model"),
    ("/api/copy", {"source": "a", "destination": "b"}, 501, "--model"),
    ("/api/embed", {"model": "m", "input": "hi", "dimensions": 4}, 400, "dimensions is not supported"),
    ("/api/embeddings", {"model": "m", "prompt": "hi", "options": {"temperature": 1}}, 400,
     "options temperature do not apply"),
    ("/api/nowhere", {}, 404, "no route POST /api/nowhere"),
])
def test_errors_are_ollama_shaped(http, path, body, status, words):
    resp = http.post(path, json={"model": "m", **body})
    assert resp.status_code == status, resp.text
    assert words in _error(resp)


def test_the_client_raises_the_error(client):
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("llama3.2")
    assert info.value.status_code == 501 and "mlxcel-py serve --model" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("llama3.2")
    assert info.value.status_code == 501


def test_curl_without_a_content_type_but_not_a_browser(http):
    """Ollama's docs post with `curl -d` (a form Content-Type); a browser page, which sends an Origin, cannot."""
    body = json.dumps({"model": "m", "prompt": "Hi", "stream": False, "options": GREEDY})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert http.post("/api/generate", content=body, headers=form).json()["eval_count"] == 8
    page = http.post("/api/generate", content=body, headers={**form, "Origin": "http://localhost:5173"})
    assert page.status_code == 415 and "Content-Type: application/json" in _error(page)
    assert http.post("/api/generate", content=body).json()["eval_count"] == 8  # no Content-Type at all
    assert http.post("/api/generate", content=body, headers={"Content-Type": "text/plain"}).status_code == 415
    assert http.post("/v1/completions", content=body, headers=form).status_code == 415  # only Ollama's routes


def test_load_only_bodies_answer_at_once(client, http):
    body = http.post("/api/chat", json={"model": "m"}).json()
    assert body.pop("created_at").endswith("Z")
    assert body == {"model": "local-model", "message": {"role": "assistant", "content": ""}, "done": True,
                    "done_reason": "load"}
    loaded = client.generate(model="m", keep_alive="10m")
    assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")


def test_inert_values_change_nothing(client):
    plain = client.chat(model="m", messages=HELLO, options=GREEDY).message.content
    same = client.chat(model="other", messages=HELLO, think=False, keep_alive=-1, format="", options={
        **GREEDY, "num_ctx": 1 << 20, "typical_p": 1.0, "mirostat": 0, "num_thread": 1, "num_gpu": 0, "num_keep": 4})
    assert same.message.content == plain  # num_ctx beyond the slot is the slot


def test_num_ctx_caps_prompt_and_reply(client, http):
    usage = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}).json()["usage"]
    prompt = usage["prompt_tokens"]
    reply = client.chat(model="m", messages=HELLO, options={**GREEDY, "num_predict": 20, "num_ctx": prompt + 3})
    assert (reply.eval_count, reply.done_reason) == (3, "length")


def test_openapi_has_the_ollama_routes(http):
    schema = http.get("/openapi.json").json()
    chat = schema["paths"]["/api/chat"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/OllamaChatRequest")
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OllamaError")
    assert "application/x-ndjson" in chat["responses"]["200"]["content"]
    assert {"/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version"} <= set(schema["paths"])
    refused = schema["paths"]["/api/pull"]["post"]["responses"]["501"]["content"]["application/json"]["schema"]
    assert refused["$ref"].endswith("/OllamaError")


def test_a_stream_the_server_cuts_ends_with_an_error_line():
    """Past the shutdown grace period a stream ends with Ollama's error line, which the client raises."""
    # Greedy: the tiny model's greedy reply to "Hello" runs 3,000+ tokens without an end of turn,
    # so the stream cannot finish by itself inside the grace period (sampled, it sometimes did).
    running = start_server(parallel=1, grace_s=0.3, temp=0.0)
    client = ollama.Client(host=running.url, timeout=60)
    pieces: list = []
    try:
        stream = client.generate(model="m", prompt="Hello", stream=True, options={"num_predict": -1})
        pieces.append(next(stream))
        running.server.should_exit = True  # what SIGTERM does
        with pytest.raises(ollama.ResponseError) as info:
            pieces += list(stream)
        running.thread.join(10)
        wait_for(lambda: running.worker.stats().num_busy_slots == 0, 10, "the request to be aborted")
    finally:
        stop_server(running)
    assert info.value.error == "the server shut down before this request finished (grace period 0.3 s)"
    assert pieces and not any(p.done for p in pieces)
