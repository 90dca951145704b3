"""A streaming OpenAI-compatible client that timestamps every token frame on arrival.

It reads our frames (including `prompt_progress` ones), llama-server's (OpenAI-style and its
native `/completion` `content`/`stop` frames) and mlx_lm.server's. A frame counts as a token
when it carries text; servers that hold back a partial character or a lone space send that
token with the next frame, so two tokens then share one arrival.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Optional
from urllib.parse import urlsplit

import httpx

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Frame:
    """One parsed SSE `data:` line."""

    text: str = ""
    progress: Optional[dict] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    done: bool = False


def frame_from_json(obj: Any) -> Frame:
    """Classify one decoded SSE payload (ours, OpenAI's, llama-server's or mlx_lm.server's)."""
    if not isinstance(obj, dict):
        return Frame(error=f"unexpected SSE payload: {str(obj)[:80]}")
    error = obj.get("error")
    if error is not None:
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        return Frame(error=message)
    progress = obj.get("prompt_progress")
    progress = progress if isinstance(progress, dict) else None
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = choice.get("text") or delta.get("content") or ""
        return Frame(text=text, progress=progress, finish_reason=choice.get("finish_reason"))
    if "content" in obj:  # llama-server's native /completion stream
        finish = (obj.get("stop_type") or "stop") if obj.get("stop") else None
        return Frame(text=obj.get("content") or "", progress=progress, finish_reason=finish)
    return Frame(progress=progress)  # role-only, usage-only or progress-only frames


def parse_sse_line(line: str) -> Optional[Frame]:
    """The frame of one SSE line; None for blank, comment and non-data lines."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return Frame(done=True)
    try:
        return frame_from_json(json.loads(payload))
    except json.JSONDecodeError:
        return Frame(error=f"malformed SSE payload: {payload[:80]}")


def parse_sse(lines: Iterable[str]) -> list[Frame]:
    """All frames of an SSE body given as lines."""
    return [f for f in (parse_sse_line(line) for line in lines) if f is not None]


@dataclass(slots=True)
class StreamLog:
    """What one streamed request saw; times come from the scenario's clock (seconds)."""

    sent: Optional[float] = None
    token_times: list[float] = field(default_factory=list)
    progress: list[tuple[float, dict]] = field(default_factory=list)
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    status: Optional[int] = None

    @property
    def first_token(self) -> Optional[float]:
        return self.token_times[0] if self.token_times else None

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def record(self, frame: Frame, now: float) -> None:
        if frame.progress is not None:
            self.progress.append((now, frame.progress))
        if frame.text:
            self.token_times.append(now)
        if frame.finish_reason is not None:
            self.finish_reason = frame.finish_reason
        if frame.error is not None:
            self.error = frame.error


def completion_body(prompt: str, max_tokens: int, *, progress: bool = False,
                    eos_ids: Iterable[int] = ()) -> dict:
    """A greedy streaming /v1/completions body that never stops early and never hits a cache.

    `ignore_eos` is llama-server's and ours; the EOS `logit_bias` does the same on servers that
    lack it (mlx_lm.server). Unknown fields are ignored by all three."""
    body: dict = {
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        "ignore_eos": True, "cache_prompt": False,
    }
    if progress:
        body["return_progress"] = True
    bias = {str(i): -100.0 for i in sorted(eos_ids)}
    if bias:
        body["logit_bias"] = bias
    return body


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, log: StreamLog,
                         changed: Optional[asyncio.Condition] = None, clock: Clock = time.perf_counter) -> None:
    """POST `body` to `url` and record each frame's arrival in `log` until the stream ends.

    Cancel the task to stop early: that closes the connection, and the server aborts the request."""
    log.sent = clock()
    try:
        async with client.stream("POST", url, json=body) as resp:
            log.status = resp.status_code
            if resp.status_code != 200:
                log.error = _http_error(resp.status_code, await resp.aread())
                return
            await _record_lines(_stamped(resp.aiter_lines(), clock), log, changed)
    except httpx.HTTPError as exc:
        log.error = f"{type(exc).__name__}: {exc}"
    finally:
        await _finish(log, changed)


async def light_stream_request(url: str, body: dict, log: StreamLog, changed: Optional[asyncio.Condition] = None,
                               clock: Clock = time.perf_counter) -> None:
    """`stream_request` over a bare HTTP/1.1 connection: the same frames and arrival times, a fraction
    of the CPU a token (httpx parses every chunk in Python through h11 and anyio). For benchmarks on few
    cores, where the client's CPU is taken from the server it measures. Cancel the task to stop early."""
    parts = urlsplit(url)
    log.sent = clock()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        payload = json.dumps(body).encode()
        writer.write(f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                     .encode() + payload)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        log.status = int(head.split(None, 2)[1])
        length = re.search(r"\ncontent-length: *(\d+)", head)
        chunks = (_chunks(reader) if "transfer-encoding: chunked" in head
                  else _exactly(reader, int(length.group(1))) if length else _until_eof(reader))
        if log.status != 200:
            log.error = _http_error(log.status, b"".join([c async for c in chunks]))
            return
        await _record_lines(_split_lines(chunks, clock), log, changed)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
        log.error = f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
        await _finish(log, changed)


async def _record_lines(lines: AsyncIterator[tuple[float, str]], log: StreamLog,
                        changed: Optional[asyncio.Condition]) -> None:
    """Record each (arrival, SSE line)'s frame in `log` until [DONE]: the one parse both readers share."""
    async for now, line in lines:
        frame = parse_sse_line(line)
        if frame is None:
            continue
        log.record(frame, now)
        await _notify(changed)
        if frame.done:
            return


async def _stamped(lines: AsyncIterator[str], clock: Clock) -> AsyncIterator[tuple[float, str]]:
    async for line in lines:
        yield clock(), line


async def _split_lines(chunks: AsyncIterator[bytes], clock: Clock) -> AsyncIterator[tuple[float, str]]:
    """The lines of a body read in chunks, each stamped with the arrival of the chunk that ends it
    (a last line without a newline too, as httpx's aiter_lines gives it)."""
    pending = b""
    async for data in chunks:
        now = clock()
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            yield now, line.decode("utf-8", errors="replace")
    if pending:
        yield clock(), pending.decode("utf-8", errors="replace")


def _http_error(status: int, body: bytes) -> str:
    return f"HTTP {status}: {body[:200].decode(errors='replace')}"


async def _finish(log: StreamLog, changed: Optional[asyncio.Condition]) -> None:
    """A stream that ended with neither a finish reason nor an error was closed by the server."""
    if log.finish_reason is None and log.error is None:
        log.finish_reason = "closed"
    await _notify(changed)


async def _chunks(reader: asyncio.StreamReader):
    """The data of an HTTP/1.1 chunked body, one chunk at a time."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def _exactly(reader: asyncio.StreamReader, size: int):
    yield await reader.readexactly(size)


async def _until_eof(reader: asyncio.StreamReader):
    while data := await reader.read(65536):
        yield data


async def _notify(changed: Optional[asyncio.Condition]) -> None:
    if changed is not None:
        async with changed:
            changed.notify_all()


def new_client() -> httpx.AsyncClient:
    """An HTTP client with no read timeout (a long prefill is silent) and room for many streams."""
    return httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), limits=httpx.Limits(max_connections=64))
