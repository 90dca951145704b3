"""llama-server's tokenizer routes: /tokenize and /detokenize (tokenizing runs off the loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from ..errors import RequestError
from .runtime import runtime
from .body import parse_body, read_body
from .errors import APIError
from .prompts import check_token_ids
from .schemas import DetokenizeRequest, TokenizeRequest

if TYPE_CHECKING:
    from .runtime import Runtime

def _tokenize(rt: "Runtime", raw: bytes) -> dict:
    from ..models import encode_text

    body = parse_body(raw, TokenizeRequest)
    try:
        ids = encode_text(rt.loaded.tokenizer, body.content, add_special_tokens=bool(body.add_special))
    except RequestError as exc:
        raise APIError(400, str(exc), param="content") from None
    if not body.with_pieces:
        return {"tokens": list(ids)}
    decode = rt.loaded.tokenizer.decode
    return {"tokens": [{"id": t, "piece": decode([t])} for t in ids]}


def _detokenize(rt: "Runtime", raw: bytes) -> dict:
    body = parse_body(raw, DetokenizeRequest)
    check_token_ids(body.tokens, rt.vocab_size, "tokens")
    return {"content": rt.loaded.tokenizer.decode(body.tokens)}


async def tokenize(request: Request) -> dict:
    rt = runtime(request)
    return await rt.off_loop(_tokenize, rt, await read_body(request, rt.max_body_bytes))


async def detokenize(request: Request) -> dict:
    rt = runtime(request)
    return await rt.off_loop(_detokenize, rt, await read_body(request, rt.max_body_bytes))
