"""The only code that calls the model: it executes `Step` records (engine/core/step.py).

Per sequence id it holds one `SequenceState` (its sampler, its prefill KV cache until it
joins the decode batch, its latest token); per snapshot id, the prompt cache's KV. The
batch's row order is an implementation detail: each decode step reorders it to the
record's order when they differ.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import mlx.core as mx

from . import slot_io
from .constraints import ConstraintCompiler
from .draft_model import DraftModel
from .kv import KVLayout, adopt, arrays, bytes_per_token, make_cache, snapshot
from ..core.events import TokenLogprobs
from .logits import sequence_logprobs
from .pooling import Pooler, hidden_fn
from .sampling import SampledToken, SequenceSampler, sample_step
from .shift import ContextShifter, shift_support
from .verify import roll_back, verify_inputs, verify_row
from ..core.step import PrefillPiece, Retire, Runner, Shift, SlotFile, Step, StepOutput

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


def _copy_kv(cache: list, length: int) -> list:
    """Independent per-layer copies of the first `length` positions."""
    out = [snapshot(layer, length) for layer in cache]
    mx.eval([arrays(c) for c in out])
    return out


def kv_bytes_per_token(model, layout: Optional[KVLayout] = None) -> int:
    """Bytes of K and V one token adds over all layers (what a prompt-cache entry costs per token)."""
    return bytes_per_token(model, layout)


@dataclass(slots=True)
class SequenceState:
    """What the runner holds for one sequence id, from its first piece to its retirement."""

    sampler: SequenceSampler
    prefill_cache: Optional[list] = None  # its own KV while prefilling; None once in the decode batch
    last_token: Optional[int] = None  # the latest sampled token (the next decode step's input)
    prompt_row: Optional[mx.array] = None  # echo: the last prompt position's raw logits, between pieces
    pooler: Optional[Pooler] = None  # an embedding sequence: its pool across pieces (it never decodes)


class ModelRunner(Runner):
    """Executes steps; owns every KV array and sampler, keyed by the ids the records carry.

    `decode`: the loader's CPU decode step (models/cpu_decode.py; None: mlx-lm's forward);
    `kernels`: the loader's scope for its CPU prefill kernels (models/cpu_kernels.py), entered
    around every forward; `draft`: the draft model of --draft-model (engine/runner/draft_model.py);
    `kv`: the KV storage type (engine/runner/kv.py; None: the model's dtype)."""

    verifies_drafts = True  # a runner whose sampling must match other ranks' sets False: drafts ignored
    saves_slots = True  # executes Step.slot_file (engine/runner/slot_io.py)
    shift_mode = "prefill"  # how Step.shift rebuilds a row (engine/runner/shift.py: "prefill" or "rotate")

    def __init__(self, model, compiler: Optional[ConstraintCompiler] = None, *,
                 decode: Optional[DecodeFn] = None, kernels: Optional[ContextManager[Any]] = None,
                 verify: Optional[VerifyFn] = None, draft: Optional[DraftModel] = None,
                 kv: Optional[KVLayout] = None):
        self.model = model
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

    def execute(self, step: Step) -> StepOutput:
        """Run one record in its order: retire, shift, decode, prefill, the slot file, drop snapshots."""
        if step.retire:
            self._retire(step.retire)
        if step.shift:
            self._shift(step.shift)
        decoded, extra = self._decode(step.decode, step.drafts, step.draft_lengths) if step.decode else ([], ())
        first, prompt, embedding = None, (), None
        if step.prefill is not None and self._pools(step.prefill):
            embedding = self._embed_piece(step.prefill)
        elif step.prefill is not None:
            first, prompt = self._run_piece(step.prefill)
        slot_bytes, slot_error = self._slot_file(step.slot_file) if step.slot_file is not None else (0, None)
        for snapshot_id in step.drop_snapshots:
            self._snapshots.pop(snapshot_id, None)
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
                layers = self._snapshots[work.snapshot_id] if work.snapshot_id is not None else None
                return slot_io.save(work.path, layers, work.length, dict(work.metadata)), None
            layers, nbytes = slot_io.load(work.path, self.model, self.kv, work.length)
            mx.eval([arrays(c) for c in layers])
            self._snapshots[work.snapshot_id] = layers
            return nbytes, None
        except (OSError, ValueError, RuntimeError) as exc:  # a full disk, a damaged file: the action's answer
            return 0, str(exc) or type(exc).__name__

    # -- prefill ----------------------------------------------------------------------------
    def _run_piece(self, piece: PrefillPiece) -> tuple[Optional[SampledToken], tuple]:
        if piece.begin is not None:
            self._begin(piece)
        state = self._seqs[piece.seq_id]
        cache = state.prefill_cache
        state.sampler.extend_prompt(piece.tokens)
        prompt: tuple = ()
        with self._kernels:
            if state.sampler.params.prompt_logprobs:
                logits, prompt = self._score_piece(piece, state)
            else:
                logits = self._forward_prefill(mx.array(piece.tokens)[None], cache, piece.terminal)
        if self.draft is not None:
            self.draft.prefill(piece.seq_id, piece.tokens, piece.terminal)
        if piece.snapshot_id is not None:
            self._snapshots[piece.snapshot_id] = _copy_kv(cache, piece.end)
        if not piece.terminal:
            return None, prompt
        sampled = self._sample(logits, [piece.seq_id])[0]
        self._join(piece.seq_id, state, sampled.token_id)
        return sampled, prompt

    def _pools(self, piece: PrefillPiece) -> bool:
        if piece.begin is not None:
            return piece.begin.pooling is not None
        state = self._seqs.get(piece.seq_id)
        return state is not None and state.pooler is not None

    def _embed_piece(self, piece: PrefillPiece):
        """Forward an embedding sequence's piece into its KV and pool its hidden states; after the
        terminal piece, its vector (numpy), and the sequence's KV is freed at once (no decode)."""
        if piece.begin is not None:
            self._begin(piece)
            self._seqs[piece.seq_id].pooler = Pooler(piece.begin.pooling)
        state = self._seqs[piece.seq_id]
        inner = hidden_fn(self.model)
        if inner is None:
            raise RuntimeError("this model exposes no hidden states (no inner `model` module) to embed")
        with self._kernels:
            hidden = inner(mx.array(piece.tokens)[None], cache=state.prefill_cache)
        state.pooler.add(hidden[0])
        mx.eval([c.state for c in state.prefill_cache] + state.pooler.arrays())
        if not piece.terminal:
            return None
        del self._seqs[piece.seq_id]
        return state.pooler.result()

    def _score_piece(self, piece: PrefillPiece, state: SequenceState) -> tuple[mx.array, tuple[Optional[TokenLogprobs], ...]]:
        """Forward a piece with logits at every position: each prompt token's logprob given the
        tokens before it (the first token of the prompt has none). Returns the last row too."""
        logits = self.model(mx.array(piece.tokens)[None], cache=state.prefill_cache)[0]
        previous, state.prompt_row = state.prompt_row, None
        rows = logits[:-1] if previous is None else mx.concatenate([previous, logits[:-1]], axis=0)
        scored = piece.tokens[1:] if previous is None else piece.tokens
        top = state.sampler.params.top_logprobs
        out = tuple(sequence_logprobs(rows, list(scored), top)) if scored else ()
        if previous is None:
            out = (None,) + out
        if not piece.terminal:
            state.prompt_row = logits[-1:]
        return logits[-1:], out

    def _begin(self, piece: PrefillPiece) -> None:
        begin = piece.begin
        cache = make_cache(self.model, self.kv)
        if begin.adopt_id is not None:  # share the snapshot's first `start` positions, no copy
            for layer, snap in zip(cache, self._snapshots[begin.adopt_id]):
                adopt(layer, snap, piece.start)
        constraint = begin.sampling.constraint
        matcher = None
        if constraint is not None:
            if self.compiler is None:
                raise RuntimeError("a constrained sequence reached a runner without a grammar compiler")
            matcher = self.compiler.matcher(constraint)  # compiled (and cached) when the request was checked
        sampler = SequenceSampler(begin.sampling, prompt_ids=begin.history, matcher=matcher)
        self._seqs[piece.seq_id] = SequenceState(sampler, prefill_cache=cache)
        if self.draft is not None and begin.pooling is None:
            self.draft.begin(piece.seq_id, begin.history)

    def _forward_prefill(self, tokens: mx.array, cache: list, terminal: bool) -> Optional[mx.array]:
        """Run one piece; the (1, V) logits of its last position when terminal, else only the KV."""
        if self._project is None:
            out = self.model(tokens, cache=cache)
            if not terminal:
                mx.eval([c.state for c in cache])
                return None
            return out[:, -1, :]
        hidden = self.model.model(tokens, cache=cache)
        if not terminal:
            mx.eval([c.state for c in cache])  # the LM head is never computed for inner pieces
            return None
        return self._project(hidden[:, -1, :])

    def _join(self, seq_id: int, state: SequenceState, token: int) -> None:
        """Merge a finished prefill's KV into the decode batch."""
        rows = [layer.merge([layer]) for layer in state.prefill_cache]
        state.prefill_cache, state.last_token = None, token
        if self._batch is None:
            self._batch = rows
        else:
            for batch_layer, row in zip(self._batch, rows):
                batch_layer.extend(row)
        self._rows.append(seq_id)

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
        if self._fast_decode is not None:  # the CPU decode step (models/cpu_decode.py), same contract
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
        if self._fast_verify is not None:  # writes in place into the buffers the CPU decode step owns
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
        roll_back(self._batch, inputs.shape[1], [len(run) for run in runs])
        for seq_id, run in zip(seq_ids, runs):
            self._seqs[seq_id].last_token = run[-1]
        sampled = [firsts.get(i) or SampledToken(run[0]) for i, run in enumerate(runs)]
        return sampled, tuple(tuple(run[1:]) for run in runs)

    def _reorder(self, seq_ids: tuple[int, ...]) -> None:
        if sorted(seq_ids) != sorted(self._rows):
            raise RuntimeError(f"decode rows {seq_ids} are not the sequences in the batch {self._rows}")
        order = [self._rows.index(s) for s in seq_ids]
        for layer in self._batch:
            layer.filter(order)
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
            self._shifter.apply(self._batch, self._rows.index(shift.seq_id), shift)
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
                continue  # aborted mid-prefill, or never started
            drop.add(work.seq_id)
            if work.snapshot_id is not None:
                self._snapshots[work.snapshot_id] = self._extract(self._rows.index(work.seq_id), work.num_tokens)
        if drop:
            keep = [i for i, s in enumerate(self._rows) if s not in drop]
            self._rows = [self._rows[i] for i in keep]
            if keep:
                for layer in self._batch:
                    layer.filter(keep)
            else:
                self._batch = None

    def _extract(self, row: int, num_tokens: int) -> list:
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
