"""Drafting for speculative decoding, in plain Python: the scheduler proposes per decode row
either prompt-lookup tokens (llama.cpp's `lookup` idea) or a length for the runner's draft
model (`--draft-model`) to fill, and the runner verifies them in the decode step.

A draft is the continuation of the most recent earlier occurrence of the sequence's last
`ngram` tokens (prompt + output so far). Per sequence, the draft length follows the
acceptance (doubled after a draft accepted whole, cut to what was accepted plus one after a
rejection; a lookup draft is preferred, the draft model fills rows lookup finds nothing for), and an acceptance EMA pauses drafting where drafts keep being rejected, with a
pause that doubles each time, so a stream that never repeats its context pays for a few
rejected verifies and then almost none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

EMA_WEIGHT = 0.5  # weight of the newest verify in the acceptance EMA
ACCEPT_FLOOR = 0.3  # below this EMA the drafts do not pay for their verify forward
BASE_PAUSE = 8  # decode steps without drafting after the first pause; doubles per pause
MAX_PAUSE = 512
FIRST_LIMIT = 4  # a verify's cost grows with its width (docs/SPECULATIVE.md): start short, double on success


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """--lookup-ngram N (0: off), --draft-max, --draft-min (llama-server's names and defaults);
    `model`: a draft model is loaded (--draft-model), so rows may ask it for a draft."""

    ngram: int = 0
    draft_max: int = 16
    draft_min: int = 0
    model: bool = False

    @property
    def enabled(self) -> bool:
        return (self.ngram > 0 or self.model) and self.draft_max > 0


def lookup(tokens: Sequence[int], ngram: int, max_len: int) -> tuple[int, ...]:
    """What followed the most recent earlier occurrence of the last `ngram` tokens, up to `max_len`."""
    n = len(tokens)
    if ngram <= 0 or max_len <= 0 or n <= ngram:
        return ()
    key = list(tokens[n - ngram:])
    first = key[0]
    for start in range(n - ngram - 1, -1, -1):  # newest first; bounded by the context
        if tokens[start] == first and list(tokens[start:start + ngram]) == key:
            follow = start + ngram
            return tuple(tokens[follow:min(follow + max_len, n)])
    return ()


@dataclass(slots=True)
class DraftState:
    """One sequence's drafting: its counters, acceptance EMA and pause (mutable, scheduler-owned)."""

    num_drafted: int = 0
    num_accepted: int = 0
    ema: float = 1.0
    paused_for: int = 0  # decode steps left without drafting
    next_pause: int = BASE_PAUSE
    limit: int = FIRST_LIMIT  # the draft length this sequence may propose now (at most --draft-max)
    alpha: float = 1.0  # EMA of the per-token acceptance (accepted / (accepted + a rejection))

    def propose(self, config: DraftConfig, tokens: Sequence[int], room: int) -> tuple[int, ...]:
        """The lookup draft for this step (empty: plain decode); `room`: tokens the sequence may still emit."""
        return self.plan(config, tokens, room)[0]

    def plan(self, config: DraftConfig, tokens: Sequence[int], room: int,
             cap: Optional[int] = None) -> tuple[tuple[int, ...], int]:
        """(lookup draft, draft-model length) for this step; at most one is non-empty. `cap`: the
        gate's cost-aware length for this batch size (None: not measured yet)."""
        if self.paused_for > 0:
            self.paused_for -= 1
            return (), 0
        limit, floor = min(config.draft_max, self.limit, room - 1), max(config.draft_min, 1)
        limit = limit if cap is None else min(limit, cap)
        draft = lookup(tokens, config.ngram, limit) if config.ngram > 0 else ()
        if len(draft) >= floor:
            return draft, 0
        return (), limit if config.model and limit >= floor else 0

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """Fold one verify into the EMA; pause drafting when it falls below the floor."""
        if num_drafted == 0:
            return
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.ema = (1 - EMA_WEIGHT) * self.ema + EMA_WEIGHT * (num_accepted / num_drafted)
        per_token = num_accepted / (num_accepted + (num_accepted < num_drafted))
        self.alpha = (1 - EMA_WEIGHT) * self.alpha + EMA_WEIGHT * per_token
        self.limit = 2 * self.limit if num_accepted == num_drafted else num_accepted + 1
        if self.ema < ACCEPT_FLOOR:
            self.paused_for, self.ema = self.next_pause, 1.0
            self.next_pause = min(2 * self.next_pause, MAX_PAUSE)
        elif num_accepted == num_drafted:
            self.next_pause = BASE_PAUSE  # a fully accepted draft: the stream repeats again


def draft_for(config: Optional[DraftConfig], state: DraftState, history: Sequence[int], room: int,
              eligible: bool, cap: Optional[int] = None) -> tuple[tuple[int, ...], int]:
    """One decode row's (lookup draft, draft-model length); ((), 0) when drafting is off or not allowed."""
    if config is None or not config.enabled or not eligible:
        return (), 0
    return state.plan(config, history, room, cap)


def cap_plans(config: Optional[DraftConfig], plans: list[tuple[tuple[int, ...], int]]) -> list[tuple[tuple[int, ...], int]]:
    """Every row of a verify is padded to the widest draft, so a step's padded draft positions
    (rows x width) are held to --draft-max, one lone row's largest verify: each row's draft is cut
    to draft_max // rows (docs/SPECULATIVE.md)."""
    if config is None or len(plans) < 2:
        return plans
    cap, floor = max(1, config.draft_max // len(plans)), max(config.draft_min, 1)
    out = []
    for draft, n in plans:
        draft, n = draft[:cap], min(n, cap)
        out.append((draft if len(draft) >= floor else (), n if n >= floor else 0))
    return out


RATE_WEIGHT = 0.3  # weight of the newest step in a batch size's tokens-per-second EMAs
GATE_SAMPLES = 3  # steps of each kind, at one batch size, before the gate judges
GATE_PROBE = 64  # decode steps between re-judgements at a size (plain steps sampled, drafting retried)
GATE_MAX_OFF = 1024
ALPHA_CEIL = 0.95  # a run of full accepts says little about the next token: scored as at most this
LONGEST = 64  # the longest draft the cost-aware length considers (--draft-max bounds it too)


@dataclass(slots=True)
class _SizeRates:
    plain: float = 0.0  # EMA of tokens/s of steps without drafts
    spec: float = 0.0  # ... of verify steps
    n_plain: int = 0
    n_spec: int = 0
    off_until: int = -1  # decode step number until which this size does not draft
    plain_until: int = -1  # ... until which it decodes plainly to sample the plain rate
    off_for: int = GATE_PROBE
    plain_s: float = 0.0  # EMA of a plain step's seconds
    costs: dict = field(default_factory=dict)  # padded draft width -> EMA of a verify step's seconds
    seen: set = field(default_factory=set)  # widths verified once (their first sample is not trusted)


class DraftGate:
    """Per decode-batch size, whether verify steps emit more tokens per second than plain steps,
    measured on this machine (a verify's cost per extra position differs by device and batch):
    where they do not, that size stops drafting for a while, doubling while it keeps losing.
    Plain steps are sampled for a few steps every GATE_PROBE when every row would draft."""

    def __init__(self) -> None:
        self._sizes: dict[int, _SizeRates] = {}

    def allows(self, rows: int, step: int) -> bool:
        """Whether a decode step of `rows` rows, the `step`-th, may carry drafts."""
        r = self._sizes.setdefault(rows, _SizeRates())
        if step < r.off_until or step < r.plain_until:
            return False
        if r.n_spec >= GATE_SAMPLES and r.n_plain < GATE_SAMPLES:  # no plain rate yet: sample one
            r.plain_until = step + GATE_SAMPLES
            return False
        return True

    def observe(self, rows: int, step: int, tokens: int, seconds: float, drafted: bool, width: int = 0) -> None:
        """Fold one decode step (tokens it emitted, its time; `width`: a verify's padded draft
        length) into its size's rates and costs; judge the size."""
        if seconds <= 0:
            return
        r = self._sizes.setdefault(rows, _SizeRates())
        rate = tokens / seconds
        if drafted and width > 0 and width not in r.seen:
            r.seen.add(width)  # a width's first verify may load or compile its kernel (numba's cache, MLX)
        elif drafted and width > 0:
            old = r.costs.get(width)
            r.costs[width] = seconds if old is None else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * seconds
        elif not drafted:
            r.plain_s = seconds if r.n_plain == 0 else (1 - RATE_WEIGHT) * r.plain_s + RATE_WEIGHT * seconds
        if drafted:
            r.spec = rate if r.n_spec == 0 else (1 - RATE_WEIGHT) * r.spec + RATE_WEIGHT * rate
            r.n_spec += 1
        else:
            r.plain = rate if r.n_plain == 0 else (1 - RATE_WEIGHT) * r.plain + RATE_WEIGHT * rate
            r.n_plain += 1
        if not drafted or r.n_spec < GATE_SAMPLES or r.n_plain < GATE_SAMPLES:
            return
        if r.spec < r.plain:
            r.off_until, r.n_spec = step + r.off_for, 0  # retried afresh after the pause
            r.off_for = min(2 * r.off_for, GATE_MAX_OFF)
        else:
            r.off_for = GATE_PROBE
            if r.n_spec % GATE_PROBE == 0:
                r.n_plain = 0  # re-sample the plain rate now and then: contexts grow, load moves

    def length_cap(self, rows: int, alpha: float) -> Optional[int]:
        """The draft length with the most expected tokens per second at this batch size: expected
        tokens (1 - a^(k+1)) / (1 - a) for per-token acceptance a = min(alpha, ALPHA_CEIL), over the
        measured cost of a verify of that padded width relative to a plain step (interpolated
        between measured widths, beyond the widest at its average slope). None while no step was
        timed at this size; FIRST_LIMIT while verify and plain steps are not both measured."""
        r = self._sizes.get(rows)
        if r is None or not r.seen:
            return None
        if r.plain_s <= 0 or not r.costs:
            return FIRST_LIMIT
        known = sorted((w, c / r.plain_s) for w, c in r.costs.items())
        a = min(alpha, ALPHA_CEIL)
        best, score = 1, 0.0
        for k in range(1, LONGEST + 1):
            s = (1 - a ** (k + 1)) / (1 - a) / max(1.0, _ratio(known, k))
            if s > score:
                best, score = k, s
        return best

    def describe(self) -> str:
        """Per size: 'rows: plain/spec tok/s' for the log and tests."""
        return ", ".join(f"{n}: {r.plain:.1f}/{r.spec:.1f}" for n, r in sorted(self._sizes.items()))


def _ratio(known: list[tuple[int, float]], k: int) -> float:
    """A verify's cost at padded width k over a plain step's, from the measured (width, ratio) pairs."""
    lo = (0, 1.0)  # width 0 is a plain step
    for w, c in known:
        if w >= k:
            return lo[1] + (c - lo[1]) * (k - lo[0]) / (w - lo[0])
        lo = (w, c)
    return 1.0 + (lo[1] - 1.0) * k / lo[0]
