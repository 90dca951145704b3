"""The only code that calls the model: chunked prefill into a sequence's own KV cache,
batched decode over the active batch, and KV retirement with prompt-cache snapshots."""

from __future__ import annotations

from typing import Any, Callable, Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from .kv import CacheHit
from .sampling import SequenceSampler, sample_rows
from .sequence import DecodeWork, PrefillOutput, PrefillWork, RetireWork, Snapshot

PAD_TOKEN = 0


def _project_fn(model) -> Optional[Callable[[mx.array], mx.array]]:
    """The LM head alone, so a prefill computes logits for its last position only."""
    inner, args = getattr(model, "model", None), getattr(model, "args", None)
    if inner is None or args is None:
        return None
    if getattr(args, "tie_word_embeddings", False) and hasattr(inner, "embed_tokens"):
        return inner.embed_tokens.as_linear
    return getattr(model, "lm_head", None)


def _copy_kv(cache: list, length: int) -> list[KVCache]:
    """Independent per-layer copies of the first `length` positions."""
    out = []
    for layer in cache:
        snap = KVCache()
        snap.keys = mx.contiguous(layer.keys[..., :length, :])
        snap.values = mx.contiguous(layer.values[..., :length, :])
        snap.offset = length
        out.append(snap)
    mx.eval([(c.keys, c.values) for c in out])
    return out


def _nbytes(cache: list) -> int:
    return sum(c.keys.nbytes + c.values.nbytes for c in cache)


class Runner:
    """Owns every KV array; works only on the seq ids the scheduler hands it."""

    def __init__(self, model):
        self.model = model
        self._project = _project_fn(model)
        self._fast_decode = getattr(model, "mlxcel_decode", None)  # models/cpu_decode.py, CPU only
        self._prefill: dict[int, list] = {}
        self._samplers: dict[int, SequenceSampler] = {}
        self._last: dict[int, int] = {}
        self._rows: list[int] = []
        self._batch: Optional[list] = None
        self.last_prefill_logits: Optional[mx.array] = None  # kept for equivalence tests

    # -- prefill ----------------------------------------------------------------------------
    def prefill(self, work: PrefillWork) -> PrefillOutput:
        cache = self._prefill.get(work.seq_id)
        if cache is None:
            cache = self._start(work)
        piece = work.piece
        ids = list(work.prompt_ids[piece.start : piece.end]) + [PAD_TOKEN] * piece.num_pad
        logits = self._forward_prefill(mx.array(ids)[None], cache, piece.length if piece.terminal else None)
        if piece.num_pad:
            for layer in cache:
                layer.trim(piece.num_pad)
        snapshot = None
        if work.snapshot:
            snapshot = Snapshot(work.prompt_ids[: piece.end], (kv := _copy_kv(cache, piece.end)), _nbytes(kv))
        if not piece.terminal:
            return PrefillOutput(None, snapshot)
        self.last_prefill_logits = logits
        sampler = self._samplers[work.seq_id]
        token = int(sample_rows(logits, [sampler]).item())
        self._join(work.seq_id, self._prefill.pop(work.seq_id), token)
        return PrefillOutput(token, snapshot)

    def _start(self, work: PrefillWork) -> list:
        cache = make_prompt_cache(self.model)
        if work.adopt is not None:
            _adopt(cache, work.adopt)
        sampler = SequenceSampler(work.sampling)
        if sampler.needs_processing:
            sampler.history = list(work.prompt_ids)
        self._samplers[work.seq_id] = sampler
        self._prefill[work.seq_id] = cache
        return cache

    def _forward_prefill(self, tokens: mx.array, cache: list, logits_at: Optional[int]) -> Optional[mx.array]:
        """Run one piece; logits (1, V) at position `logits_at - 1` when asked, else only the KV."""
        if self._project is None:
            out = self.model(tokens, cache=cache)
            if logits_at is None:
                mx.eval([c.state for c in cache])
                return None
            return out[:, logits_at - 1, :]
        hidden = self.model.model(tokens, cache=cache)
        if logits_at is None:
            mx.eval([c.state for c in cache])  # the LM head is never computed for inner pieces
            return None
        return self._project(hidden[:, logits_at - 1, :])

    def _join(self, seq_id: int, cache: list, token: int) -> None:
        """Merge a finished prefill's KV into the active batch."""
        rows = [layer.merge([layer]) for layer in cache]
        if self._batch is None:
            self._batch = rows
        else:
            for batch_layer, row in zip(self._batch, rows):
                batch_layer.extend(row)
        self._rows.append(seq_id)
        self._note(seq_id, token)

    def _note(self, seq_id: int, token: int) -> None:
        self._last[seq_id] = token
        sampler = self._samplers[seq_id]
        if sampler.needs_processing:
            sampler.history.append(token)

    # -- decode -----------------------------------------------------------------------------
    def decode(self, work: DecodeWork) -> tuple[int, ...]:
        if tuple(self._rows) != work.seq_ids:
            raise RuntimeError(f"runner rows {self._rows} do not match the decode batch {work.seq_ids}")
        last = [self._last[s] for s in self._rows]
        if self._fast_decode is not None:
            logits = self._fast_decode(last, self._batch)
        else:
            logits = self.model(mx.array(last)[:, None], cache=self._batch)[:, -1, :]
        tokens = sample_rows(logits, [self._samplers[s] for s in self._rows]).tolist()
        for seq_id, token in zip(self._rows, tokens):
            self._note(seq_id, token)
        return tuple(tokens)

    # -- retire -----------------------------------------------------------------------------
    def retire(self, works: list[RetireWork]) -> list[Snapshot]:
        """Free finished or aborted sequences; snapshot the ones asked for first."""
        snapshots: list[Snapshot] = []
        drop: set[int] = set()
        for work in works:
            self._samplers.pop(work.seq_id, None)
            self._last.pop(work.seq_id, None)
            if self._prefill.pop(work.seq_id, None) is not None or work.seq_id not in self._rows:
                continue
            drop.add(work.seq_id)
            if work.snapshot_tokens:
                snap = self._extract(self._rows.index(work.seq_id), work.snapshot_tokens)
                if snap is not None:
                    snapshots.append(snap)
        if drop:
            keep = [i for i, s in enumerate(self._rows) if s not in drop]
            self._rows = [self._rows[i] for i in keep]
            if keep:
                for layer in self._batch:
                    layer.filter(keep)
            else:
                self._batch = None
        return snapshots

    def _extract(self, row: int, tokens: tuple[int, ...]) -> Optional[Snapshot]:
        kv = [layer.extract(row) for layer in self._batch]
        if kv[0].offset != len(tokens):  # bookkeeping disagrees: cache nothing rather than wrong KV
            return None
        mx.eval([(c.keys, c.values) for c in kv])
        return Snapshot(tokens, kv, _nbytes(kv))

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def close(self) -> None:
        """Drop every KV array and sync MLX from the stopping thread.

        This made an abort at process exit after engine-thread work rarer, not impossible
        (ml-explore/mlx#3126); the console script (`cli/app.main`) exits with os._exit.
        """
        self._prefill.clear()
        self._batch, self._rows = None, []
        mx.synchronize()


def _adopt(cache: list, hit: CacheHit) -> None:
    """Start a sequence's cache from the first `hit.length` positions of a snapshot (shared, not copied)."""
    entry: list[Any] = hit.entry.kv
    for layer, snap in zip(cache, entry):
        layer.keys = snap.keys[..., : hit.length, :]
        layer.values = snap.values[..., : hit.length, :]
        layer.offset = hit.length
