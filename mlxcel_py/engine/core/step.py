"""The contract between the scheduler and the runner: one `Step` record in, one `StepOutput` back,
through a `Runner` (the Protocol at the end of this file).

Plain, immutable data (ints, tuples, small frozen dataclasses): the runner executes what a
record says, in the record's order, and keeps KV, samplers and prompt-cache snapshots by id
but no ordering of its own. The same record is what another process's runner would
execute (the distributed engine broadcasts it), so nothing here refers to live objects.

A tick issues up to three records: the decode step, then the prefill piece (its chunk
depends on whether anything is still decoding *after* that decode step), then the
retirement of what finished in the piece, so the next admission finds its snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from .events import TokenLogprobs
from .request import SamplingParams

if TYPE_CHECKING:
    from ..runner.constraints import ConstraintCompiler


@dataclass(frozen=True, slots=True)
class BeginSequence:
    """Carried by a sequence's first prefill piece: how to sample it and where its KV starts."""

    sampling: SamplingParams
    history: tuple[int, ...]  # prompt tokens before the piece (the adopted prefix), for penalties
    adopt_id: Optional[int] = None  # the prompt-cache snapshot whose first `start` positions it reuses
    pooling: Optional[str] = None  # an embedding sequence: pool the hidden states, never sample
    images: Any = None  # the prompt's images (models/vision.PromptImages): its pieces' input embeddings
    lora: Optional[tuple[float, ...]] = None  # its LoRA adapters' scales (None: the loaded ones)


@dataclass(frozen=True, slots=True)
class PrefillPiece:
    """Forward prompt tokens [start, start + len(tokens)) of one sequence into its own KV."""

    seq_id: int
    start: int
    tokens: tuple[int, ...]
    chunk: int  # the chunk in force when the piece was planned (the piece may be shorter)
    terminal: bool  # sample the first token after it and move the sequence into the decode batch
    snapshot_id: Optional[int] = None  # store the KV of [0, end) under this id (the history boundary)
    begin: Optional[BeginSequence] = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True, slots=True)
class Retire:
    """Free a sequence's KV and sampler; first store its first `num_tokens` KV positions as a snapshot."""

    seq_id: int
    snapshot_id: Optional[int] = None
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Shift:
    """A context shift of one decode row (llama-server's --context-shift), before its decode:
    drop KV positions [n_keep, n_keep + n_discard) and move the later ones down by n_discard.

    `tokens` are the row's KV tokens after the shift (length: its KV length minus n_discard),
    for a runner that rebuilds the row by prefilling them instead of re-rotating keys."""

    seq_id: int
    n_keep: int
    n_discard: int
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SlotFile:
    """A slot action's file work (engine/core/slots.py): write a snapshot's first `length` positions
    to `path` with `metadata` (save; no snapshot: a file of no tokens), or read `path` into a snapshot."""

    action: str  # "save" | "restore"
    path: str
    snapshot_id: Optional[int]
    length: int = 0
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One record, executed in this order: retire, shift, decode, prefill, the slot file, then drop snapshots.

    Dropping last lets a piece adopt a snapshot that the same step's bookkeeping evicted.
    """

    retire: tuple[Retire, ...] = ()
    decode: tuple[int, ...] = ()  # seq ids, one row each, in this order
    prefill: Optional[PrefillPiece] = None
    drop_snapshots: tuple[int, ...] = ()
    decode_context: int = 0  # KV positions the decode rows attend over (the cost model's row context)
    # Per decode row, draft tokens to verify after its last token (prompt lookup); () when no row drafts.
    # A runner may ignore them (decode one token per row): the scheduler then sees nothing accepted.
    drafts: tuple[tuple[int, ...], ...] = ()
    # Per decode row, how many tokens the runner's draft model proposes for it (--draft-model); () when none.
    # A row has a lookup draft or a draft-model length, never both.
    draft_lengths: tuple[int, ...] = ()
    shift: tuple[Shift, ...] = ()  # context shifts of decode rows, run after retire and before decode
    slot_file: Optional[SlotFile] = None  # a slot save or restore, alone in its record (between ticks)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What the runner sampled: one token per decode row in the step's order, and the first token
    of a terminal prefill piece; with their logprobs where the sequence asked for them."""

    decoded: tuple[int, ...] = ()
    first_token: Optional[int] = None
    decoded_logprobs: tuple[Optional[TokenLogprobs], ...] = ()  # empty when no row asked
    first_logprobs: Optional[TokenLogprobs] = None
    # One per piece token when the sequence asked for prompt logprobs (None for the prompt's first).
    prompt_logprobs: tuple[Optional[TokenLogprobs], ...] = ()
    failed: tuple[tuple[int, str], ...] = ()  # (seq id, why): sequences whose sampling failed, to end with "error"
    embedding: Optional[Any] = None  # an embedding sequence's terminal piece: its pooled vector (numpy float32)
    # Per decode row, the tokens after `decoded[i]` that its verified draft let the step emit (each one
    # an accepted draft token, the last one the target's own); () when no row drafted.
    decoded_extra: tuple[tuple[int, ...], ...] = ()
    slot_file_bytes: int = 0  # the slot file's size, written or read
    slot_file_error: Optional[str] = None  # why the slot file could not be written or read


class Runner(Protocol):
    """What executes `Step` records: `runner.ModelRunner` in one process, the runners of
    engine/distributed/ over ranks, fakes in tests. Implementations subclass it, so the
    members they do not need keep these defaults (nothing to do, nothing to report)."""

    # The grammar compiler constrained sequences need (thread-safe); None: constraints refused.
    compiler: Optional["ConstraintCompiler"] = None
    # Whether decode rows' drafts are verified; False: the engine does not draft (nothing would be accepted).
    verifies_drafts: bool = False
    # Whether it executes `Step.slot_file` (writes and reads snapshots); False: slot actions answer 501.
    saves_slots: bool = False
    # Whether a record may carry the decode rows and a prefill piece for one forward (engine/runner/tick.py),
    # and the longest piece it runs that way (the cost model's `fused` ticks); False: separate records.
    one_forward: bool = False
    fuses_up_to: int = 0
    # How many tokens shorter than a snapshot a prompt-cache hit may be (its sliding-window layers keep
    # no older positions: engine/runner/kv_rows.py); None: any prefix of it.
    prefix_reach: Optional[int] = None
    # (sliding-window layers, the most positions a slot holds in them) where those keep only their window.
    kv_window: tuple[int, int] = (0, 0)

    def execute(self, step: Step) -> StepOutput:
        """Run one record in its order (retire, shift, decode, prefill, drop snapshots); ends in a sync."""
        raise NotImplementedError

    def context_shift_support(self) -> Optional[str]:
        """None when the runner executes `Step.shift` for this model; else why not (--context-shift refused)."""
        return f"{type(self).__name__} does not shift the KV cache"

    def idle(self) -> None:
        """Called by the worker when there is nothing to do (a distributed leader pings its ranks)."""

    def peak_memory_bytes(self) -> int:
        """The peak memory the runner's arrays have taken; 0 when it does not know."""
        return 0

    def close(self) -> None:
        """Free everything the runner holds; called once, after the last record."""
