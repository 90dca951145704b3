"""One sequence's place in a reasoning reply's thinking, token by token (no MLX): before it,
inside it (counting its tokens), or past it, and the marker tokens that must come next.

It drives two things in engine/runner/sampling.py: the budget (after `budget` thinking tokens
the end marker's ids are forced, as llama-server's --reasoning-budget does) and an answer-only
constraint (the grammar's mask applies once the thinking has closed, or from the first token
when the reply does not open one)."""

from __future__ import annotations

from typing import Optional

from ..core.request import ThinkingSpec

START, THINK, ANSWER = "start", "think", "answer"


class ThinkingState:
    """Feed every sampled token to `accept`; `forced` is the token that must come next (or None)."""

    def __init__(self, spec: ThinkingSpec):
        self.spec = spec
        self.phase = START
        self.num_thinking = 0  # tokens inside the thinking, its markers and forced tokens excluded
        self._pending: list[int] = []  # marker tokens still to force, in order
        self._matched = 0  # how much of the end marker the latest tokens spell
        if spec.open:
            self._enter_thinking()

    @property
    def forced(self) -> Optional[int]:
        return self._pending[0] if self._pending else None

    @property
    def answering(self) -> bool:
        return self.phase == ANSWER

    def opens(self, token: int) -> bool:
        """Whether `token` at the start opens the thinking (the start marker's first token)."""
        return self.phase == START and token == self.spec.start_ids[0]

    def accept(self, token: int, answer_allowed: bool = False) -> bool:
        """Advance over a token; True when it belongs to the answer. At the start, a token the
        answer's grammar allows (`answer_allowed`) begins the answer even if it could open the thinking."""
        if self._pending:
            if token != self._pending[0]:  # the mask forbade it
                raise ValueError(f"token {token} was sampled where {self._pending[0]} was forced")
            self._pending.pop(0)
            if self.phase == START and not self._pending:
                self._enter_thinking()
            elif self.phase == THINK:
                self._track_end(token, forced=True)
            return False
        if self.phase == START:
            if token == self.spec.start_ids[0] and not answer_allowed:
                self._pending = list(self.spec.start_ids[1:])
                if not self._pending:
                    self._enter_thinking()
                return False
            self.phase = ANSWER
            return True
        if self.phase == THINK:
            self._track_end(token, forced=False)
            return False
        return True

    def _enter_thinking(self) -> None:
        self.phase, self._matched = THINK, 0
        self._check_budget()

    def _track_end(self, token: int, forced: bool) -> None:
        end = self.spec.end_ids
        self.num_thinking += not forced
        if token == end[self._matched]:
            self._matched += 1
        else:
            self._matched = 1 if token == end[0] else 0
        if self._matched == len(end):
            self.phase, self._pending = ANSWER, []
            return
        self._check_budget()

    def _check_budget(self) -> None:
        if not self._pending and 0 <= self.spec.budget <= self.num_thinking:
            self._pending = list(self.spec.end_ids[self._matched:])
