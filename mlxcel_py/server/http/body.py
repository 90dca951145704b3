"""Request bodies in: only `application/json`, never more than --max-body-bytes, parsed and
validated off the event loop, every problem a 4xx that names the field.

Only `application/json` is taken so a browser's CORS-exempt "simple" request (text/plain,
form encodings) cannot drive the server from another site. Ollama's routes also take a form
type or none from requests without an `Origin` (curl -d, as Ollama's docs write it): every
browser sends one with a cross-site POST, so a page still needs JSON (and its preflight).
"""

from __future__ import annotations

import functools
import re
import typing
from typing import Any, Optional, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json
from starlette.requests import Request

from .errors import APIError

ModelT = TypeVar("ModelT", bound=BaseModel)
JSON_MEDIA_TYPE = "application/json"
CURL_MEDIA_TYPES = ("", "application/x-www-form-urlencoded")  # none, or what `curl -d` declares
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Validation holds the GIL for a whole call: long lists (120k chat turns) are validated in
# batches so the event loop's thread gets its turns in between.
BATCH = 256
_POSITION = re.compile(r" at line (\d+) column (\d+)$")
# Fields whose union types make pydantic's per-branch messages less useful than one line.
_SHAPES = {
    "prompt": "prompt must be a string, a list of one string, or a list of token ids",
    "stop": "stop must be a string or a list of strings",
}


def check_content_type(request: Request, curl_without_origin: bool = False) -> None:
    """415 unless the body is declared JSON (or, with `curl_without_origin`, curl's form type or
    none from a request no browser sent)."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if curl_without_origin and media_type in CURL_MEDIA_TYPES and "origin" not in request.headers:
        return
    if media_type != JSON_MEDIA_TYPE:
        shown = media_type or "none"
        raise APIError(415, f"the request body must be JSON sent as Content-Type: application/json (got {shown})",
                       code="unsupported_media_type")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (--max-body-bytes)",
                    code="request_too_large")


async def read_body(request: Request, limit: int, curl_without_origin: bool = False) -> bytes:
    """The raw body; 415 unless it is JSON (see `check_content_type`), 413 past `limit` bytes
    (before reading, when declared)."""
    check_content_type(request, curl_without_origin)
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


def json_object(raw: bytes) -> dict:
    """The body as a JSON object, unvalidated (blocking); a 400 when it is not one."""
    try:
        obj = from_json(raw)
    except ValueError as exc:
        raise _malformed(raw, str(exc)) from None
    if not isinstance(obj, dict):
        raise APIError(400, "the request body must be a JSON object")
    return obj


def parse_body(raw: bytes, model: type[ModelT]) -> ModelT:
    """Parse and validate a JSON body (blocking: call it off the event loop); a 400 naming the field."""
    obj = json_object(raw)
    long_lists = {name: item for name, item in _model_lists(model).items()
                  if isinstance(obj.get(name), list) and len(obj[name]) > BATCH}
    try:
        body = model.model_validate({**obj, **{name: obj[name][:BATCH] for name in long_lists}})
    except ValidationError as exc:
        raise _invalid(exc.errors(include_url=False), obj) from None
    rest = {name: _validate_batches(item, obj[name], name, obj) for name, item in long_lists.items()}
    return body.model_copy(update={name: getattr(body, name) + items for name, items in rest.items()}) if rest else body


@functools.lru_cache(maxsize=None)
def _model_lists(model: type[BaseModel]) -> dict[str, TypeAdapter]:
    """The fields of `model` that are lists of models, with an adapter for their items."""
    out = {}
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        if typing.get_origin(field.annotation) is list and args and isinstance(args[0], type) \
                and issubclass(args[0], BaseModel):
            out[name] = TypeAdapter(list[args[0]])  # type: ignore[valid-type]
    return out


def _validate_batches(adapter: TypeAdapter, items: list, name: str, obj: dict) -> list:
    out: list = []
    for start in range(BATCH, len(items), BATCH):
        try:
            out += adapter.validate_python(items[start:start + BATCH], strict=True)
        except ValidationError as exc:
            errors = [{**e, "loc": (name, start + e["loc"][0], *e["loc"][1:])} for e in exc.errors(include_url=False)]
            raise _invalid(errors, obj) from None
    return out


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


def _invalid(errors: list, obj: dict) -> APIError:
    paths = [_path(obj, tuple(e["loc"])) for e in errors]
    # The deepest location is the most specific one (a union reports every branch).
    best = max(range(len(errors)), key=lambda i: len(paths[i]))
    error, path = errors[best], paths[best]
    param = str(path[0]) if path else None
    where = _dotted(path)
    if error["type"] == "missing":
        return APIError(400, f"missing required field '{where}'", param=param)
    if error["type"] == "extra_forbidden":  # bodies that refuse what they do not declare (Ollama's)
        return APIError(400, f"unknown field '{where}': this server refuses fields it does not implement "
                             "rather than ignore them", param=param)
    if param in _SHAPES and error["type"] != "string_too_short":
        return APIError(400, _SHAPES[param], param=param)
    message = str(error["msg"]).removeprefix("Value error, ")
    return APIError(400, f"invalid '{where}': {message}" if where else message, param=param)
