"""llama-server's slot actions (`POST /slots/{id}?action=save|restore|erase`, --slot-save-path)
over this engine, on the engine thread. Plain Python: the arrays move through a `SlotFile` step.

A slot's KV is what its last request left in the prompt cache (prompt plus reply), so `save`
writes that entry, `restore` indexes the file's tokens as an entry (any later prompt that
extends them adopts it, whichever slot it lands in), and `erase` drops it. The file is a
safetensors file whose metadata records the model's identity, the KV types and the token ids.
"""

from __future__ import annotations

import json
import struct
import time
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...errors import SlotActionError
from .step import SlotFile

if TYPE_CHECKING:
    from .scheduler import Scheduler
    from .step import Runner

FORMAT = "mlxcel-py slot/1"
ACTIONS = ("save", "restore", "erase")
_RESERVED = set('/\\:*?"<>|')
MAX_HEADER = 1 << 28  # the token ids of a long context fit easily; a bigger header is not ours


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What a slot file must match to be restored: the model (name and digest) and how its KV is stored."""

    name: str
    digest: str
    type_k: str
    type_v: str


@dataclass(frozen=True, slots=True)
class SlotAction:
    """One slot action; `path` is the file under --slot-save-path (validated by the HTTP side)."""

    action: str
    slot_id: int
    filename: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class SlotResult:
    """llama-server's answer fields: tokens saved / restored / erased, bytes written / read, and the time."""

    n_tokens: int
    n_bytes: int = 0
    ms: float = 0.0


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename in spirit: one plain file name, never a path."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255 or name in (".", ".."):
        return False
    if name != name.strip() or name.endswith(".") or name.startswith("."):
        return False
    return not any(c in _RESERVED or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in name)


def read_header(path: str) -> dict[str, str]:
    """The metadata of a slot file (the safetensors header), read without loading its arrays."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("not a slot file (too short)")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER:
            raise ValueError("not a slot file (bad header)")
        header = json.loads(f.read(size))
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError("not a slot file written by mlxcel-py")
    return meta


class SlotFiles:
    """Runs slot actions against the scheduler's bookkeeping and the runner's snapshots."""

    def __init__(self, scheduler: "Scheduler", runner: "Runner", identity: ModelIdentity):
        self.scheduler, self.runner, self.identity = scheduler, runner, identity

    def run(self, action: SlotAction) -> SlotResult:
        """Save, restore or erase; SlotActionError (with its HTTP status) when it cannot."""
        s = self.scheduler
        if not 0 <= action.slot_id < s.num_slots:
            raise SlotActionError("Invalid slot ID")
        if s.slot_busy(action.slot_id):
            raise SlotActionError(f"slot {action.slot_id} is processing a request; retry when it is idle",
                                  status=503, code="slot_busy")
        start = time.perf_counter()
        if action.action == "save":
            n_tokens, n_bytes = self._save(action)
        elif action.action == "restore":
            n_tokens, n_bytes = self._restore(action)
        else:
            n_tokens, n_bytes = self._erase(action.slot_id), 0
        return SlotResult(n_tokens, n_bytes, (time.perf_counter() - start) * 1000.0)

    def _metadata(self, tokens: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
        i = self.identity
        return (("format", FORMAT), ("model", i.name), ("model_digest", i.digest), ("cache_type_k", i.type_k),
                ("cache_type_v", i.type_v), ("tokens", json.dumps(list(tokens))))

    def _execute(self, work: SlotFile) -> int:
        out = self.runner.execute(self.scheduler.command_step(slot_file=work))
        if out.slot_file_error is not None:
            verb = "save" if work.action == "save" else "restore"
            raise SlotActionError(f"Unable to {verb} slot: {out.slot_file_error}", status=400 if verb == "restore" else 500)
        return out.slot_file_bytes

    def _slot_kv(self, slot_id: int) -> tuple[tuple[int, ...], Optional[int]]:
        """The slot's tokens and the snapshot holding them; none once the prompt cache evicted it."""
        cache, tokens = self.scheduler.prompt_cache, self.scheduler.slot_tokens.get(slot_id, ())
        entry = cache.covering(tokens) if cache is not None and tokens else None
        return (tokens, entry.snapshot_id) if entry is not None else ((), None)

    def _save(self, action: SlotAction) -> tuple[int, int]:
        tokens, snapshot_id = self._slot_kv(action.slot_id)
        work = SlotFile("save", action.path, snapshot_id, len(tokens), self._metadata(tokens))
        return len(tokens), self._execute(work)

    def _restore(self, action: SlotAction) -> tuple[int, int]:
        tokens = self._check(action.path)
        s = self.scheduler
        if len(tokens) >= s.slot_context:
            raise SlotActionError(f"Unable to restore slot: the file holds {len(tokens)} tokens, but a slot's "
                                  f"context holds {s.slot_context}")
        self._erase(action.slot_id)  # whatever the slot held is replaced, as in llama-server
        if not tokens:
            return 0, 0
        if s.prompt_cache is None:
            raise SlotActionError("Unable to restore slot: the prompt cache is off (--cache-ram 0 or "
                                  "--no-prompt-cache), and a restored slot is adopted through it")
        snapshot_id = s.prompt_cache.insert(tokens)
        if snapshot_id is None:
            raise SlotActionError(f"Unable to restore slot: {len(tokens)} tokens of KV do not fit the prompt "
                                  f"cache (at least {s.prompt_cache.min_prefix} tokens, at most "
                                  f"{s.prompt_cache.max_bytes} bytes; --cache-ram)")
        s.slot_tokens[action.slot_id] = tokens
        try:
            return len(tokens), self._execute(SlotFile("restore", action.path, snapshot_id, len(tokens)))
        except SlotActionError:
            self._erase(action.slot_id)  # free what the failed restore indexed
            raise

    def _check(self, path: str) -> tuple[int, ...]:
        """The file's token ids, once its header says it holds this model's KV in this server's types."""
        try:
            meta = read_header(path)
            tokens = tuple(int(t) for t in json.loads(meta["tokens"]))
        except FileNotFoundError:
            raise SlotActionError("Unable to restore slot: no such file under --slot-save-path") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SlotActionError(f"Unable to restore slot: {exc}") from None
        i = self.identity
        if (meta.get("model"), meta.get("model_digest")) != (i.name, i.digest):
            raise SlotActionError(f"Unable to restore slot: the file holds the KV of model {meta.get('model')!r} "
                                  f"({meta.get('model_digest')}), not of the served {i.name!r} ({i.digest})")
        if (meta.get("cache_type_k"), meta.get("cache_type_v")) != (i.type_k, i.type_v):
            raise SlotActionError(f"Unable to restore slot: the file's KV is K {meta.get('cache_type_k')}, V "
                                  f"{meta.get('cache_type_v')}; this server stores K {i.type_k}, V {i.type_v}")
        return tokens

    def _erase(self, slot_id: int) -> int:
        """Forget the slot's KV and drop its prompt-cache entry (one another slot's longer entry covers stays)."""
        s = self.scheduler
        tokens = s.slot_tokens.pop(slot_id, ())
        if s.prompt_cache is None or not tokens or s.prompt_cache.covering(tokens) is None:
            return 0
        if s.prompt_cache.remove(tokens):
            self.runner.execute(s.command_step())  # the runner frees the dropped snapshot now
        return len(tokens)

