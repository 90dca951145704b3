"""What a decode row gets beyond its one token, for the Scheduler: drafts to verify
(--lookup-ngram, --draft-model; the gate's cost-aware length) and context shifts (--context-shift).
A mixin over the Scheduler's state (running, budget, counters, drafting, gate, slot_context)."""

from __future__ import annotations

from .context_shift import apply_shift, draft_room, shift_plan
from .drafting import draft_for
from .sequence import Sequence
from .step import Shift, Step, StepOutput


def _seeded(seq: Sequence) -> bool:
    p = seq.request.sampling
    return p.seed is not None and p.temperature > 0


class DecodeRows:
    """The Scheduler's drafting and shifting of decode rows (plain Python, no state of its own)."""

    def _shifts(self) -> tuple[Shift, ...]:
        """Shift every decode row whose next token would not fit its slot (--context-shift)."""
        if not self.context_shift:
            return ()
        records = []
        for seq in filter(self._shifting, self.running):
            plan = shift_plan(seq, self.slot_context)
            if plan is not None:
                records.append(apply_shift(seq, *plan))
                self.budget.give_back(seq.seq_id, plan[1])
                self.counters["context_shifts"] += 1
                self.counters["discarded"] += plan[1]
        return tuple(records)

    def _shifting(self, seq: Sequence) -> bool:
        return self.context_shift and seq.request.context_shift

    def _draft(self, seq: Sequence) -> tuple[tuple[int, ...], int]:
        """One row's (lookup draft, draft-model length); none for grammars, thinking budgets and logprobs."""
        if self.drafting is None:
            return (), 0
        p = seq.request.sampling
        eligible = p.constraint is None and p.thinking is None and not p.logprobs
        history = seq.request.prompt_ids + tuple(seq.output_ids)
        room = seq.max_tokens - len(seq.output_ids)
        if self._shifting(seq):  # the slot, not max_tokens, bounds a shifting row
            room = min(room, draft_room(seq, self.slot_context))
        cap = None if self.gate is None or _seeded(seq) else self.gate.length_cap(len(self.running), seq.draft.alpha)
        return draft_for(self.drafting, seq.draft, history, room, eligible, cap)

    def timed_decode(self, step: Step, out: StepOutput, seconds: float) -> None:
        """The engine's timing of a decode step: the draft gate compares verify and plain steps' rates."""
        if self.gate is not None and step.decode:
            tokens = len(step.decode) + sum(len(more) for more in out.decoded_extra)
            width = max([len(d) for d in step.drafts] + list(step.draft_lengths), default=0)
            self.gate.observe(len(step.decode), self.counters["decode_steps"], tokens, seconds, width > 0, width)

    def _verified(self, seq: Sequence, drafted: int, accepted: tuple[int, ...]) -> None:
        """Book one verify of `drafted` tokens: the EMA, the counters, the KV reserved for the rejected ones."""
        seq.draft.observe(drafted, len(accepted))
        self.counters["drafted"] += drafted
        self.counters["draft_accepted"] += len(accepted)
        self.budget.give_back(seq.seq_id, drafted - len(accepted))
