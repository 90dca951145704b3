"""The engine's tick, its KV rows and the context shift, in process on the default model's shapes, one
mode a subcommand:

    tick-costs     calibrate the tick cost model on the real runner; predict what --itl-budget-ms does
    tick-fused     a tick's cost by piece size and context with 4 rows decoding, fused against separate
    tick-split     where a fused tick's time goes, by part (products, attention, KV store, the rest)
    tick-spikes    the two O(context) spikes of a long admission's fused ticks, apart from a model
    kv-join        the cost of a join without the model: mlx-lm's BatchKVCache against the engine's rows
    context-shift  --context-shift's two ways to rebuild a shifted row: time and logits against a fresh prefill

MLX reads its BLAS once, when it loads: the BLAS named by $MLXCEL_BLAS (default auto) is preloaded below,
before anything imports MLX.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

from mlxcel_py.models.cpu.blas import preload_blas

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from bench.peers import machine_lines  # noqa: E402
from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy  # noqa: E402
from mlxcel_py.engine.chunking.calibration import calibrate, default_grid  # noqa: E402
from mlxcel_py.engine.chunking.cost_model import CostModel, TickShape  # noqa: E402
from mlxcel_py.engine.chunking.policy import TickState  # noqa: E402
from mlxcel_py.engine.chunking.probe import ROW_PROMPT, TickProbe  # noqa: E402
from mlxcel_py.engine.core.request import SamplingParams  # noqa: E402
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Shift, Step  # noqa: E402
from mlxcel_py.engine.runner import prompt_side  # noqa: E402
from mlxcel_py.engine.runner import tick as runner_tick  # noqa: E402
from mlxcel_py.engine.runner.kv_rows import RowKV  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402
from mlxcel_py.models.cpu import tick as cpu_tick  # noqa: E402
from mlxcel_py.models.cpu.decoder import _KvWriter  # noqa: E402


# ---- tick-costs ----------------------------------------------------------------------------------

TICK_COSTS_DOC = """Calibrate the tick cost model on the real runner, check its predictions, and
predict what `--itl-budget-ms` will do in the acceptance scenario.

Usage: python -m bench tick-costs [--budget-ms 300] [--rows 4] [--max-seconds 30]

`engine.probe.TickProbe.measure(tokens, context, rows)` is the engine's calibration callable:
one tick of the real ModelRunner (a decode step over `rows` scratch sequences, then a
`tokens`-token piece of a scratch prompt whose KV holds `context` tokens), timed end to end.
"""


def row_context(probe: TickProbe) -> int:
    return len(probe.rows) * ROW_PROMPT


def predicted_ttft(model: CostModel, chunk_of, prompt: int, rows: int, row_ctx: int) -> tuple[float, int]:
    """Seconds and ticks to prefill `prompt` tokens next to `rows` decoding rows, by the model."""
    cursor, seconds, ticks = 0, 0.0, 0
    while cursor < prompt:
        n = min(chunk_of(TickState(rows, row_ctx + rows * ticks, cursor, prompt - cursor)), prompt - cursor)
        seconds += model.predict(TickShape(n, cursor, rows, row_ctx + rows * ticks))
        cursor, ticks = cursor + n, ticks + 1
    return seconds, ticks


def check_chunks(probe: TickProbe, policy: BudgetChunkPolicy, rows: int, repeats: int) -> None:
    print(f"\nchunks for a {policy.budget_ms:g} ms budget with {rows} rows decoding; measured ticks (median of {repeats})")
    print(f"{'context':>8} {'chunk':>6} {'predicted ms':>13} {'measured ms':>12}")
    for context in (0, 2048, 6144):
        state = TickState(rows, row_context(probe), context, 8192 - context)
        chunk = policy.chunk_for(state)
        predicted = policy.model.predict(TickShape(chunk, context, rows, row_context(probe)))
        times = [probe.measure(chunk, context, rows) for _ in range(repeats)]
        print(f"{context:>8} {chunk:>6} {predicted * 1000:>13.1f} {statistics.median(times) * 1000:>12.1f}",
              flush=True)


def tick_costs_main() -> None:
    ap = argparse.ArgumentParser(description=TICK_COSTS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-ms", type=float, default=300.0)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=30.0, help="calibration time limit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-check", action="store_true", help="calibrate and predict only")
    args = ap.parse_args()
    lm = load_model(None)
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}")
    probe = TickProbe(ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels), max_context=8192, vocab=lm.model.args.vocab_size)
    start = time.perf_counter()
    cal = calibrate(probe.measure, default_grid(2048, args.rows), max_seconds=args.max_seconds,
                    row_context=ROW_PROMPT, say=print)
    print(f"calibration wall time {time.perf_counter() - start:.1f} s (measured {cal.seconds:.1f} s)")
    model = cal.model()
    print("fit:", model.stats().describe())
    policy = BudgetChunkPolicy(args.budget_ms, model, start_margin=0.0)
    for prompt in (2048, 6144):
        ours, n_ours = predicted_ttft(model, policy.chunk_for, prompt, args.rows, row_context(probe))
        fixed, n_fixed = predicted_ttft(model, lambda _s: 512, prompt, args.rows, row_context(probe))
        print(f"predicted TTFT of a {prompt}-token prompt next to {args.rows} rows: budget {ours:.1f} s "
              f"({n_ours} ticks), chunk 512 {fixed:.1f} s ({n_fixed} ticks), ratio {ours / fixed:.2f}")
    if not args.skip_check:
        check_chunks(probe, policy, args.rows, args.repeats)


# ---- tick-fused ----------------------------------------------------------------------------------

TICK_FUSED_DOC = """A tick's cost by piece size and context with 4 rows decoding, fused against separate.

Usage: python -m bench tick-fused [--repeats 3] [--rows 4] [--contexts 0,2048,6000]
       [--sizes 16,32,64,128,256]

Runs the real ModelRunner on the default model through `Step` records. Each piece is the next
one of a sequence whose KV already holds `context` positions of random keys and values (the
attention's cost does not depend on the values, so no long prefill is needed to build it). Per
shape, best of `--repeats` of process CPU time (less inflated by other processes on a shared
machine) and wall time, the arms interleaved so that load weighs on them alike:
- `fused`: one forward for the rows and the piece (pieces up to 128), the piece's attention on
  one numpy BLAS thread (models/cpu/tick.PIECE_BLAS_THREADS, the default);
- `fused 2t`: the same with numpy's own BLAS threads for the attention;
- `separate`: the decode step, then the piece's own forward (the prefill's BLAS tiles), a piece of
  up to 128 tokens with its attention on one numpy BLAS thread (prompt_side.SMALL_PIECE);
- `separate 2t`: the same with numpy's own BLAS threads.
The decode step alone is the first line.
"""


class Ticks:
    """Scratch sequences on one runner: decode rows, and pieces after a fabricated context."""

    def __init__(self, runner, rows: int):
        self.runner, self.next_id = runner, 100
        self.before_timed = lambda: None  # called right before each timed tick (tick-split clears its sums)
        self.rows = tuple(range(1, rows + 1))
        for sid in self.rows:
            self.runner.execute(Step(prefill=self.piece(sid, 0, 32, True)))
        for _ in range(2):
            self.runner.execute(Step(decode=self.rows))

    def piece(self, sid: int, start: int, n: int, terminal: bool = False) -> PrefillPiece:
        begin = BeginSequence(SamplingParams(temperature=0.0), ()) if start == 0 else None
        return PrefillPiece(sid, start, tuple(range(200 + start % 97, 200 + start % 97 + n)), n, terminal, None, begin)

    def at_context(self, context: int) -> int:
        """A new sequence whose KV holds `context` positions (random K/V written into its row cache)."""
        self.next_id += 1
        sid = self.next_id
        self.runner.execute(Step(prefill=self.piece(sid, 0, 16)))
        if context:
            for cache in self.runner._seqs[sid].prefill_cache:
                _, heads, _, dim = cache.keys.shape
                capacity = (context + 256 + 255) // 256 * 256
                cache.keys = mx.random.normal((1, heads, capacity, dim))
                cache.values = mx.random.normal((1, heads, capacity, dim))
                cache.offset = context
                mx.eval(cache.keys, cache.values)
        return sid

    def tick(self, context: int, n: int, arm: str) -> tuple[float, float]:
        """One timed tick of an `n`-token piece after `context` positions (+ 16: an untimed first piece
        stages the fabricated context into the rows, a one-off copy the admission's later pieces skip)."""
        sid = self.at_context(context)
        start = context or 16
        self.runner.fuse_max_tokens = 128 if arm.startswith("fused") else 0
        cpu_tick.PIECE_BLAS_THREADS = None if arm == "fused 2t" else 1
        prompt_side.SMALL_PIECE = 0 if arm == "separate 2t" else 128
        if context:
            self.runner.execute(Step(decode=self.rows, prefill=self.piece(sid, start, 16)))
            start += 16
        self.before_timed()
        cpu, wall = time.process_time(), time.perf_counter()
        if arm.startswith("fused"):
            self.runner.execute(Step(decode=self.rows, prefill=self.piece(sid, start, n)))
        else:
            self.runner.execute(Step(decode=self.rows))
            self.runner.execute(Step(prefill=self.piece(sid, start, n)))
        out = time.process_time() - cpu, time.perf_counter() - wall
        self.runner.execute(Step(retire=(Retire(sid),)))
        return out

    def decode(self) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        self.runner.execute(Step(decode=self.rows))
        return time.process_time() - cpu, time.perf_counter() - wall


def best(runs) -> str:
    return f"{min(r[0] for r in runs) * 1000:7.1f} / {min(r[1] for r in runs) * 1000:7.1f}"


def tick_setup(description: str, sizes: str) -> tuple[argparse.Namespace, ModelRunner]:
    """The tick benchmarks' shared arguments (`sizes`: the default piece sizes) and a ModelRunner over
    the default model with its CPU decode step and kernels; prints the model line."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--contexts", default="0,2048,6000")
    ap.add_argument("--sizes", default=sizes)
    args = ap.parse_args()
    lm = load_model(None)
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels, verify=lm.cpu_decode.verify)
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return args, runner


def tick_fused_main() -> None:
    args, runner = tick_setup(TICK_FUSED_DOC, "16,32,64,128,256")
    t = Ticks(runner, args.rows)
    for n in (16, 128):  # first-call compiles and allocations, untimed
        t.tick(0, n, "fused"), t.tick(0, n, "separate")
    print(f"decode {args.rows} rows alone: cpu / wall ms {best([t.decode() for _ in range(args.repeats)])}", flush=True)
    names = ["fused", "fused 2t", "separate", "separate 2t"]
    print(f"{'context':>7} {'piece':>5} | " + " | ".join(f"{a + ' cpu / wall ms':>21}" for a in names))
    for context in map(int, args.contexts.split(",")):
        for n in map(int, args.sizes.split(",")):
            arms = names if n <= 128 else ["separate"]  # longer pieces never fuse, and use numpy's threads
            runs: dict[str, list] = {a: [] for a in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    runs[arm].append(t.tick(context, n, arm))
            cells = [best(runs[a]) if a in runs else "-" for a in names]
            print(f"{context:>7} {n:>5} | " + " | ".join(f"{c:>21}" for c in cells), flush=True)


# ---- tick-split ----------------------------------------------------------------------------------

TICK_SPLIT_DOC = """Where a fused tick's time goes, by piece size and context, 4 rows decoding.

Usage: python -m bench tick-split [--repeats 3] [--rows 4] [--contexts 0,2048,6000]
       [--sizes 16,32,64]

The real ModelRunner's one-forward tick on the default model: the decode rows and the piece's rows
through the fused step (engine/runner/row_prefill.py), its parts timed by wrapping them: the piece's
staging into its slot (`_stage_piece`), the step (`run_rows`: every product and the attention), and the
mirror of the piece's K/V into its row cache (`_piece_written`); the rest is the runner's glue and
sampling (the step's growth with the context is its attention). Contexts are fabricated as in tick-fused (random K/V,
staged by an untimed first piece). Per shape the tick with the least wall time of `--repeats`.
"""


PARTS = ("stage", "step", "mirror")
_acc: dict[str, float] = defaultdict(float)


def _timed(name: str, fn):
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            _acc[name] += time.perf_counter() - t
    return wrapper


def install_part_timers(runner) -> None:
    """Wrap the tick's parts on this runner (instance attributes shadow the mixin's methods)."""
    runner._stage_piece = _timed("stage", runner._stage_piece)
    runner._piece_written = _timed("mirror", runner._piece_written)
    runner._fast_decode.run_rows = _timed("step", runner._fast_decode.run_rows)


def tick_split_main() -> None:
    args, runner = tick_setup(TICK_SPLIT_DOC, "16,32,64")
    install_part_timers(runner)
    t = Ticks(runner, args.rows)
    t.before_timed = _acc.clear
    for n in (16, 64):
        t.tick(0, n, "fused")
    print(f"{'context':>7} {'piece':>5} | {'tick wall':>9} {'cpu':>7} | " + " ".join(f"{p:>10}" for p in PARTS)
          + f" {'rest':>7}  (ms)")
    for context in map(int, args.contexts.split(",")):
        for n in map(int, args.sizes.split(",")):
            runs = []
            for _ in range(args.repeats):
                cpu, wall = t.tick(context, n, "fused")
                runs.append((wall, cpu, dict(_acc)))
            wall, cpu, parts = min(runs, key=lambda r: r[0])
            rest = wall - sum(parts.values())
            cells = " ".join(f"{parts.get(p, 0) * 1000:10.1f}" for p in PARTS)
            print(f"{context:>7} {n:>5} | {wall * 1000:9.1f} {cpu * 1000:7.1f} | {cells} {rest * 1000:7.1f}", flush=True)


# ---- tick-spikes ---------------------------------------------------------------------------------

TICK_SPIKES_DOC = """The two O(context) spikes of a long admission's fused ticks, apart from a model.

Usage: python -m bench tick-spikes [--start 4096] [--end 6144] [--piece 24] [--runs 3]

Over 30 layers of the default model's KV shapes (3 KV heads x 64, float32):
- regrow: each tick's store of a `--piece`-token piece into the row caches from `--start` to `--end`
  positions, mlx-lm's own growth (every layer regrows by 256 in the same tick) against the fused
  tick's `_store` (engine/runner/tick.py: each layer 1,024 ahead, at its own tick); per tick median,
  p95, max and the total, the arms interleaved `--runs` times;
- join: the terminal tick's copy of `--end` positions into a fresh slot of the rows (`RowKV.add`),
  and what staging costs instead: each piece's K/V written into the slot as the ticks run.
"""


LAYERS, HEADS, DIM = 30, 3, 64


def random_caches(offset: int, capacity: int) -> list:
    out = []
    for _ in range(LAYERS):
        c = KVCache()
        c.keys, c.values = mx.random.normal((1, HEADS, capacity, DIM)), mx.random.normal((1, HEADS, capacity, DIM))
        c.offset = offset
        mx.eval(c.keys, c.values)
        out.append(c)
    return out


def regrow(staggered: bool, start: int, end: int, piece: int) -> np.ndarray:
    """Per-tick store times (ms), the first 3 ticks left out (the fabricated start's first regrows)."""
    cache = random_caches(start, (start + 255) // 256 * 256)
    store, x, times = runner_tick._store(cache), np.random.rand(HEADS, piece, DIM).astype(np.float32), []
    for _ in range((end - start) // piece):
        t = time.perf_counter()
        for layer, c in enumerate(cache):
            if staggered:
                store(layer, x, x)
            else:
                c.update_and_fetch(mx.array(x)[None], mx.array(x)[None])
                mx.eval(c.keys, c.values)
        times.append(time.perf_counter() - t)
    return np.array(times[3:]) * 1000


def staged_join(end: int, piece: int) -> tuple[float, np.ndarray]:
    """(the join's copy in ms, the staged writes per tick in ms)."""
    cache = random_caches(end, (end + 1023) // 1024 * 1024)
    kv = RowKV(LAYERS, HEADS, DIM, 8, 8192)
    t = time.perf_counter()
    kv.add(cache)
    copy = (time.perf_counter() - t) * 1000
    slot, x, times = kv.stage(end), np.random.rand(HEADS, piece, DIM).astype(np.float32), []
    for p in range(0, end - piece + 1, piece):
        t = time.perf_counter()
        for layer in range(LAYERS):
            kv.keys[layer][slot, :, p:p + piece] = x
            kv.values[layer][slot, :, p:p + piece] = x
        times.append(time.perf_counter() - t)
    return copy, np.array(times) * 1000


def line(ms: np.ndarray) -> str:
    return f"median {np.median(ms):6.1f}  p95 {np.percentile(ms, 95):6.1f}  max {ms.max():6.1f}  total {ms.sum():7.0f} ms"


def tick_spikes_main() -> None:
    ap = argparse.ArgumentParser(description=TICK_SPIKES_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--end", type=int, default=6144)
    ap.add_argument("--piece", type=int, default=24)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {LAYERS} layers, pieces of {args.piece} from {args.start} to {args.end}")
    for _ in range(args.runs):
        for staggered in (False, True):
            name = "store, each layer ahead" if staggered else "store, mlx-lm's growth"
            print(f"{name:>24}: {line(regrow(staggered, args.start, args.end, args.piece))}", flush=True)
    for _ in range(args.runs):
        copy, staged = staged_join(args.end, args.piece)
        print(f"join of {args.end} positions: {copy:6.0f} ms in one tick; staged writes per tick {line(staged)}", flush=True)


# ---- kv-join -------------------------------------------------------------------------------------

KV_JOIN_DOC = """The cost of a join, without the model: a 6,144-token sequence's KV joining 4 rows of
300 positions (SmolLM2-135M's KV shape: 30 layers, 3 KV heads of 64), in mlx-lm's left-padded
BatchKVCache (merge + extend, then the CPU decode step's copy into buffers it owns) against the
engine's rows (engine/runner/kv_rows.py: the new row's copy only), and the engine's rows when the
new row shares a pinned prefix (its own positions only). Best of 3, process CPU and wall.

Usage: python -m bench kv-join
"""


def random_row(length: int, seed: int) -> list[KVCache]:
    """One sequence's prefilled row caches of `length` random positions."""
    out = []
    for layer in range(LAYERS):
        cache = KVCache()
        keys = mx.random.normal((1, HEADS, length, DIM), key=mx.random.key(seed * 100 + layer))
        cache.update_and_fetch(keys, keys * 0.5)
        out.append(cache)
    mx.eval([c.keys for c in out])
    return out


def cpu_wall_ms(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return (time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3


def join_batch(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    batch = [c.merge([c]) for c in rows[0]]
    for other in rows[1:]:
        for layer, cache in zip(batch, other):
            layer.extend(cache.merge([cache]))
    writer = _KvWriter()
    writer.begin(batch, len(rows))  # the decoder owns the batch's buffers before the join
    writer.end(batch, np.asarray(batch[0].offset))

    def join() -> None:
        for layer, cache in zip(batch, new):
            layer.extend(cache.merge([cache]))
        mx.eval([(b.keys, b.values) for b in batch])
        writer.begin(batch, len(rows) + 1)  # the decoder's copy at the next step

    return cpu_wall_ms(join)


def join_rows(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    kv = RowKV.like(rows[0])
    for r in rows:
        kv.add(r)
    return cpu_wall_ms(lambda: kv.add(new))


def join_shared(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    """The engine's rows when the new sequence adopted a pinned 6,000-token prefix (a shared system
    prompt): only its last 144 positions are copied."""
    kv = RowKV.like(rows[0])
    for r in rows:
        kv.add(r)
    prefix = kv.pin(new, SHARED)
    return cpu_wall_ms(lambda: kv.add(new, kv.ref(prefix)))


SHARED = 6000


def kv_join_main() -> None:
    argparse.ArgumentParser(description=KV_JOIN_DOC, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    rows, new = [random_row(300, i) for i in range(4)], random_row(6144, 9)
    for name, join in (("BatchKVCache", join_batch), ("engine rows", join_rows),
                       (f"engine rows, {SHARED:,} positions shared", join_shared)):
        runs = [join(rows, new) for _ in range(3)]
        print(f"join of a 6,144-token row next to 4 rows of 300, {name}: best CPU {min(r[0] for r in runs):.1f} ms, "
              f"wall {min(r[1] for r in runs):.1f} ms", flush=True)


# ---- context-shift -------------------------------------------------------------------------------

CONTEXT_SHIFT_DOC = """Context shift (--context-shift): the two ways to rebuild a shifted row, timed, and their
next-token logits against a fresh prefill of the shifted token list, in process.

    python -m bench context-shift [--contexts 512 2048] [--n-keep 32] [--rounds 3]

On the default model (SmolLM2-135M-Instruct): a row of C - 1 tokens of English text (the point
where llama-server shifts), n_keep kept, half of the rest discarded. Per mode ("prefill": forward
the kept tokens afresh; "rotate": re-rotate the tail keys, llama.cpp's way), the median time of
the shift, the max |logit error|, the KL divergence (nats) and whether the top token agrees with
the fresh prefill's, and how many of the next 32 greedy tokens agree. One decode step at C is
timed for scale. Prints the CPU and the load first (figures are under whatever load is there).
"""


FOLLOW = 32  # greedy tokens compared after the shift


def text_ids(tokenizer, n: int) -> tuple[int, ...]:
    from bench.speculative import PARAGRAPH

    story = (PARAGRAPH + " The librarian kept a diary of every visitor, and this is what it said. ") * 200
    ids = tuple(tokenizer.encode(story))
    assert len(ids) >= n, "the text is too short"
    return ids[:n]


def shifted(lm, mode: str, ids: tuple[int, ...], keep: int, discard: int) -> tuple[ModelRunner, float]:
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels)
    runner.shift_mode = mode
    begin = BeginSequence(SamplingParams(), ())
    runner.execute(Step(prefill=PrefillPiece(1, 0, ids, len(ids), True, None, begin)))
    kept = ids[:keep] + ids[keep + discard:]
    start = time.perf_counter()
    runner.execute(Step(shift=(Shift(1, keep, discard, kept),)))
    return runner, time.perf_counter() - start


def greedy_after(model, cache, token: int, n: int) -> tuple[mx.array, list[int]]:
    logits = model(mx.array([[token]]), cache=cache)[0, -1]
    first, out = logits, []
    for _ in range(n):
        out.append(mx.argmax(logits).item())
        logits = model(mx.array([[out[-1]]]), cache=cache)[0, -1]
    return first, out


def shift_rounds(lm, context: int, n_keep: int, rounds: int) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    ids = text_ids(lm.tokenizer, context)
    row, last = ids[: context - 1], ids[context - 1]
    discard = (len(row) - n_keep) // 2
    kept = row[:n_keep] + row[n_keep + discard:]
    fresh = make_prompt_cache(lm.model)
    lm.model(mx.array([kept]), cache=fresh)
    want, want_next = greedy_after(lm.model, fresh, last, FOLLOW)
    p_want = mx.softmax(want.astype(mx.float32))
    print(f"context {context}: row {len(row)} tokens, n_keep {n_keep}, n_discard {discard}")
    for mode in ("prefill", "rotate"):
        times = []
        for _ in range(rounds):
            runner, seconds = shifted(lm, mode, row, n_keep, discard)
            times.append(seconds)
        # the shifted row as mlx-lm caches (a private copy of the engine's row; row 0: the only sequence)
        got, got_next = greedy_after(lm.model, runner._extract(0, len(kept)), last, FOLLOW)
        p_got = mx.softmax(got.astype(mx.float32))
        kl = (p_want * (mx.log(p_want + 1e-30) - mx.log(p_got + 1e-30))).sum().item()
        err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        same = sum(a == b for a, b in zip(got_next, want_next))
        print(f"  {mode:8s} shift {statistics.median(times) * 1000:8.1f} ms  max|dlogit| {err:.4f}  KL {kl:.5f}  "
              f"top-1 {'same' if got_next[0] == want_next[0] else 'DIFFERENT'}  next {FOLLOW}: {same} same", flush=True)
    runner.execute(Step(decode=(1,)))  # the CPU decode step copies the rebuilt row into its own buffer once
    start = time.perf_counter()
    for _ in range(5):
        runner.execute(Step(decode=(1,)))
    print(f"  one decode step at this context: {(time.perf_counter() - start) / 5 * 1000:.1f} ms", flush=True)


def context_shift_main() -> None:
    parser = argparse.ArgumentParser(description=CONTEXT_SHIFT_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--n-keep", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for line in machine_lines():
        print(line, flush=True)
    lm = load_model(None)
    for context in args.contexts:
        shift_rounds(lm, context, args.n_keep, args.rounds)
