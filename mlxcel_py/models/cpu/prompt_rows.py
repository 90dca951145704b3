"""The fused decode step's rows API for prompts (fused_step.FusedDecoder's `run_rows`): a prompt
piece, a fused tick's piece and a context shift's rebuild run as rows of the same compiled step as
a decode step, so a position's bits do not depend on its route (docs/CPU_FAST_PATH.md, "One kernel
family: exact across routes"). Only the layers run over a prompt's rows, in spans whose buffers fit
WIDE_BYTES; the LM head only for the rows whose logits are wanted: a decode row's as the step
computes it, a prompt's last position through float32 activations (`_prompt_logits`).

A mixin of FusedDecoder (its plan, buffers and `_run`)."""

from __future__ import annotations

from typing import Optional, Sequence

import numba
import numpy as np

from .decode_attention import chunks_for
from .decode_kernels import rms_norm
from .quant import products
from .quant.blocks import QuantWeight
from .quant.step import ATTEND, ROW_WISE, row_tasks

# A prompt's rows run through the step in spans whose activations and attention partials fit WIDE_BYTES
# (a 2,048-token piece of the default model is one span; a long context's partials cut it smaller).
WIDE_BYTES = 96 << 20
WIDE_ROWS = 2048
HEAD_ROWS = 8  # rows whose LM head one call computes (a prompt's logprobs: every row's, 8 at a time)
_NO_PART = np.zeros((1, 1, 1, 1, 1), np.float32)  # the head's phases read no attention partials


def step_phases(phases: np.ndarray, items: int, rows: int) -> np.ndarray:
    """The plan's phases for `rows` batch rows: `items` attention items in each ATTEND phase, the
    row-wise phases in `row_tasks(rows)` tasks, the first tasks renumbered."""
    out = phases.copy()
    out[out[:, 0] == ATTEND, 3] = items
    out[np.isin(out[:, 0], ROW_WISE), 3] = row_tasks(rows)
    out[:, 2] = np.concatenate([[0], np.cumsum(out[:-1, 3])])
    return out


class PromptRows:
    """`run_rows` and its helpers (FusedDecoder's prompt rows)."""

    def run_rows(self, tokens: Sequence[int], keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                 kv_row: np.ndarray, desc: np.ndarray, at: np.ndarray, logits_rows: Optional[np.ndarray] = None,
                 prompt_rows: Sequence[int] = ()) -> Optional[np.ndarray]:
        """Row i is token tokens[i] at position at[i], its K/V written into KV row kv_row[i], its attention
        as desc[i] (decode_attention's descriptor) says. Returns, as a new array, the logits of
        `logits_rows` as a decode step computes them (None: every row's, and nothing else), then those
        of `prompt_rows` as a prompt's (float activations into the LM head: `_prompt_logits`); None
        when the step is not fused.

        Every row is computed whole by the same compiled step, whatever rides with it, so a position's
        bits do not depend on its route: a prompt's rows (in pieces of any size, after any cached prefix)
        equal a decode step's, a verify's and a fused tick's (docs/CPU_FAST_PATH.md, "One kernel family")."""
        if not self.runs_rows():
            return None
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        kv = self._kv_lists_of(list(zip(keys, values)))
        at, kv_row = np.asarray(at, np.int64), np.asarray(kv_row, np.int64)
        cos, sin = self._ropes[0].at(at)  # a plain llama: one rope for every layer
        h = np.ascontiguousarray(self._embed_rows(np.asarray(tokens)), np.float32)
        if logits_rows is None:  # a decode step or a verify: the whole plan, every row's logits
            acts, sets = self._acts(len(tokens))
            phases, part = self._attention(len(tokens), at + 1)
            self._run(kv, phases, (kv_row, desc, at, cos, sin), h, acts, part, sets)
            return acts[-1].copy()  # the buffer is reused by the next step of this batch size
        down, spans = np.empty_like(h), self._spans(at)
        # one set of buffers a call, the largest span's, freed after it (resident memory stays the model's)
        wide_acts, wide_sets = self._new_acts(max(b - a for a, b in spans), head=False)
        group = self.heads // self.kv_heads
        for a, b in spans:  # the layers only
            acts = tuple(x[:b - a] for x in wide_acts)
            sets = tuple(tuple(x[:b - a] for x in s) for s in wide_sets)
            part = np.zeros((b - a, self.kv_heads, chunks_for(at[a:b] + 1), group, self.head_dim + 2), np.float32)
            phases = step_phases(self._phases, part.shape[0] * part.shape[1] * part.shape[2], b - a)[:-2]
            self._run(kv, phases, (kv_row[a:b], desc[a:b], at[a:b], cos[a:b], sin[a:b]), h[a:b], acts, part, sets)
            down[a:b] = acts[4]
        decoded = self._logits_of(kv, np.asarray(logits_rows, np.int64), h, down, (kv_row, desc, at, cos, sin))
        if not len(prompt_rows):
            return decoded
        return np.concatenate([decoded, self._prompt_logits(h, down, np.asarray(prompt_rows, np.int64))])

    def _prompt_logits(self, h: np.ndarray, down: np.ndarray, pick: np.ndarray) -> np.ndarray:
        """A prompt row's logits: the final norm, then the LM head with float32 activations, as the
        prefill has always computed them (the int8 head's rounding, up to ~0.8 on a logit, flipped the
        default model's first token: "L'Étoile" for "The capital"). The last row, whose logits are
        sampled, is multiplied alone, so its bits never depend on the rows beside it."""
        x = rms_norm(h[pick] + down[pick], self._norm, self.eps)
        out = np.empty((len(pick), self._sizes()[4]), np.float32)
        if len(pick) > 1:
            out[:-1] = self._float_head(np.ascontiguousarray(x[:-1]))
        out[-1:] = self._float_head(np.ascontiguousarray(x[-1:]))
        return out

    def _float_head(self, x: np.ndarray) -> np.ndarray:
        parts = [products.linear_float_activations(x, w, threads=self.threads) if isinstance(w, QuantWeight)
                 else x @ np.asarray(w, np.float32).T for w in self._head_product.parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _logits_of(self, kv: tuple, pick: np.ndarray, h: np.ndarray, down: np.ndarray, where: tuple) -> np.ndarray:
        """The final norm and LM head of rows `pick` (the plan's last two phases, as a decode step runs
        them), given each row's hidden state before the last layer's down product is added."""
        out = np.empty((len(pick), self._sizes()[4]), np.float32)
        tail = self._phases[-2:].copy()
        tail[:, 2] = np.concatenate([[0], np.cumsum(tail[:-1, 3])])
        for a in range(0, len(pick), HEAD_ROWS):  # a few rows at a time: _acts keeps a buffer per count
            rows = pick[a:a + HEAD_ROWS]
            acts, sets = self._acts(len(rows))
            acts[4][:] = down[rows]
            self._run(kv, tail, tuple(np.ascontiguousarray(x[rows]) for x in where), np.ascontiguousarray(h[rows]),
                      acts, _NO_PART, sets)
            out[a:a + len(rows)] = acts[-1]
        return out

    def _spans(self, at: np.ndarray) -> list[tuple[int, int]]:
        """Consecutive row spans whose activations and attention partials fit WIDE_BYTES each."""
        group, dim = self.heads // self.kv_heads, self.head_dim
        per_row = self.kv_heads * chunks_for(at + 1) * group * (dim + 2) * 4 + self._wide_row_bytes()
        step = max(16, min(WIDE_ROWS, WIDE_BYTES // per_row))
        return [(a, min(a + step, len(at))) for a in range(0, len(at), step)]

    def _sizes(self) -> tuple[int, int, int, int, int]:
        """The widths of the step's activations: hidden, attention, q/k/v, gate/up, LM head."""
        qkv, gate_up, head = (sum(p.shape[0] for p in prod.parts) for prod in self._widths)
        return self._norm.shape[0], self.heads * self.head_dim, qkv, gate_up, head

    def _wide_row_bytes(self) -> int:
        """Bytes a prompt row takes in the layers' buffers (`_new_acts` without the head's)."""
        acts, sets = self._new_acts(1, head=False)
        return sum(x.nbytes for x in acts) + sum(x.nbytes for s in sets for x in s)
