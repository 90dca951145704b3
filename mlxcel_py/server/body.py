"""Request bodies in: only `application/json`, never more than --max-body-bytes, parsed and
validated off the event loop, every problem a 4xx that names the field.

Only `application/json` is taken so a browser's CORS-exempt "simple" request (text/plain,
form encodings) cannot drive the server from another site.
"""

from __future__ import annotations

import re
from typing import Any, Optional, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json
from starlette.requests import Request

from .errors import APIError

ModelT = TypeVar("ModelT", bound=BaseModel)
JSON_MEDIA_TYPE = "application/json"
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_POSITION = re.compile(r" at line (\d+) column (\d+)$")
# Fields whose union types make pydantic's per-branch messages less useful than one line.
_SHAPES = {
    "prompt": "prompt must be a string, a list of one string, or a list of token ids",
    "stop": "stop must be a string or a list of strings",
}


def check_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        shown = media_type or "none"
        raise APIError(415, f"the request body must be JSON sent as Content-Type: application/json (got {shown})",
                       code="unsupported_media_type")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (--max-body-bytes)",
                    code="request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 415 unless it is JSON, 413 past `limit` bytes (before reading, when declared)."""
    check_content_type(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    pieces, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise _too_large(limit)
        pieces.append(piece)
    return b"".join(pieces)


def parse_body(raw: bytes, model: type[ModelT]) -> ModelT:
    """Parse and validate a JSON body (blocking: call it off the event loop); a 400 naming the field."""
    try:
        obj = from_json(raw)
    except ValueError as exc:
        raise _malformed(raw, str(exc)) from None
    if not isinstance(obj, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise _invalid(exc, obj) from None


def _malformed(raw: bytes, message: str) -> APIError:
    if not raw.strip():
        return APIError(400, "the request body is empty; send a JSON object")
    if "escape" in message or "surrogate" in message:
        escape = _bad_escape(raw, message)
        if escape is not None:
            return APIError(400, f"malformed JSON body: {escape}")
    return APIError(400, f"malformed JSON body: {message}")


def _bad_escape(raw: bytes, message: str) -> Optional[str]:
    """Name the lone UTF-16 surrogate escape (e.g. \\ud800) that JSON parsing stopped at."""
    position = _POSITION.search(message)
    if position is None:
        return None
    line, column = int(position.group(1)), int(position.group(2))
    start = 0
    for _ in range(line - 1):
        start = raw.index(b"\n", start) + 1
    end = start + column
    found = list(_SURROGATE.finditer(raw, max(0, end - 14), end + 1))
    if not found:
        return None
    escape = found[-1].group().decode()
    return (f"invalid Unicode escape {escape} at line {line}: a lone UTF-16 surrogate is not a character "
            r"(a high surrogate \ud800-\udbff must be followed by a low one \udc00-\udfff)")


def _path(obj: Any, loc: tuple) -> list:
    """The part of pydantic's error location that exists in the input (drops union branch tags)."""
    path: list = []
    for part in loc:
        if isinstance(obj, dict) and isinstance(part, str) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and isinstance(part, int) and 0 <= part < len(obj):
            obj = obj[part]
        elif isinstance(obj, dict) and isinstance(part, str) and part.isidentifier() and not _is_tag(part):
            path.append(part)  # a missing field
            break
        else:
            continue
        path.append(part)
    return path


def _is_tag(part: str) -> bool:
    # Union branches appear in locations as type names ("str", "list[int]", "TextPart").
    return part in ("str", "int", "float", "bool", "none") or part[:1].isupper()


def _dotted(path: list) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _invalid(exc: ValidationError, obj: dict) -> APIError:
    errors = exc.errors(include_url=False)
    paths = [_path(obj, tuple(e["loc"])) for e in errors]
    # The deepest location is the most specific one (a union reports every branch).
    best = max(range(len(errors)), key=lambda i: len(paths[i]))
    error, path = errors[best], paths[best]
    param = str(path[0]) if path else None
    where = _dotted(path)
    if error["type"] == "missing":
        return APIError(400, f"missing required field '{where}'", param=param)
    if param in _SHAPES and error["type"] != "string_too_short":
        return APIError(400, _SHAPES[param], param=param)
    message = str(error["msg"]).removeprefix("Value error, ")
    return APIError(400, f"invalid '{where}': {message}" if where else message, param=param)
