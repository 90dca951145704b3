"""Where one tick's time goes on this CPU (decode step, prefill piece, join).

Usage: .venv/bin/python bench/bench_tick_parts.py [--repeats 3] [--rows 4] [--quick] [--layout batch|rows] [--fuse N]

Runs the real ModelRunner on the default model through `Step` records and reports, best of
`--repeats`, both process CPU time (`time.process_time`: less inflated by other processes on a
shared machine) and wall time:
- a `rows`-row decode step with the rows at ~300 and ~6,000 positions;
- a prefill piece of 16..512 tokens at context 0 / 2,048 / 6,000 alone (the attention share is
  the piece's cost at the context minus at context 0; the rest is the products and the graph),
  and the tick of the decode rows with it (one forward with `--layout rows`, pieces up to `--fuse`);
- the join after a 6,144-token prefill with `rows` rows decoding: the terminal piece's merge,
  and the next decode step's excess over a plain one (the decoder's re-own copy).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

from mlxcel_py.engine.core.request import SamplingParams  # noqa: E402
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402

BUILD = 512


class Bench:
    """Scratch sequences on one runner, ids counting up; long contexts are adopted from one
    snapshot (built once, untimed) instead of prefilled again."""

    def __init__(self, runner, vocab: int):
        self.runner, self.rng, self.vocab, self.next_id = runner, random.Random(0), vocab, 0
        self.prompt = self.tokens(8192)
        self.bases: dict[int, int] = {}  # context -> snapshot id of the prompt's first `context` tokens

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.vocab // 4, self.vocab) for _ in range(n))

    def step(self, **kw):
        return self.runner.execute(Step(**kw))

    def piece_of(self, seq_id: int, start: int, toks, terminal: bool, adopt=None, snap=None) -> PrefillPiece:
        begin = BeginSequence(SamplingParams(), self.prompt[:start], adopt) if start == 0 or adopt else None
        return PrefillPiece(seq_id, start, tuple(toks), start + len(toks), terminal, snap, begin)

    def base(self, context: int) -> int:
        """A snapshot of the prompt's first `context` tokens (prefilled in 512-token pieces once)."""
        if context not in self.bases:
            self.next_id += 1
            sid, snap = self.next_id, 1000 + context
            for start in range(0, context, BUILD):
                end = min(context, start + BUILD)
                self.step(prefill=self.piece_of(sid, start, self.prompt[start:end], False,
                                                snap=snap if end == context else None))
            self.retire([sid])
            self.bases[context] = snap
        return self.bases[context]

    def sequence(self, context: int, n: int, terminal: bool):
        """(id, the piece of `n` tokens after `context` adopted ones) of a new sequence."""
        self.next_id += 1
        adopt = self.base(context) if context else None
        return self.next_id, self.piece_of(self.next_id, context, self.tokens(n), terminal, adopt)

    def rows(self, count: int, context: int) -> tuple[int, ...]:
        """`count` decoding rows at context + 4 positions."""
        ids = []
        for _ in range(count):
            sid, piece = self.sequence(context, 4, True)
            self.step(prefill=piece)
            ids.append(sid)
        return tuple(ids)

    def retire(self, ids) -> None:
        self.step(retire=tuple(Retire(s) for s in ids))


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def best(runs) -> tuple[float, float]:
    runs = list(runs)
    return min(r[0] for r in runs), min(r[1] for r in runs)


def ms(pair: tuple[float, float]) -> str:
    return f"cpu {pair[0] * 1000:7.1f} ms  wall {pair[1] * 1000:7.1f} ms"


def decode_steps(b: Bench, rows: int, repeats: int, contexts) -> None:
    for context in contexts:
        ids = b.rows(rows, context)
        b.step(decode=ids)  # the first step after a join owns the buffers
        print(f"decode {rows} rows at ~{context} positions: {ms(best(timed(lambda: b.step(decode=ids)) for _ in range(repeats)))}",
              flush=True)
        b.retire(ids)


def pieces(b: Bench, rows: int, repeats: int, sizes, contexts) -> None:
    """Each piece alone, then the tick of `rows` decoding rows (~300 positions) and the piece."""
    ids = b.rows(rows, 300)
    b.step(decode=ids)
    for context in contexts:
        for n in sizes:
            out = []
            for decode in ((), ids):
                runs = []
                for _ in range(repeats):
                    sid, piece = b.sequence(context, n, False)
                    runs.append(timed(lambda: b.step(decode=decode, prefill=piece)))
                    b.retire([sid])
                out.append(best(runs))
            print(f"piece {n:4d} at context {context:5d}: alone {ms(out[0])} | tick with {rows} rows {ms(out[1])}",
                  flush=True)
    b.retire(ids)


def join(b: Bench, rows: int, prompt: int, repeats: int) -> None:
    ids = b.rows(rows, 300)
    b.step(decode=ids)
    plain = best(timed(lambda: b.step(decode=ids)) for _ in range(repeats))
    merge = [0.0, 0.0]
    original = b.runner._join

    def timed_join(*args):
        merge[0], merge[1] = timed(lambda: original(*args))

    b.runner._join = timed_join
    sid, piece = b.sequence(prompt - 8, 8, True)
    b.step(prefill=piece)
    b.runner._join = original
    after = timed(lambda: b.step(decode=(*ids, sid)))
    again = best(timed(lambda: b.step(decode=(*ids, sid))) for _ in range(repeats))
    print(f"join of a {prompt}-token prefill next to {rows} rows: merge {ms(tuple(merge))}")
    print(f"  decode {rows} rows before: {ms(plain)}; first step after the join {ms(after)}; "
          f"later steps {ms(again)}", flush=True)
    b.retire([*ids, sid])


def ab(lm, rows: int, repeats: int) -> None:
    """Main's layout (BatchKVCache, separate forwards) against the engine's rows with one forward
    per tick, measured interleaved in one process so that the load weighs on both alike."""
    arms = {}
    for name, kv_rows in (("batch", False), ("rows", True)):
        runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels, verify=lm.cpu_decode.verify,
                             kv_rows=kv_rows)
        b = Bench(runner, lm.model.args.vocab_size)
        ids = b.rows(rows, 300)
        b.step(decode=ids)
        arms[name] = (b, ids)
    shapes = [("decode", 0, 0), ("tick", 16, 2048), ("tick", 64, 2048), ("tick", 128, 2048)]
    for kind, n, context in shapes:
        got = {name: [] for name in arms}
        for _ in range(repeats):
            for name, (b, ids) in arms.items():
                if kind == "decode":
                    got[name].append(timed(lambda: b.step(decode=ids)))
                    continue
                sid, piece = b.sequence(context, n, False)
                got[name].append(timed(lambda: b.step(decode=ids, prefill=piece)))
                b.retire([sid])
        label = f"decode {rows} rows" if kind == "decode" else f"{rows} rows + piece {n} at {context}"
        print(f"{label:>28}: " + " | ".join(f"{name} {ms(best(r))}" for name, r in got.items()), flush=True)
    for name, (b, ids) in arms.items():
        b.retire(ids)
        print(f"[{name}]", end=" ")
        join(b, rows, 6144, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--layout", choices=("batch", "rows"), default=None, help="the runner's decode KV layout")
    ap.add_argument("--ab", action="store_true", help="only main's layout against rows + one forward, interleaved")
    ap.add_argument("--fuse", type=int, default=None, help="the runner's fuse_max_tokens (0: separate forwards)")
    args = ap.parse_args()
    lm = load_model(None)
    kw = {} if args.layout is None else {"kv_rows": args.layout == "rows"}
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels,
                         verify=lm.cpu_decode.verify if lm.cpu_decode else None, **kw)
    if args.fuse is not None:
        runner.fuse_max_tokens = args.fuse
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.ab:
        ab(lm, args.rows, args.repeats)
        return
    b = Bench(runner, lm.model.args.vocab_size)
    decode_steps(b, args.rows, args.repeats, (300, 6000))
    sizes = (16, 64, 512) if args.quick else (16, 32, 64, 128, 512)
    pieces(b, args.rows, args.repeats, sizes, (0, 2048, 6000))
    join(b, args.rows, 6144, args.repeats)


if __name__ == "__main__":
    main()
