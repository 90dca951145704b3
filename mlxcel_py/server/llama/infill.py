"""llama-server's POST /infill: code completion at a cursor (llama.vscode, Continue, Tabby).

The prompt is llama-server's fill-in-the-middle layout of `input_prefix`, `input_suffix`, `input_extra` (other
files' chunks) and `prompt` (server/generation/fim.py); then the request is a /completion over those ids (same
fields, same reply, streamed or not). A model without FIM tokens is a 400."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..generation.fanout import PreparedGroup
from ..generation.fim import fim_prompt
from ..http.body import parse_body
from .prepare import prepare_prompts, refuse_native, request_lora
from .schemas import InfillRequest
from .shapes import NativeReply

if TYPE_CHECKING:
    from ..runtime import Runtime


def prepare_infill(rt: "Runtime", raw: bytes) -> PreparedGroup[NativeReply]:
    """POST /infill: the FIM prompt, then a /completion of it."""
    body = parse_body(raw, InfillRequest)
    rt.check_model(body.model)
    refuse_native(body)
    lora = request_lora(body, rt)
    extra = [(chunk.filename if chunk.filename is not None else "tmp", chunk.text) for chunk in body.input_extra or ()]
    ids = fim_prompt(rt, body.input_prefix, body.input_suffix, extra, body.prompt or "")
    return prepare_prompts(rt, body, [(tuple(ids), rt.loaded.tokenizer.decode(ids), None)], lora)
