"""llama-server's tokenizer routes: /tokenize and /detokenize."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..errors import RequestError
from .app import runtime
from .errors import APIError
from .schemas import DetokenizeRequest, TokenizeRequest, check_token_ids, parse_request

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request) -> dict:
    from ..models import encode_text

    rt = runtime(request)
    body = await parse_request(request, TokenizeRequest)
    try:
        ids = encode_text(rt.loaded.tokenizer, body.content, add_special_tokens=bool(body.add_special))
    except RequestError as exc:
        raise APIError(400, str(exc), param="content") from None
    if not body.with_pieces:
        return {"tokens": list(ids)}
    decode = rt.loaded.tokenizer.decode
    return {"tokens": [{"id": t, "piece": decode([t])} for t in ids]}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    rt = runtime(request)
    body = await parse_request(request, DetokenizeRequest)
    check_token_ids(body.tokens, rt.vocab_size, "tokens")
    return {"content": rt.loaded.tokenizer.decode(body.tokens)}
