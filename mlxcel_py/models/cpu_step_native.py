"""NativeDecoder with its whole decode step in one numba call (quant/step.py): a plain llama
whose every product is over blocks the int8 vector kernel reads (AVX2). The step plan, the
weights' segments and the per-batch-size buffers are built once. Over the engine's own KV rows
(`step_rows`) a verify span runs through the same call, a row per verified position, so drafting keeps
the step and its greedy output stays plain decoding's; over BatchKVCache a span (`verify`) and any model
the plan cannot hold keep NativeDecoder's per-product path."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx
import numba
import numpy as np
from numba.typed import List

from .cpu_decode_attention import chunks_for
from .cpu_decode import CpuDecoder
from .cpu_decode_kernels import rms_norm
from .cpu_decode_native import NativeDecoder, Product, native_decoder_for
from .quant import int8_ir, products, step, vector
from .quant.blocks import QuantWeight
from .quant.dispatch import TypedCall, layout
from .quant.vector_ir import UNITS

log = logging.getLogger("mlxcel_py.models")

_INT8_LINEAR = products.linear  # the candidate the step inlines; a forced other one (tests) goes per product
# Output rows per product task: ~800 tasks a step; each costs ~0.7 us to claim and set up (1 thread,
# B=1: 16.4 ms a step at 32 rows, 15.1 at 128, 14.8 at 512), and smaller ones balance two threads better.
CHUNK = 64
HEAD_CHUNK = 256  # the LM head's 49,152-262,144 rows: fewer claims, its tail still short
# A prompt's rows run through the step in spans whose activations and attention partials fit WIDE_BYTES
# (a 2,048-token piece of the default model is one span; a long context's partials cut it smaller).
WIDE_BYTES = 96 << 20
WIDE_ROWS = 2048
HEAD_ROWS = 8  # rows whose LM head one call computes (a prompt's logprobs: every row's, 8 at a time)
_NO_PART = np.zeros((1, 1, 1, 1, 1), np.float32)  # the head's phases read no attention partials


def fused_step_applies(model) -> bool:
    """Whether FusedDecoder's step is the model's: a plain mlx-lm llama, on a CPU with AVX2."""
    from mlx_lm.models import llama

    from .cpu_decode_arch import spec_for, supported

    # the fused step is llama's layer only: no biases, q/k norms, windows or other rope (ArchSpec.plain)
    return type(model) is llama.Model and int8_ir.HAS_AVX2 and supported(model) is None and spec_for(model).plain


def decoder_for(model, path: Path, threads: int = 1) -> Optional[CpuDecoder]:
    """cpu_decode_native.native_decoder_for, with the fused step where it applies (the loader's choice)."""
    return native_decoder_for(model, path, threads, FusedDecoder if fused_step_applies(model) else NativeDecoder)


def _readonly(a: np.ndarray) -> np.ndarray:
    view = np.ascontiguousarray(a).view()
    view.flags.writeable = False  # one numba type for mapped (read-only) and loaded blocks
    return view


class _Plan:
    """The step's phases and product tasks (quant/step.py's run_step arguments), or `why` not."""

    def __init__(self, decoder: NativeDecoder):
        self.segs, self.raws, self.tasks, self.phases = [], List(), [], []
        self.why: Optional[str] = None
        for i, layer in enumerate(decoder._layers):
            self._add(step.NORM1, i, 1)
            self._product(step.QKV, i, layer.qkv)
            self._add(step.ROPE, i, 1)
            self._add(step.ATTEND, i, 0)  # its items' count is the step's (step_phases)
            self._add(step.QUANT_ATTN, i, 1)
            self._product(step.O, i, layer.o)
            self._add(step.NORM2, i, 1)
            self._product(step.GATE_UP, i, layer.gate_up)
            self._add(step.SILU, i, 1)
            self._product(step.DOWN, i, layer.down)
        self._add(step.FINAL, 0, 1)
        self._product(step.HEAD, 0, decoder._head_product)

    def _add(self, kind: int, layer: int, count: int, tasks: Sequence = ()) -> None:
        first = len(self.tasks)
        self.tasks += list(tasks) or [(0, 0, 0)] * count
        self.phases.append((kind, layer, first, count, first))

    def _product(self, kind: int, layer: int, product: Product) -> None:
        tasks, col = [], 0
        for part in product.parts:
            if not isinstance(part, QuantWeight) or int(part.qtype) not in vector.VECTOR_TYPES:
                self.why = self.why or f"a product over {getattr(part, 'qtype', 'float32')!r} weights"
                return self._add(kind, layer, 0)
            seg, rows = len(self.segs), part.shape[0]
            self.segs.append((int(part.qtype), part.shape[1] // UNITS[int(part.qtype)][0], col))
            self.raws.append(_readonly(part.blocks))
            chunk = HEAD_CHUNK if kind == step.HEAD else CHUNK
            tasks += [(seg, r, min(r + chunk, rows)) for r in range(0, rows, chunk)]
            col += rows
        self._add(kind, layer, len(tasks), tasks)

    def arrays(self) -> tuple:
        return (np.array(self.phases, np.int64), np.array(self.tasks, np.int64), np.array(self.segs, np.int64))


def step_phases(phases: np.ndarray, items: int) -> np.ndarray:
    """The plan's phases with `items` attention items in each ATTEND phase, the first tasks renumbered."""
    out = phases.copy()
    out[out[:, 0] == step.ATTEND, 3] = items
    out[:, 2] = np.concatenate([[0], np.cumsum(out[:-1, 3])])
    return out


class FusedDecoder(NativeDecoder):
    """NativeDecoder whose decode step (width 1) is quant/step.run_step: one numba call a token."""

    def __init__(self, model, blocks, threads: int = 1):
        super().__init__(model, blocks, threads)
        plan = _Plan(self)
        self.fused = plan.why is None
        if not self.fused:
            log.info("native CPU decode: per-product step (%s)", plan.why)
            return
        self._phases, tasks, segs = plan.arrays()
        layers = model.model.layers
        norms = [np.stack([np.asarray(getattr(l, n).weight, np.float32) for l in layers])
                 for n in ("input_layernorm", "post_attention_layernorm")]
        self._weights = (tasks, segs, plan.raws, norms[0], norms[1], np.asarray(self._norm, np.float32))
        self._widths = (self._layers[0].qkv, self._layers[0].gate_up, self._head_product)
        self._floats = (self.heads, self.kv_heads, self.head_dim, self.scale, self.eps)
        self._buffers: dict[int, tuple] = {}
        self._parts: dict[tuple, tuple] = {}
        self._kv_lists: tuple = ((), None)
        self._wide_held: Optional[tuple] = None  # run_rows' buffers for a prompt's spans (`_wide`)
        self._call = TypedCall(step.run_step)

    def _acts(self, rows: int) -> tuple:
        """(activation buffers, int8 input sets) for `rows` batch rows, made once per batch size."""
        if rows not in self._buffers:
            hidden, attn, qkv, gate_up, head = self._sizes()
            z = lambda n: np.zeros((rows, n), np.float32)  # noqa: E731
            acts = (z(qkv), z(attn), z(hidden), z(gate_up), z(hidden), z(head))
            sets = tuple((np.zeros((rows, k), np.int8), z(k // 32), np.zeros((rows, k // 16), np.int32), z(k // 16))
                         for k in (hidden, attn, gate_up // 2))
            self._buffers[rows] = (acts, sets)  # batch sizes are bounded by the slots
        return self._buffers[rows]

    def _attention(self, rows: int, stop: np.ndarray) -> tuple:
        """(the phases, the partials buffer) for `rows` rows whose last position is below max(stop)."""
        chunks = chunks_for(stop)
        key = (rows, chunks, id(self._phases))  # a profile (bench/bench_decode_step.py) swaps the plan
        if key not in self._parts:
            if len(self._parts) > 64:  # contexts grow a chunk at a time: keep the map bounded
                self._parts.clear()
            group = self.heads // self.kv_heads
            part = np.zeros((rows, self.kv_heads, chunks, group, self.head_dim + 2), np.float32)
            self._parts[key] = (step_phases(self._phases, rows * self.kv_heads * chunks), part)
        return self._parts[key]

    def _kv_lists_of(self, views: list) -> tuple:
        """Per-layer keys and values as numba typed lists, rebuilt only when a buffer changed."""
        ids, lists = self._kv_lists
        key = tuple(id(a) for kv in views for a in kv)
        if key != ids:
            lists = (List([k for k, _ in views]), List([v for _, v in views]))
            self._kv_lists = (key, lists)
        return lists

    def _run(self, kv: tuple, phases: np.ndarray, where: tuple, h: np.ndarray, acts: tuple, part: np.ndarray,
             sets: tuple) -> None:
        """step.run_step through its compiled entry point (dispatch.TypedCall), keyed by what its
        argument types can vary in: the per-call arrays' layouts and the KV lists' element type."""
        key = (layout(phases, *where, h), kv[0]._numba_type_, kv[1]._numba_type_)
        self._call(key, self.threads, phases, self._weights, kv, where, (h, *acts, part), sets, self._floats)

    def runs_rows(self) -> bool:
        """Whether `run_rows` runs (the fused step, with the int8 product it inlines)."""
        return self.fused and products.linear is _INT8_LINEAR

    def step_rows(self, tokens: Sequence[int], keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                  slot: np.ndarray, start: np.ndarray, pos: np.ndarray, width: int = 1,
                  prefix: Optional[np.ndarray] = None, logits_rows: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """cpu_decode_rows.forward_rows as run_step calls over the engine's own rows: the logits of `width`
        new tokens per row (`tokens` row-major; row b in KV row slot[b], positions start[b]..pos[b] + j),
        every row's, or only `logits_rows`' (`run_rows`). A verify span or a prefill piece is `width`
        rows of one sequence sharing its KV row: each call writes every row's K/V before any attends, so
        each attends causally. `prefix` (B, 2): each row's shared prefix row and length (None: none).
        None when the step is not fused."""
        offsets = np.arange(width, dtype=np.int64)
        rows = np.repeat(np.asarray(slot, np.int64), width)
        shared = np.zeros((len(slot), 2), np.int64) if prefix is None else np.asarray(prefix, np.int64)
        at = (np.asarray(pos, np.int64)[:, None] + offsets).reshape(-1)
        desc = np.column_stack([np.repeat(shared[:, 0], width), rows, np.repeat(shared[:, 1], width),
                                np.repeat(np.asarray(start, np.int64), width), at + 1])
        return self.run_rows(tokens, keys, values, rows, desc, at, logits_rows)

    def run_rows(self, tokens: Sequence[int], keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                 kv_row: np.ndarray, desc: np.ndarray, at: np.ndarray, logits_rows: Optional[np.ndarray] = None,
                 prompt_rows: Sequence[int] = ()) -> Optional[np.ndarray]:
        """Row i is token tokens[i] at position at[i], its K/V written into KV row kv_row[i], its attention
        as desc[i] (cpu_decode_attention's descriptor) says. Returns, as a new array, the logits of
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
        down = np.empty_like(h)
        for a, b in self._spans(at):  # the layers only, in spans the wide buffers hold
            acts, sets, part = self._wide(b - a, at[a:b] + 1)
            phases = step_phases(self._phases, part.shape[0] * part.shape[1] * part.shape[2])[:-2]
            self._run(kv, phases, (kv_row[a:b], desc[a:b], at[a:b], cos[a:b], sin[a:b]), h[a:b], acts, part, sets)
            down[a:b] = acts[4]
        self._wide_held = None  # freed (up to ~100 MiB): resident memory after a prompt stays the model's
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
        hidden, attn, qkv, gate_up, _ = self._sizes()
        return 4 * (qkv + attn + 2 * hidden + gate_up) + 2 * (hidden + attn + gate_up // 2)

    def _wide(self, rows: int, stop: np.ndarray) -> tuple:
        """Views of `rows` rows of the wide buffers (activations without the LM head's, int8 input
        sets, attention partials), grown to the largest span of a call and kept until its end."""
        group, dim = self.heads // self.kv_heads, self.head_dim
        shape = (rows, self.kv_heads, chunks_for(stop), group, dim + 2)
        held = self._wide_held
        if held is None or held[0] < rows or held[3].size < np.prod(shape):
            capacity = max(rows, held[0] if held else 0)
            hidden, attn, qkv, gate_up, _ = self._sizes()
            z = lambda n: np.zeros((capacity, n), np.float32)  # noqa: E731
            acts = (z(qkv), z(attn), z(hidden), z(gate_up), z(hidden), np.zeros((1, 1), np.float32))
            sets = tuple((np.zeros((capacity, k), np.int8), z(k // 32), np.zeros((capacity, k // 16), np.int32),
                          z(k // 16)) for k in (hidden, attn, gate_up // 2))
            size = max(int(np.prod(shape)), held[3].size if held else 0)
            held = self._wide_held = (capacity, acts, sets, np.zeros(size, np.float32))
        _, acts, sets, flat = held
        acts = tuple(a[:rows] for a in acts[:-1]) + (acts[-1],)
        sets = tuple(tuple(x[:rows] for x in s) for s in sets)
        return acts, sets, flat[: int(np.prod(shape))].reshape(shape)

    def __call__(self, tokens: Sequence[int], caches: list) -> mx.array:
        if not self.fused or products.linear is not _INT8_LINEAR:
            return super().__call__(tokens, caches)
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        rows = len(tokens)
        positions, left_pad, views = self._kv.begin(caches, rows)
        cos, sin = self._ropes[0].at(positions)  # a plain llama: one rope for every layer
        h = np.ascontiguousarray(self._embed_rows(np.asarray(tokens)), np.float32)
        acts, sets = self._acts(rows)
        # today's BatchKVCache: row b is KV row b, left-padded, every row at position _idx
        own, at = np.arange(rows, dtype=np.int64), np.full(rows, caches[0]._idx, np.int64)
        pad = np.asarray(left_pad, np.int64)
        desc = np.column_stack([own, own, pad, pad, at + 1])
        phases, part = self._attention(rows, at + 1)
        self._run(self._kv_lists_of(views), phases, (own, desc, at, cos, sin), h, acts, part, sets)
        self._kv.end(caches, positions)
        return mx.array(acts[-1])
