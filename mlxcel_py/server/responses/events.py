"""The Responses API's event stream (a `Framer`, generation/stream.py): `event: <type>` plus
`data: {"type", "sequence_number", ...}` frames, numbered from 0.

response.created and response.in_progress open it; the item events of shapes.Output follow as
the reply is written; response.completed (or response.incomplete, with the reason) ends it. A
request that ends badly (the server's cut at shutdown, an engine failure, a bug after the 200)
ends with an `error` event carrying our code, then response.failed.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from ...engine import Finished
from ..generation.assembler import Assembler
from ..generation.submit import failure
from ..http.errors import APIError
from .shapes import Output, ResponsesReply, failed_json, final_json, outcome, response_json, stored
from .store import StoredResponse


class ResponsesFramer:
    """The events of one streamed response; a finished one is handed to `keep` (the store)."""

    def __init__(self, reply: ResponsesReply, keep: Callable[[StoredResponse], None]):
        self.reply, self.keep = reply, keep
        self.assembler = Assembler(reply.shape)
        self.output = Output()
        self.sequence = 0
        self.ended = False

    def _frames(self, events: list[dict]) -> list[str]:
        frames = []
        for event in events:
            data = {"type": event["type"], "sequence_number": self.sequence, **event}
            self.sequence += 1
            frames.append(f"event: {event['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")
        return frames

    def opening(self) -> list[str]:
        body = response_json(self.reply, "in_progress", [])
        return self._frames([{"type": "response.created", "response": body},
                             {"type": "response.in_progress", "response": body}])

    def frames(self, event: Any) -> list[str]:
        events = [e for part in self.assembler.feed(event) for e in self.output.add(part)]
        if not isinstance(event, Finished):
            return self._frames(events)
        if event.finish_reason not in ("stop", "length"):
            return self._frames(events) + self.cut(failure(event))
        events += self.output.finish(outcome(event)[0])
        body = final_json(self.reply, self.output, event, int(time.time()), self.assembler.reasoning_tokens)
        self._keep(body)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return self._frames(events + [{"type": kind, "response": body}])

    def _keep(self, body: dict) -> None:
        self.ended = True
        if self.reply.store:
            self.keep(stored(self.reply, body))

    def cut(self, error: APIError) -> list[str]:
        if self.ended:
            return []
        body = failed_json(self.reply, self.output, error.message)
        self._keep(body)
        return self._frames([{"type": "error", "code": error.code, "message": error.message, "param": None},
                             {"type": "response.failed", "response": body}])

    def bug(self) -> list[str]:
        return self.cut(APIError(500, "internal server error (see the server log)", code="internal_error"))

    def closing(self) -> list[str]:
        return []
