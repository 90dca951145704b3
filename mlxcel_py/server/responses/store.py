"""The recent responses, in memory, for `previous_response_id`, GET and DELETE /v1/responses/{id}.

Bounded: at most MAX_RESPONSES responses and MAX_CHARS characters of conversation text, the
oldest dropped first; nothing survives a restart. Thread-safe: requests are prepared on the
Runtime's threads while replies are stored from the event loop.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

MAX_RESPONSES = 256
MAX_CHARS = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response: its JSON, and its whole conversation in OpenAI's chat form (the
    earlier turns, this input, this output; never the instructions, which do not carry over)."""

    body: dict
    conversation: tuple[dict, ...]

    @property
    def num_chars(self) -> int:
        calls = [m["tool_calls"] for m in self.conversation if m.get("tool_calls")]
        return sum(len(m.get("content") or "") for m in self.conversation) + len(json.dumps(calls) if calls else "")


class ResponseStore:
    """An LRU of recent responses by id, bounded by count and by characters."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS):
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()  # id -> (response, chars)
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: StoredResponse) -> None:
        """Keep `stored` as the newest; a response larger than the whole bound is not kept."""
        size = stored.num_chars
        if size > self.max_chars:
            return
        with self._lock:
            self._drop(stored.body["id"])
            self._items[stored.body["id"]] = (stored, size)
            self._chars += size
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                self._drop(next(iter(self._items)))

    def get(self, response_id: str) -> Optional[StoredResponse]:
        with self._lock:
            found = self._items.get(response_id)
        return found[0] if found is not None else None

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        found = self._items.pop(response_id, None)
        if found is None:
            return False
        self._chars -= found[1]
        return True
