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

from ..gguf_blocks import mapped, release
from .arch import llama_like, qkv_bias
from .decode_attention import chunks_for
from .decoder import CpuDecoder
from .prompt_rows import PromptRows, step_phases
from .native import NativeDecoder, Product, native_decoder_for
from .quant import int8_ir, products, kquant_r8, step, vector
from .quant.blocks import QuantWeight
from .quant.r8_layers import R8Weight
from .quant.kblock import KBLOCK_TYPES
from .quant.dispatch import TypedCall, layout
from .quant.vector_ir import UNITS

log = logging.getLogger("mlxcel_py.models")

_INT8_LINEAR = products.linear  # the candidate the step inlines; a forced other one (tests) goes per product
# A product task's size: about TASK_BYTES of weight rows, and at least MIN_TASKS tasks a product so
# that two threads end a phase together. A task costs ~0.7 us to claim and set up, and each starts a
# new stream the prefetchers ramp up on: the 1B Q4_K_M step on 2 threads (Zen 4) was 29 ms with tasks
# of 64 rows (74 KB of gate/up rows), 25.4 with 256, 24.9 with 1,024.
TASK_BYTES = 512 * 1024
MIN_TASKS = 16


def task_rows(rows: int, row_bytes: int) -> int:
    """Output rows per task of a product of `rows` rows of `row_bytes` bytes each."""
    return max(16, min(TASK_BYTES // max(row_bytes, 1), -(-rows // MIN_TASKS)))


def fused_step_applies(model) -> bool:
    """Whether FusedDecoder's step is the model's: an mlx-lm llama or qwen2 (arch.llama_like), on a CPU with AVX2."""
    return int8_ir.HAS_AVX2 and llama_like(model)


def _repacked(part: QuantWeight) -> Optional[np.ndarray]:
    """part's rows repacked eight at a time, its file pages then dropped from memory (they come back if
    another path reads them), or None: not a kquant_r8.REPACKED type, not whole groups of 8, not this
    CPU's, or not a view of the mapped file (a copy would stay resident beside the repacked rows)."""
    if int(part.qtype) not in kquant_r8.REPACKED or not kquant_r8.AVAILABLE or part.shape[0] % kquant_r8.ROWS \
            or not mapped(part.blocks):
        return None
    rows = kquant_r8.repack(part.blocks, int(part.qtype))
    release(part.blocks)
    return rows


def decoder_for(model, path: Path, threads: int = 1) -> Optional[CpuDecoder]:
    """native.native_decoder_for, with the fused step where it applies (the loader's choice)."""
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
        self.kblock_kinds: set[int] = set()  # the product kinds with a K-quant segment (quant/kblock.py)
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
            r8 = isinstance(part, R8Weight)  # repacked at load (gguf_blocks.repack_block_layers: llama's Q/K)
            if not r8 and (not isinstance(part, QuantWeight) or int(part.qtype) not in vector.VECTOR_TYPES):
                self.why = self.why or f"a product over {getattr(part, 'qtype', 'float32')!r} weights"
                return self._add(kind, layer, 0)
            seg, rows = len(self.segs), part.shape[0]
            if int(part.qtype) in KBLOCK_TYPES:
                self.kblock_kinds.add(kind)
            # not the LM head: a prompt's last position reads it in the file's layout (PromptRows._prompt_logits),
            # which would bring its pages back beside the repacked rows
            repacked = part.raw if r8 else _repacked(part) if kind != step.HEAD else None
            qtype = int(part.qtype) if repacked is None else kquant_r8.REPACKED[int(part.qtype)]
            self.segs.append((qtype, part.shape[1] // UNITS[int(part.qtype)][0], col))
            self.raws.append(_readonly(part.blocks if repacked is None else repacked))
            chunk = task_rows(rows, repacked.shape[1] // kquant_r8.ROWS if r8 else part.blocks.shape[1])
            if repacked is not None:  # whole groups of eight rows a task
                chunk = -(-chunk // kquant_r8.ROWS) * kquant_r8.ROWS
            tasks += [(seg, r, min(r + chunk, rows)) for r in range(0, rows, chunk)]
            col += rows
        self._add(kind, layer, len(tasks), tasks)

    def arrays(self) -> tuple:
        return (np.array(self.phases, np.int64), np.array(self.tasks, np.int64), np.array(self.segs, np.int64))


class FusedDecoder(PromptRows, NativeDecoder):
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
        biases = np.stack([qkv_bias(l) for l in self._layers]).astype(np.float32)  # (layers, 0): none
        self._weights = (tasks, segs, plan.raws, norms[0], norms[1], np.asarray(self._norm, np.float32), biases)
        # which input sets (hidden, attention, FFN) a K-quant product reads: only those are quantized per 256
        self._kblock_inputs = tuple(bool(plan.kblock_kinds & set(kinds)) for kinds in
                                    ((step.QKV, step.GATE_UP, step.HEAD), (step.O,), (step.DOWN,)))
        self._widths = (self._layers[0].qkv, self._layers[0].gate_up, self._head_product)
        self._floats = (self.heads, self.kv_heads, self.head_dim, self.scale, self.eps)
        self._buffers: dict[int, tuple] = {}
        self._parts: dict[tuple, tuple] = {}
        self._kv_lists: tuple = ((), None)
        self._call = TypedCall(step.run_step)

    def _acts(self, rows: int) -> tuple:
        """(activation buffers, int8 input sets) for `rows` batch rows, made once per batch size."""
        if rows not in self._buffers:
            self._buffers[rows] = self._new_acts(rows, head=True)  # batch sizes are bounded by the slots
        return self._buffers[rows]

    def _new_acts(self, rows: int, head: bool) -> tuple:
        """Fresh (activations, int8 input sets) for `rows` rows; without the LM head's (`head` false:
        a prompt's layers) its buffer is empty."""
        hidden, attn, qkv, gate_up, vocab = self._sizes()
        z = lambda n: np.zeros((rows, n), np.float32)  # noqa: E731
        acts = (z(qkv), z(attn), z(hidden), z(gate_up), z(hidden), z(vocab if head else 0))
        return acts, step.input_sets(rows, (hidden, attn, gate_up // 2), self._kblock_inputs)

    def _attention(self, rows: int, stop: np.ndarray) -> tuple:
        """(the phases, the partials buffer) for `rows` rows whose last position is below max(stop)."""
        chunks = chunks_for(stop)
        key = (rows, chunks, id(self._phases))  # a profile (python -m bench decode-step --profile) swaps the plan
        if key not in self._parts:
            if len(self._parts) > 64:  # contexts grow a chunk at a time: keep the map bounded
                self._parts.clear()
            group = self.heads // self.kv_heads
            part = np.zeros((rows, self.kv_heads, chunks, group, self.head_dim + 2), np.float32)
            self._parts[key] = (step_phases(self._phases, rows * self.kv_heads * chunks, rows), part)
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
                  prefix: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """rows.forward_rows as one run_step call over the engine's own rows: (B * width, vocab)
        logits of `width` new tokens per row (`tokens` row-major; row b in KV row slot[b], positions
        start[b]..pos[b] + j). A verify span is `width` rows of one sequence sharing its KV row: the step
        writes every row's K/V before any attends, so each attends causally. `prefix` (B, 2): each row's
        shared prefix row and length (None: none). None when the step is not fused (`run_rows`)."""
        offsets = np.arange(width, dtype=np.int64)
        rows = np.repeat(np.asarray(slot, np.int64), width)
        shared = np.zeros((len(slot), 2), np.int64) if prefix is None else np.asarray(prefix, np.int64)
        at = (np.asarray(pos, np.int64)[:, None] + offsets).reshape(-1)
        desc = np.column_stack([np.repeat(shared[:, 0], width), rows, np.repeat(shared[:, 1], width),
                                np.repeat(np.asarray(start, np.int64), width), at + 1])
        return self.run_rows(tokens, keys, values, rows, desc, at)

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
