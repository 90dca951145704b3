"""The only code that calls the model: it executes `Step` records (engine/core/step.py).

Per sequence id it holds one `SequenceState` (its sampler, its prefill KV cache until it
joins the decode batch, its latest token); per snapshot id, the prompt cache's KV. The prompt
side (pieces, embeddings, prompt logprobs, joining the batch) is engine/runner/prompt_side.py. The
batch's row order is an implementation detail: each decode step reorders it to the
record's order when they differ.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import mlx.core as mx
import numpy as np

from . import slot_io
from .constraints import ConstraintCompiler
from .draft_model import DraftModel
from .kv import KVLayout, arrays, bytes_per_token, snapshot
from .kv_rows import PREFIX_REACH, RELEASE_STEP, WINDOW_SLACK, windows_of
from .prompt_side import PromptSide, SequenceState
from .row_prefill import RowPrefill
from .sampling import SampledToken, sample_step
from .shift import ContextShifter, shift_support
from .tick import FusedTick
from .verify import roll_back, verify_inputs, verify_row
from ..core.step import Retire, Runner, Shift, SlotFile, Step, StepOutput

DecodeFn = Callable[[list[int], list], mx.array]  # (last tokens, batch KV) -> (B, V) logits
VerifyFn = Callable[[list[list[int]], list], mx.array]  # (B rows of W tokens, batch KV) -> (B, W, V) logits


def _project_fn(model) -> Optional[Callable[[mx.array], mx.array]]:
    """The LM head alone, so a prefill computes logits for its last position only."""
    inner, args = getattr(model, "model", None), getattr(model, "args", None)
    if inner is None or args is None:
        return None
    if getattr(args, "tie_word_embeddings", False) and hasattr(inner, "embed_tokens"):
        return inner.embed_tokens.as_linear
    return getattr(model, "lm_head", None)


def _owns_rows(decode, kv: Optional[KVLayout]) -> bool:
    """True when the CPU decode step can run over the engine's own rows (the model's KV dtype)."""
    from ...models.cpu.rows import supports_rows

    return decode is not None and supports_rows(decode) and (kv is None or kv.native)


def kv_bytes_per_token(model, layout: Optional[KVLayout] = None) -> int:
    """Bytes of K and V one token adds over all layers (what a prompt-cache entry costs per token)."""
    return bytes_per_token(model, layout)


class ModelRunner(PromptSide, RowPrefill, FusedTick, Runner):
    """Executes steps; owns every KV array and sampler, keyed by the ids the records carry.

    `decode`: the loader's CPU decode step (models/cpu/decoder.py; None: mlx-lm's forward);
    `kernels`: the loader's scope for its CPU prefill kernels (models/cpu/prefill_kernels.py), entered
    around every forward; `draft`: the draft model of --draft-model (engine/runner/draft_model.py);
    `kv`: the KV storage type (engine/runner/kv.py; None: the model's dtype); `kv_rows`: keep the
    decode batch in the engine's own per-slot rows (engine/runner/kv_rows.py; None: wherever the CPU
    decode step can run over them, False: mlx-lm's BatchKVCache); `rows_hint`: those rows' first
    (slots, positions), so that joins up to them regrow nothing."""

    verifies_drafts = True  # a runner whose sampling must match other ranks' sets False: drafts ignored
    saves_slots = True  # executes Step.slot_file (engine/runner/slot_io.py)
    shift_mode = "prefill"  # how Step.shift rebuilds a row (engine/runner/shift.py: "prefill" or "rotate")
    share_prefixes = True  # over the owned rows, snapshots are pinned rows shared by reference (kv_rows.py)

    def __init__(self, model, compiler: Optional[ConstraintCompiler] = None, *,
                 decode: Optional[DecodeFn] = None, kernels: Optional[ContextManager[Any]] = None,
                 verify: Optional[VerifyFn] = None, draft: Optional[DraftModel] = None,
                 kv: Optional[KVLayout] = None, kv_rows: Optional[bool] = None,
                 rows_hint: Optional[tuple[int, int]] = None, rank_head: Any = None, vision: Any = None,
                 lora: Any = None):
        self.model = model
        self.lora = lora  # the LoRA adapters' scale state (models/lora.LoraState): each forward's rows set it
        self.rank_head = rank_head  # a reranker's classifier (models/ranking.RankHead): rank pooling's outputs
        self.vision = vision  # a VLM's image side (models/vision.Vision): prompts with images
        if rows_hint is not None:  # the owned rows' first (slots, capacity): engine/runner/kv_rows.py
            self.rows_hint = rows_hint
        self.kv = kv
        self.compiler = compiler  # grammars for constrained sequences (built lazily per model)
        self._project = _project_fn(model)
        self._fast_decode = decode
        self._fast_verify = verify  # the CPU decode step's span form; None: verify through mlx-lm
        self._kernels = kernels if kernels is not None else contextlib.nullcontext()
        self._seqs: dict[int, SequenceState] = {}
        self._snapshots: dict[int, list] = {}  # KVCache or kv.TypedKVCache rows
        self._rows: list[int] = []  # the decode batch's row order
        self._batch: Optional[list] = None
        self.draft = draft
        self._shifter: Optional[ContextShifter] = None
        self._owned = _owns_rows(decode, kv) if kv_rows is None else kv_rows  # self._batch is a RowKV
        self._worked = True  # a record ran since the last idle call (`idle`); at first, the load's temporaries

    @property
    def prefix_reach(self) -> Optional[int]:
        """Over the owned rows, a sliding-window model's snapshots keep only what their window reads."""
        return PREFIX_REACH if self._owned and any(windows_of(self._fast_decode)) else None

    @property
    def kv_window(self) -> tuple[int, int]:
        """(sliding-window layers, the most positions a slot holds in them) where they keep only their
        window (kv_rows.py); (0, 0) where every layer keeps every position."""
        windows = windows_of(self._fast_decode) if self.prefix_reach is not None else ()
        held = sum(1 for w in windows if w)
        return (held, max(windows) + WINDOW_SLACK + RELEASE_STEP) if held else (0, 0)

    def idle(self) -> None:
        """The first idle call after work (or after the load, whose repacking leaves its temporaries)
        hands the C heap's free pages back: a prefill's numpy temporaries leave ~125 MB of them
        resident otherwise (Gemma 3 270M, 2,048 tokens); the next prefill faults them in again (a few
        ms of its seconds)."""
        if self._worked:
            from ...models.footprint import malloc_trim

            malloc_trim()
            self._worked = False

    def execute(self, step: Step) -> StepOutput:
        """Run one record in its order: retire, shift, decode, prefill, the slot file, drop snapshots."""
        self._worked = True
        if step.retire:
            self._retire(step.retire)
        if step.shift:
            self._shift(step.shift)
        first, prompt, embedding, extra = None, (), None, ()
        if self._fuses(step):  # one forward for the decode rows and the piece (engine/runner/tick.py)
            decoded, first = self._fused_tick(step)
        else:
            decoded, extra = self._decode(step.decode, step.drafts, step.draft_lengths) if step.decode else ([], ())
            if step.prefill is not None and self._pools(step.prefill):
                embedding = self._embed_piece(step.prefill)
            elif step.prefill is not None:
                first, prompt = self._run_piece(step.prefill)
        slot_bytes, slot_error = self._slot_file(step.slot_file) if step.slot_file is not None else (0, None)
        for snapshot_id in step.drop_snapshots:
            self._drop_snapshot(snapshot_id)
        logprobs = tuple(s.logprobs for s in decoded)
        failed = [(seq_id, s.error) for seq_id, s in zip(step.decode, decoded) if s.error]
        if first is not None and first.error:
            failed.append((step.prefill.seq_id, first.error))
        return StepOutput(
            tuple(s.token_id for s in decoded), first.token_id if first else None,
            logprobs if any(lp is not None for lp in logprobs) else (), first.logprobs if first else None, prompt,
            tuple(failed), embedding, extra, slot_bytes, slot_error,
        )

    def _slot_file(self, work: SlotFile) -> tuple[int, Optional[str]]:
        """Write a snapshot to a slot file, or read one into a snapshot: (bytes, None) or (0, why)."""
        try:
            if work.action == "save":
                layers = self._snapshot_layers(work.snapshot_id) if work.snapshot_id is not None else None
                return slot_io.save(work.path, layers, work.length, dict(work.metadata)), None
            layers, nbytes = slot_io.load(work.path, self.model, self.kv, work.length)
            mx.eval([arrays(c) for c in layers])
            self._snapshots[work.snapshot_id] = self._rows_kv(layers).pin(layers, work.length) if self._shares \
                else layers
            return nbytes, None
        except (OSError, ValueError, RuntimeError) as exc:  # a full disk, a damaged file: the action's answer
            return 0, str(exc) or type(exc).__name__

    # -- decode -----------------------------------------------------------------------------
    def _decode(self, seq_ids: tuple[int, ...], drafts: tuple[tuple[int, ...], ...] = (),
                lengths: tuple[int, ...] = ()) -> tuple[list[SampledToken], tuple[tuple[int, ...], ...]]:
        if tuple(self._rows) != seq_ids:
            self._reorder(seq_ids)
        last = [self._seqs[s].last_token for s in seq_ids]
        if self.draft is None:
            return self._decode_rows(seq_ids, last, drafts)
        fed = bool(lengths) and self.verifies_drafts
        if fed:  # the draft model fills the rows that asked (a row has a lookup draft or a length)
            proposed = self.draft.propose(seq_ids, last, lengths)
            drafts = tuple(d or p for d, p in zip(drafts or ((),) * len(seq_ids), proposed))
        sampled, extra = self._decode_rows(seq_ids, last, drafts)
        runs = [[s.token_id, *more] for s, more in zip(sampled, extra or ((),) * len(seq_ids))]
        taken = [run[:-1] if fed else [t, *run[:-1]] for t, run in zip(last, runs)]
        self.draft.decoded(seq_ids, taken, fed)
        return sampled, extra

    def _decode_rows(self, seq_ids: tuple[int, ...], last: list[int], drafts: tuple[tuple[int, ...], ...]
                     ) -> tuple[list[SampledToken], tuple[tuple[int, ...], ...]]:
        if drafts and any(drafts) and self.verifies_drafts:
            return self._verify(seq_ids, last, drafts)
        with self._lora_for(seq_ids):
            if self._owned:
                logits = self._rows_forward(last, 1)
            elif self._fast_decode is not None:  # the CPU decode step (models/cpu/decoder.py), same contract
                logits = self._fast_decode(last, self._batch)
            else:
                with self._kernels:
                    logits = self.model(mx.array(last)[:, None], cache=self._batch)[:, -1, :]
        sampled = self._sample(logits, seq_ids)
        for seq_id, s in zip(seq_ids, sampled):
            self._seqs[seq_id].last_token = s.token_id
        return sampled, ()

    def _verify(self, seq_ids: tuple[int, ...], last: list[int], drafts: tuple[tuple[int, ...], ...]
                ) -> tuple[list[SampledToken], tuple[tuple[int, ...], ...]]:
        """One forward over every row's [last token + draft] (engine/runner/verify.py); the KV of
        what was not accepted is rolled back. Drafted rows carry no grammar and no logprobs."""
        inputs = verify_inputs(last, drafts)
        with self._lora_for(seq_ids):
            if self._owned:
                logits = self._rows_forward(inputs.tolist(), inputs.shape[1])
            elif self._fast_verify is not None:  # writes in place into the buffers the CPU decode step owns
                logits = self._fast_verify(inputs.tolist(), self._batch)
            else:
                with self._kernels:
                    logits = self.model(inputs, cache=self._batch)
        firsts: dict[int, SampledToken] = {}
        plain = [i for i, draft in enumerate(drafts) if not draft]  # grammars, logprobs: the usual sampler
        if plain:
            rows = self._sample(logits[mx.array(plain), 0, :], [seq_ids[i] for i in plain])
            firsts = dict(zip(plain, rows))
        runs = [[firsts[i].token_id] if i in firsts else verify_row(logits[i], draft, self._seqs[s].sampler)
                for i, (s, draft) in enumerate(zip(seq_ids, drafts))]
        if self._owned:
            for row, run in enumerate(runs):
                self._batch.trim(row, inputs.shape[1] - len(run))
        else:
            roll_back(self._batch, inputs.shape[1], [len(run) for run in runs])
        for seq_id, run in zip(seq_ids, runs):
            self._seqs[seq_id].last_token = run[-1]
        sampled = [firsts.get(i) or SampledToken(run[0]) for i, run in enumerate(runs)]
        return sampled, tuple(tuple(run[1:]) for run in runs)

    def _reorder(self, seq_ids: tuple[int, ...]) -> None:
        if sorted(seq_ids) != sorted(self._rows):
            raise RuntimeError(f"decode rows {seq_ids} are not the sequences in the batch {self._rows}")
        order = [self._rows.index(s) for s in seq_ids]
        self._filter(order)
        self._rows = list(seq_ids)

    def _sample(self, logits: mx.array, seq_ids) -> list[SampledToken]:
        """Sample each row, read logprobs where asked, and advance each sampler (penalties, grammar)."""
        return sample_step(logits, [self._seqs[s].sampler for s in seq_ids], self.compiler)

    # -- context shift ----------------------------------------------------------------------
    def context_shift_support(self) -> Optional[str]:
        if self.kv is not None and not self.kv.native:  # the shift rebuilds rows of mlx-lm's float BatchKVCache
            return f"the KV is stored as {self.kv.describe()}; shift with the model's own KV dtype"
        return shift_support(self.model)

    def _shift(self, shifts: tuple[Shift, ...]) -> None:
        if self._shifter is None:
            self._shifter = ContextShifter(self.model, self._kernels, self.shift_mode)
        for shift in shifts:
            row = self._rows.index(shift.seq_id)
            if not self._rebuild_row(row, shift):  # else rebuilt as rows of the decode step (row_prefill.py)
                with self._lora_for((shift.seq_id,)):
                    if self._owned:
                        self._shifter.apply_rows(self._batch, row, shift)
                    else:
                        self._shifter.apply(self._batch, row, shift)
            if self.draft is not None:
                self.draft.shift(shift)

    # -- retire -----------------------------------------------------------------------------
    def _retire(self, retire: tuple[Retire, ...]) -> None:
        """Free finished or aborted sequences; store the snapshots asked for first."""
        drop: set[int] = set()
        if self.draft is not None:
            self.draft.retire([work.seq_id for work in retire])
        for work in retire:
            state = self._seqs.pop(work.seq_id, None)
            if (state is not None and state.prefill_cache is not None) or work.seq_id not in self._rows:
                if state is not None:
                    self._release_prefix(state)
                continue  # aborted mid-prefill, or never started
            drop.add(work.seq_id)
            if work.snapshot_id is not None:
                row = self._rows.index(work.seq_id)
                self._snapshots[work.snapshot_id] = self._batch.pin_row(row, work.num_tokens) if self._shares \
                    else self._extract(row, work.num_tokens)
        if drop:
            keep = [i for i, s in enumerate(self._rows) if s not in drop]
            self._rows = [self._rows[i] for i in keep]
            if keep or self._owned:  # the owned rows stay: their pinned slots may outlive the batch
                self._filter(keep)
            else:
                self._batch = None

    def _filter(self, rows: list[int]) -> None:
        if self._owned:
            self._batch.keep(rows)
        else:
            for layer in self._batch:
                layer.filter(rows)

    def _rows_forward(self, tokens: list, width: int) -> mx.array | np.ndarray:
        """The CPU decode step over the owned rows: (B, V) numpy logits for width 1 (sampled in numpy:
        sampling.sample_step), else a (B, width, V) mx.array."""
        from ...models.cpu.rows import forward_rows

        kv = self._batch
        slots, starts, positions, prefix = kv.step_arrays(width)
        flat = [t for row in tokens for t in row] if width > 1 else tokens
        logits = forward_rows(self._fast_decode, flat, kv.keys, kv.values, slots, starts, positions, width, prefix)
        kv.advance(width)
        return logits if width == 1 else mx.array(logits.reshape(len(tokens), width, -1))

    def _extract(self, row: int, num_tokens: int) -> list:
        if self._owned:
            kv = self._batch.extract(row, num_tokens)
            mx.eval([arrays(c) for c in kv])
            return kv
        kv = [layer.extract(row) for layer in self._batch]
        if kv[0].offset < num_tokens:  # the scheduler's count and the KV disagree: a bug, not bad input
            raise RuntimeError(f"snapshot of {num_tokens} tokens asked, but the row holds {kv[0].offset}")
        if kv[0].offset > num_tokens:  # a verified draft ran past the finish: its tail is not the reply
            kv = [snapshot(c, num_tokens) for c in kv]
        mx.eval([arrays(c) for c in kv])
        return kv

    def peak_memory_bytes(self) -> int:
        """MLX's peak allocation; the CPU backend may not track it, so the process's peak RSS then."""
        peak = mx.get_peak_memory()
        if not peak:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return int(peak)

    def close(self) -> None:
        """Drop every KV array and sync MLX from the stopping thread.

        This made an abort at process exit after engine-thread work rarer, not impossible
        (ml-explore/mlx#3126); the console script (`cli/app.main`) exits with os._exit.
        """
        self._seqs.clear()
        self._snapshots.clear()
        self._batch, self._rows = None, []
        if self.draft is not None:
            self.draft.close()
        mx.synchronize()
