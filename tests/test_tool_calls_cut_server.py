"""A forced tool call cut by max_tokens, over HTTP in every dialect, streamed and not: it comes back
as a (partial) tool call with the length / max_tokens reason, and no call markup reaches the
client: cut inside the start marker, the name, the arguments, the end marker, and after a
complete call (parallel). The tiny model writes the call under the grammar; where it is cut is
read from the chat route's logprobs (every dialect renders the same prompt, so greedy decoding
writes the same tokens)."""

import json
import re
from dataclasses import dataclass

import pytest

import mlxcel_py.server.ollama.prepare as ollama_prepare
from mlxcel_py.models.tool_parsers import tool_parser_module
from mlxcel_py.tool_calls import call_constraint, tool_request
from server_helpers import sse_payloads, start_server, stop_server

START, END = "<tool_call>", "</tool_call>"
PARSERS = ("function_gemma", "gemma4", "glm47", "json_tools", "kimi_k2", "kimi_k3", "longcat", "minicpm5",
           "minimax_m2", "mistral", "muse_spark", "pythonic", "qwen3_coder")
MARKERS = {m for p in PARSERS for m in (tool_parser_module(p).tool_call_start, tool_parser_module(p).tool_call_end)
           if m} | {"<tool", "tool_call>"}
PARAMS = {"type": "object", "properties": {"setup": {"type": "string", "maxLength": 8},
                                           "punchline": {"type": "string", "maxLength": 8}},
          "required": ["setup", "punchline"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "Joke", "parameters": PARAMS}}
ASK = "Tell me a joke"
MSG = [{"role": "user", "content": ASK}]
OPEN_SETUP = r'"setup"\s*:\s*"([^"\\]+)$'  # inside the setup string
# Where to cut: (one call or parallel calls, what the text generated so far looks like).
CUTS = {
    "start marker": ("one", lambda t: 1 < len(t) < len(START) and START.startswith(t)),
    "name": ("one", lambda t: re.search(r'"name"\s*:\s*"J\w*$', t) and '"Joke"' not in t),
    "arguments": ("one", lambda t: re.search(OPEN_SETUP, t)),
    "end marker": ("one", lambda t: "</" in t and 2 < len(t[t.rindex("</"):]) < len(END) and
                   END.startswith(t[t.rindex("</"):])),
    "second start marker": ("parallel", lambda t: t.count(END) == 1 and 1 < len(t.split(END)[1].strip()) < len(START)
                            and START.startswith(t.split(END)[1].strip())),
    "second arguments": ("parallel", lambda t: t.count(START) == 2 and re.search(OPEN_SETUP, t)),
}


@dataclass(frozen=True)
class Expected:
    name: str
    text: str  # arguments as OpenAI sends them: as far as they were written
    input: dict  # as Anthropic and Ollama send them: an object
    whole: bool


def expected_calls(text: str) -> list[Expected]:
    """The calls the issue specifies for generated text cut at one of CUTS: a complete call whole, a
    call cut in its arguments with its text so far and the cut setup string as its input, a call cut
    before its name is complete (or a cut start marker) none."""
    out = []
    for body in text.split(START)[1:]:
        closed = END in body
        body = body.split(END)[0]
        body = body[: body.rindex("</")] if not closed and "</" in body else body
        try:
            whole = json.loads(body)
            out.append(Expected(whole["name"], json.dumps(whole["arguments"], ensure_ascii=False),
                                whole["arguments"], True))
        except json.JSONDecodeError:
            if re.search(r'"name"\s*:\s*"Joke"', body):
                args = re.split(r'"arguments"\s*:', body, maxsplit=1)[1].strip()
                out.append(Expected("Joke", args, {"setup": re.search(OPEN_SETUP, body).group(1)}, False))
    return out


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=2)
    with running.client() as client:
        yield client
    stop_server(running)


def chat_body(kind: str, max_tokens: int) -> dict:
    choice = {"type": "function", "function": {"name": "Joke"}} if kind == "one" else "required"
    return {"messages": MSG, "tools": [TOOL], "tool_choice": choice, "parallel_tool_calls": kind == "parallel",
            "max_tokens": max_tokens, "temperature": 0}


@pytest.fixture(scope="module")
def tokens(http) -> dict:
    """The forced reply's token texts, per kind (one call, parallel calls)."""
    out = {}
    for kind in ("one", "parallel"):
        body = {**chat_body(kind, 300), "logprobs": True}
        rows = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
        out[kind] = [bytes(row["bytes"]) for row in rows]
    return out


def cut_at(tokens: dict, cut: str) -> tuple[str, int, str]:
    """(kind, max_tokens, the text generated so far) of a cut."""
    kind, looks = CUTS[cut]
    for n in range(1, len(tokens[kind]) + 1):
        text = b"".join(tokens[kind][:n]).decode("utf-8", "ignore")
        if looks(text):
            return kind, n, text
    raise AssertionError(f"the tiny model's forced reply has no '{cut}' cut: {b''.join(tokens[kind])!r}")


def post(http, path: str, body: dict, stream: bool) -> tuple[str, list]:
    """(the raw body, its JSON objects: one, or a stream's payloads)."""
    with http.stream("POST", path, json={**body, "stream": stream}) as response:
        assert response.status_code == 200, response.read()
        lines = list(response.iter_lines())
    raw = "\n".join(lines)
    if not stream:
        return raw, [json.loads(raw)]
    if path == "/api/chat":
        return raw, [json.loads(line) for line in lines if line]
    return raw, [p for p in sse_payloads(lines) if p != "[DONE]"]


def openai(http, kind, n, stream) -> tuple[str, list, str]:
    """(raw, [(name, arguments)], finish_reason)."""
    raw, objs = post(http, "/v1/chat/completions", chat_body(kind, n), stream)
    if not stream:
        choice = objs[0]["choices"][0]
        assert choice["message"]["content"] in (None, "")
        calls = choice["message"].get("tool_calls", [])
        return raw, [(c["function"]["name"], c["function"]["arguments"]) for c in calls], choice["finish_reason"]
    choices = [o["choices"][0] for o in objs if o["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in choices) == ""
    calls = [c for ch in choices for c in ch["delta"].get("tool_calls", [])]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    return raw, [(c["function"]["name"], c["function"]["arguments"]) for c in calls], choices[-1]["finish_reason"]


def anthropic(http, kind, n, stream) -> tuple[str, list, str]:
    """(raw, [(name, input)] or streamed [(name, partial_json)], stop_reason)."""
    choice = {"type": "tool", "name": "Joke"} if kind == "one" else {"type": "any"}
    body = {"model": "m", "max_tokens": n, "messages": MSG, "tools": [{"name": "Joke", "input_schema": PARAMS}],
            "tool_choice": choice, "temperature": 0}
    raw, objs = post(http, "/v1/messages", body, stream)
    if not stream:
        assert all(b["type"] == "tool_use" for b in objs[0]["content"]), objs[0]["content"]
        return raw, [(b["name"], b["input"]) for b in objs[0]["content"]], objs[0]["stop_reason"]
    starts = [o["content_block"] for o in objs if o["type"] == "content_block_start"]
    assert all(b["type"] == "tool_use" for b in starts), starts
    deltas = [o["delta"]["partial_json"] for o in objs if o["type"] == "content_block_delta"]
    (end,) = [o for o in objs if o["type"] == "message_delta"]
    return raw, [(b["name"], d) for b, d in zip(starts, deltas, strict=True)], end["delta"]["stop_reason"]


def responses(http, kind, n, stream) -> tuple[str, list, dict]:
    """(raw, [(name, arguments, status)], the final response)."""
    choice = {"type": "function", "name": "Joke"} if kind == "one" else "required"
    body = {"model": "m", "input": ASK, "tools": [{"type": "function", "name": "Joke", "parameters": PARAMS}],
            "tool_choice": choice, "parallel_tool_calls": kind == "parallel", "max_output_tokens": n,
            "temperature": 0}
    raw, objs = post(http, "/v1/responses", body, stream)
    final = objs[0] if not stream else objs[-1]["response"]
    if stream:
        assert objs[-1]["type"] == "response.incomplete"
        done = [o["item"] for o in objs if o["type"] == "response.output_item.done"]
        assert done == final["output"]
    for item in final["output"]:
        assert item["type"] == "function_call" or item["content"][0]["text"] == ""
    calls = [(i["name"], i["arguments"], i["status"]) for i in final["output"] if i["type"] == "function_call"]
    return raw, calls, final


def ollama(http, kind, n, stream, monkeypatch) -> tuple[str, list, str]:
    """(raw, [(name, arguments)], done_reason); Ollama has no tool_choice: its constraint is forced here."""
    request = tool_request([TOOL], {"type": "function", "function": {"name": "Joke"}} if kind == "one" else "required",
                           kind == "parallel")
    monkeypatch.setattr(ollama_prepare, "_constraint", lambda rt, body: call_constraint(request, rt.tool_format))
    body = {"model": "m", "messages": MSG, "tools": [TOOL], "options": {"num_predict": n, "temperature": 0}}
    raw, objs = post(http, "/api/chat", body, stream)
    assert "".join(o["message"]["content"] for o in objs) == ""
    calls = [c["function"] for o in objs for c in o["message"].get("tool_calls", [])]
    return raw, [(c["name"], c["arguments"]) for c in calls], objs[-1]["done_reason"]


def no_markup(raw: str) -> None:
    assert not [m for m in MARKERS if m in raw], raw


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cut", list(CUTS))
def test_openai_chat(http, tokens, cut, stream):
    kind, n, text = cut_at(tokens, cut)
    raw, calls, finish = openai(http, kind, n, stream)
    no_markup(raw)
    assert finish == "length" and calls == [(c.name, c.text) for c in expected_calls(text)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cut", list(CUTS))
def test_anthropic_messages(http, tokens, cut, stream):
    kind, n, text = cut_at(tokens, cut)
    raw, calls, reason = anthropic(http, kind, n, stream)
    no_markup(raw)
    expected = expected_calls(text)
    assert reason == "max_tokens"
    assert calls == [(c.name, c.text if stream else c.input) for c in expected]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cut", list(CUTS))
def test_responses(http, tokens, cut, stream):
    kind, n, text = cut_at(tokens, cut)
    raw, calls, final = responses(http, kind, n, stream)
    no_markup(raw)
    assert (final["status"], final["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert calls == [(c.name, c.text, "completed" if c.whole else "incomplete") for c in expected_calls(text)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cut", list(CUTS))
def test_ollama_chat(http, tokens, cut, stream, monkeypatch):
    kind, n, text = cut_at(tokens, cut)
    raw, calls, reason = ollama(http, kind, n, stream, monkeypatch)
    no_markup(raw)
    assert reason == "length" and calls == [(c.name, c.input) for c in expected_calls(text)]


def test_every_cut_is_one_the_issue_names(tokens):
    """The cuts are where they are meant to be: no call, no call, a partial call, a whole one, ..."""
    shapes = {cut: [c.whole for c in expected_calls(cut_at(tokens, cut)[2])] for cut in CUTS}
    assert shapes == {"start marker": [], "name": [], "arguments": [False], "end marker": [True],
                      "second start marker": [True], "second arguments": [True, False]}


def test_the_sdks_read_a_cut_call(http, tokens):
    """The official clients take a cut call: Anthropic's stream accumulates its partial input."""
    import anthropic as anthropic_sdk
    import openai as openai_sdk

    _, n, text = cut_at(tokens, "arguments")
    (call,) = expected_calls(text)
    url = str(http.base_url).rstrip("/")
    with anthropic_sdk.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=60) as claude:
        kwargs = {"model": "m", "max_tokens": n, "messages": MSG, "tools": [{"name": "Joke", "input_schema": PARAMS}],
                  "tool_choice": {"type": "tool", "name": "Joke"}, "extra_body": {"temperature": 0}}
        with claude.messages.stream(**kwargs) as stream:
            final = stream.get_final_message()
        whole = claude.messages.create(**kwargs)
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert [(b.type, b.name) for b in final.content] == [(b.type, b.name) for b in whole.content] == [
        ("tool_use", "Joke")]
    assert whole.content[0].input == call.input and isinstance(final.content[0].input, dict)
    with openai_sdk.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(model="m", **{k: v for k, v in chat_body("one", n).items()
                                                              if k != "messages"}, messages=MSG)
    assert reply.choices[0].finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls] == [
        ("Joke", call.text)]
