"""Issue 26 step 0: where one tick's time goes on this CPU (decode step, prefill piece, join).

Usage: .venv/bin/python bench/bench_tick_parts.py [--repeats 3] [--rows 4] [--quick]

Runs the real ModelRunner on the default model through `Step` records and reports, best of
`--repeats`, both process CPU time (`time.process_time`: less inflated by other processes on a
shared machine) and wall time:
- a `rows`-row decode step with the rows at ~300 and ~6,000 positions;
- a prefill piece of 16..512 tokens at context 0 / 2,048 / 6,000 (the attention share is the
  piece's cost at the context minus at context 0; the rest is the products and the graph);
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

from mlxcel_py.models.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

from mlxcel_py.engine.core.request import SamplingParams  # noqa: E402
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402

BUILD = 512


class Bench:
    """Scratch sequences on one runner, ids counting up."""

    def __init__(self, runner, vocab: int):
        self.runner, self.rng, self.vocab, self.next_id = runner, random.Random(0), vocab, 0

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.vocab // 4, self.vocab) for _ in range(n))

    def piece(self, seq_id: int, start: int, toks: tuple[int, ...], terminal: bool) -> None:
        begin = BeginSequence(SamplingParams(), ()) if start == 0 else None
        self.runner.execute(Step(prefill=PrefillPiece(seq_id, start, toks, len(toks), terminal, None, begin)))

    def prefill(self, length: int, terminal: bool, piece: int = BUILD) -> int:
        """A new sequence prefilled to `length` tokens in `piece`-token pieces; its id."""
        self.next_id += 1
        toks = self.tokens(length)
        for start in range(0, length, piece):
            end = min(length, start + piece)
            self.piece(self.next_id, start, toks[start:end], terminal and end == length)
        return self.next_id

    def retire(self, ids) -> None:
        self.runner.execute(Step(retire=tuple(Retire(s) for s in ids)))


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def best(fn, repeats: int) -> tuple[float, float]:
    runs = [timed(fn) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def ms(pair: tuple[float, float]) -> str:
    return f"cpu {pair[0] * 1000:7.1f} ms  wall {pair[1] * 1000:7.1f} ms"


def decode_steps(b: Bench, rows: int, repeats: int, contexts) -> dict[int, tuple[float, float]]:
    out = {}
    for context in contexts:
        ids = [b.prefill(context, terminal=True) for _ in range(rows)]
        step = Step(decode=tuple(ids))
        b.runner.execute(step)  # the decoder's first step owns the buffers
        out[context] = best(lambda: b.runner.execute(step), repeats)
        print(f"decode {rows} rows at ~{context} positions: {ms(out[context])}", flush=True)
        b.retire(ids)
    return out


def pieces(b: Bench, repeats: int, sizes, contexts) -> None:
    for context in contexts:
        seq = b.prefill(context, terminal=False) if context else None
        for n in sizes:
            runs = []
            for _ in range(repeats):  # at context 0 a fresh sequence each time; else the context grows by n
                if context == 0:
                    b.next_id += 1
                    sid, start = b.next_id, 0
                else:
                    sid, start = seq, context
                toks = b.tokens(n)
                runs.append(timed(lambda: b.piece(sid, start, toks, False)))
                if context == 0:
                    b.retire([sid])
                else:
                    context += n
            pair = (min(r[0] for r in runs), min(r[1] for r in runs))
            print(f"piece {n:4d} at context {context:5d}: {ms(pair)}", flush=True)
        if seq is not None:
            b.retire([seq])


def join(b: Bench, rows: int, prompt: int, repeats: int) -> None:
    ids = [b.prefill(300, terminal=True) for _ in range(rows)]
    step = Step(decode=tuple(ids))
    b.runner.execute(step)
    plain = best(lambda: b.runner.execute(step), repeats)
    merge = [0.0, 0.0]
    original = b.runner._join

    def timed_join(*args):
        pair = timed(lambda: original(*args))
        merge[0], merge[1] = pair

    b.runner._join = timed_join
    new = b.prefill(prompt, terminal=True)
    b.runner._join = original
    after = timed(lambda: b.runner.execute(Step(decode=(*ids, new))))
    again = best(lambda: b.runner.execute(Step(decode=(*ids, new))), repeats)
    print(f"join of a {prompt}-token prefill next to {rows} rows: merge {ms(tuple(merge))}")
    print(f"  decode {rows} rows before: {ms(plain)}; first step after the join {ms(after)}; "
          f"later steps {ms(again)}", flush=True)
    b.retire([*ids, new])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--layout", choices=("batch", "rows"), default=None, help="the runner's decode KV layout")
    args = ap.parse_args()
    lm = load_model(None)
    kw = {} if args.layout is None else {"kv_rows": args.layout == "rows"}
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels,
                         verify=lm.cpu_decode.verify if lm.cpu_decode else None, **kw)
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}", flush=True)
    b = Bench(runner, lm.model.args.vocab_size)
    decode_steps(b, args.rows, args.repeats, (300, 6000))
    sizes = (16, 64, 512) if args.quick else (16, 32, 64, 128, 512)
    pieces(b, args.repeats, sizes, (0, 2048, 6000))
    join(b, args.rows, 6144, args.repeats)


if __name__ == "__main__":
    main()
