"""OpenAI's Responses API: POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}
of the responses kept in memory (store.py).

Stateless unless `previous_response_id` names a stored response: its conversation (less its
instructions) comes before this request's input.
"""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..generation.assembler import Assembler
from ..generation.collect import collect
from ..generation.stream import FramedStream
from ..generation.submit import CLIENT_CLOSED, start
from ..http.errors import APIError
from ..runtime import runtime
from .events import ResponsesFramer
from .prepare import prepare_response
from .shapes import Output, final_json, outcome, stored
from .store import StoredResponse


async def create_response(request: Request) -> Response:
    """A `response` object: message and function_call items; with `stream` the typed event stream."""
    prepared, gen = await start(request, prepare_response, "input")
    if gen is None:
        return Response(status_code=CLIENT_CLOSED)
    reply, store = prepared.reply, runtime(request).responses
    if prepared.stream:
        return FramedStream(ResponsesFramer(reply, store.put), gen, reply.id)
    assembler = Assembler(reply.shape)
    whole = await collect(request.receive, gen, assembler)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    output = Output()
    for part in whole.parts:
        output.add(part)
    output.finish(outcome(whole.finished)[0])
    body = final_json(reply, output, whole.finished, int(time.time()), assembler.reasoning_tokens)
    if reply.store:
        store.put(stored(reply, body))
    return JSONResponse(body)


def _stored(request: Request, response_id: str) -> StoredResponse:
    found = runtime(request).responses.get(response_id)
    if found is None:
        raise APIError(404, f"no response with id '{response_id}' is stored here (responses are kept in memory, "
                            "the most recent ones with store: true)", param="response_id", code="not_found")
    return found


async def retrieve_response(request: Request, response_id: str) -> dict:
    """A stored response, as it was returned (not replayed as a stream)."""
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "'stream' is not supported by this server on GET: a stored response is returned as "
                            "JSON, not replayed as events", param="stream", code="unsupported_parameter")
    return _stored(request, response_id).body


async def delete_response(request: Request, response_id: str) -> dict:
    """Forget a stored response (later `previous_response_id`s naming it are a 400)."""
    _stored(request, response_id)
    runtime(request).responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
