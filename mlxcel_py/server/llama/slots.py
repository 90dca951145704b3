"""llama-server's POST /slots/{id_slot}?action=save|restore|erase (with --slot-save-path).

The answers are llama-server's (tools/server/README.md): save {"id_slot", "filename", "n_saved",
"n_written", "timings": {"save_ms"}}, restore {..., "n_restored", "n_read", "timings":
{"restore_ms"}}, erase {"id_slot", "n_erased"}. The work runs on the engine thread
(engine/core/slots.py); this side validates the request and joins the file name to the directory.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import Request

from ...engine.core.slots import ACTIONS, SlotAction, valid_filename
from ...errors import MlxcelError, SlotActionError
from ..http.body import read_body
from ..http.errors import APIError, from_error
from ..runtime import runtime

ACTION_TIMEOUT_S = 600.0  # a save of a long context writes hundreds of MiB; the engine thread may be mid-tick


def _fields(raw: bytes, action: str) -> str:
    """The body's filename (erase: none); a 400 naming any other field."""
    if not raw.strip():
        obj: dict = {}
    else:
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise APIError(400, "the request body must be a JSON object")
    allowed = () if action == "erase" else ("filename",)
    for name in obj:
        if name not in allowed:
            raise APIError(400, f"{name} is not a field of /slots/{{id}}?action={action}", param=name)
    if action == "erase":
        return ""
    filename = obj.get("filename")
    if not isinstance(filename, str):
        raise APIError(400, "filename (a string) is required", param="filename")
    if not valid_filename(filename):
        raise APIError(400, "Invalid filename", param="filename")
    return filename


async def slot_action(request: Request, id_slot: str) -> dict:
    rt = runtime(request)
    directory = rt.config.server.slot_save_path if rt.config.server is not None else None
    if directory is None:
        raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                       code="not_supported_error")
    if not id_slot.isascii() or not id_slot.isdigit():
        raise APIError(400, "Invalid slot ID")
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise APIError(400, "Invalid action", param="action")
    declared = request.headers.get("content-length")
    raw = b"" if action == "erase" and declared in (None, "0") else await read_body(request, rt.max_body_bytes, True)
    filename = _fields(raw, action)
    if (error := rt.gate_error()) is not None:
        raise error
    work = SlotAction(action, int(id_slot), filename, str(Path(directory) / filename) if filename else "")
    try:
        result = await asyncio.wait_for(asyncio.wrap_future(rt.worker.slot_action(work)), ACTION_TIMEOUT_S)
    except SlotActionError as exc:
        raise APIError(exc.status, str(exc), code=exc.code) from None
    except MlxcelError as exc:
        raise from_error(exc) from None
    if action == "erase":
        return {"id_slot": work.slot_id, "n_erased": result.n_tokens}
    if action == "save":
        return {"id_slot": work.slot_id, "filename": filename, "n_saved": result.n_tokens,
                "n_written": result.n_bytes, "timings": {"save_ms": round(result.ms, 3)}}
    return {"id_slot": work.slot_id, "filename": filename, "n_restored": result.n_tokens,
            "n_read": result.n_bytes, "timings": {"restore_ms": round(result.ms, 3)}}
