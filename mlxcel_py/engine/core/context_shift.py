"""llama-server's context shift (--context-shift), planned in plain Python.

When a decoding sequence's KV is about to fill its slot, the shift keeps its first `n_keep`
tokens, discards the `n_discard` after them (by default half of the rest), and moves the
later ones down, so it goes on generating instead of finishing with "length". The rule is
llama-server's (tools/server/server-context.cpp): it fires when the KV holds n_ctx - 1
tokens; n_keep is capped at n_ctx - 4 and n_discard at the tokens left after n_keep minus one.
"""

from __future__ import annotations

from typing import Optional

from .sequence import Sequence
from .step import Shift


def shift_plan(seq: Sequence, slot_context: int) -> Optional[tuple[int, int]]:
    """(n_keep, n_discard) for a decode row whose next token would not fit its slot; else None."""
    n_past = seq.kv_len
    if n_past + 1 < slot_context:
        return None
    request = seq.request
    keep = seq.prompt_len if request.n_keep < 0 else request.n_keep
    keep = max(0, min(keep, slot_context - 4))
    n_left = n_past - keep
    discard = request.n_discard or n_left // 2
    return keep, max(0, min(discard, n_left - 1))


def apply_shift(seq: Sequence, keep: int, discard: int) -> Shift:
    """Book one shift on the sequence; the record the runner executes (with the KV's tokens after it)."""
    seq.shifts.append((keep, discard))
    seq.discarded += discard
    return Shift(seq.seq_id, keep, discard, seq.kv_tokens()[:-1])


def draft_room(seq: Sequence, slot_context: int) -> int:
    """Draft tokens that fit after the row's next token without filling its slot."""
    return max(0, slot_context - 2 - seq.kv_len)
