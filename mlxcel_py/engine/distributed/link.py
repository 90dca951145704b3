"""What crosses between ranks besides the model's own collectives: records, tokens, the handshake.

Everything goes through `mx.distributed` collectives on the same group the model's layers
use, from one thread at a time, so every rank issues the same collectives in the same
order. A broadcast is an `all_sum` where every rank but 0 contributes zeros (the ring
backend has no broadcast). A collective blocks for as long as a peer does not join it;
the `Watchdog` bounds each guarded section and reports the one that overruns.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import threading
import time
from typing import Callable, Iterator, Optional

import mlx.core as mx

log = logging.getLogger("mlxcel_py.distributed")

FRAME = 1024  # bytes of the first broadcast: 4 of length, then the payload's head (most records fit)
HANDSHAKE = 2048  # bytes each rank contributes to the startup all_gather


class Watchdog:
    """Calls `on_expired(what, seconds)` once, from its own thread, when a guarded section overruns.

    MLX releases the GIL while a collective waits, so this thread runs while the guarded
    thread is blocked on a peer that died without closing its socket or stopped."""

    def __init__(self, on_expired: Callable[[str, float], None], tick_s: float = 0.2):
        self._on_expired = on_expired
        self._tick_s = tick_s
        self._current: Optional[tuple[str, float, float]] = None  # (what, started, deadline)
        self._fired = False
        threading.Thread(target=self._watch, name="mlxcel-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, what: str, timeout_s: float) -> Iterator[None]:
        now = time.monotonic()
        self._current = (what, now, now + timeout_s)  # one tuple: read atomically by the watcher
        try:
            yield
        finally:
            self._current = None

    def _watch(self) -> None:
        while not self._fired:
            time.sleep(self._tick_s)
            current = self._current
            if current is not None and time.monotonic() > current[2]:
                self._fired = True
                self._on_expired(current[0], time.monotonic() - current[1])


class Link:
    """The rank-0-to-all channel over a group: pickled records, sampled tokens, a startup handshake."""

    def __init__(self, group):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()

    def _sum(self, array: mx.array) -> mx.array:
        out = mx.distributed.all_sum(array, group=self.group)
        mx.eval(out)
        return out

    def send(self, record: object) -> None:
        """Rank 0: broadcast one record (pickled; this channel only joins our own ranks)."""
        payload = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        head = len(payload).to_bytes(4, "little") + payload[: FRAME - 4]
        self._sum(mx.array(head.ljust(FRAME, b"\0")))
        if len(payload) > FRAME - 4:
            self._sum(mx.array(payload[FRAME - 4 :]))

    def receive(self) -> object:
        """Every other rank: the next record rank 0 sent."""
        head = bytes(memoryview(self._sum(mx.zeros((FRAME,), dtype=mx.uint8))))
        length = int.from_bytes(head[:4], "little")
        payload = head[4 : 4 + length]
        if length > FRAME - 4:
            rest = self._sum(mx.zeros((length - (FRAME - 4),), dtype=mx.uint8))
            payload += bytes(memoryview(rest))
        return pickle.loads(payload)

    def share_tokens(self, tokens: Optional[mx.array], count: int) -> mx.array:
        """Rank 0's sampled tokens on every rank (rank 0 passes them, the others None)."""
        mine = tokens.astype(mx.int32) if tokens is not None else mx.zeros((count,), dtype=mx.int32)
        return self._sum(mine.reshape(count))

    def handshake(self, info: dict) -> list[dict]:
        """Every rank's `info` (JSON, at most HANDSHAKE bytes), in rank order, on every rank."""
        raw = json.dumps(info).encode()
        if len(raw) > HANDSHAKE:  # never truncate JSON mid-way: say so instead
            raw = json.dumps({"ok": False, "error": f"startup info of rank {self.rank} too long"}).encode()
        mine = mx.array(raw.ljust(HANDSHAKE, b"\0"))
        everyone = mx.distributed.all_gather(mine, group=self.group)
        mx.eval(everyone)
        data = bytes(memoryview(everyone))
        return [json.loads(data[i * HANDSHAKE : (i + 1) * HANDSHAKE].rstrip(b"\0")) for i in range(self.size)]
