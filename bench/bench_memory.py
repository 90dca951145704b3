"""Resident memory (VmRSS) of a GGUF loaded for the CPU, after load and after a prefill + decode.

Usage: bench/bench_memory.py [GGUF ...] [--cpu-weights f32 native] [--prompt 256] [--decode 32]
Each (file, --cpu-weights) runs in a fresh process: load_model as `serve` does, then one prompt of
--prompt random tokens prefilled and --decode greedy steps through the loader's decode path
(cpu_decode when it installed one). Prints MiB and the ratio to the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mlxcel_py.models.footprint import resident_bytes  # noqa: E402


def rss_mib() -> float:
    return resident_bytes() / (1 << 20)


def child(path: str, cpu_weights: str, prompt: int, decode: int) -> dict:
    from mlxcel_py.models.cpu.blas import preload_blas

    preload_blas("auto")
    import random

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.models import load_model

    base = rss_mib()
    lm = load_model(path, cpu_weights=cpu_weights)
    loaded = rss_mib()
    ids = [random.Random(0).randrange(3, min(1000, lm.vocab_size)) for _ in range(prompt)]
    cache = make_prompt_cache(lm.model)
    with lm.cpu_kernels:
        logits = lm.model(mx.array([ids]), cache=cache)[:, -1]
    mx.eval(logits)
    batch = [layer.merge([layer]) for layer in cache]
    token = [int(logits.argmax(-1).item())]
    for _ in range(decode):
        out = lm.cpu_decode(token, batch) if lm.cpu_decode else lm.model(mx.array(token)[:, None], cache=batch)[:, -1]
        token = [int(mx.argmax(out, -1).item())]
    return {"imports": base, "loaded": loaded, "decoded": rss_mib(), "weights": lm.weights}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("gguf", nargs="*")
    ap.add_argument("--cpu-weights", nargs="+", default=["f32", "native"])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        print(json.dumps(child(*opts.child, opts.prompt, opts.decode)))
        return
    from mlxcel_py.models.loader import default_model_path

    for path in opts.gguf or [default_model_path()]:
        size = Path(path).stat().st_size / 2**20
        for weights in opts.cpu_weights:
            cmd = [sys.executable, __file__, "--child", path, weights, "--prompt", str(opts.prompt),
                   "--decode", str(opts.decode)]
            got = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(f"{Path(path).name} ({size:.0f} MiB) --cpu-weights {weights} [{got['weights']}]: "
                  f"imports {got['imports']:.0f} MiB, after load {got['loaded']:.0f} MiB "
                  f"({got['loaded'] / size:.2f}x file), after prefill+decode {got['decoded']:.0f} MiB "
                  f"({got['decoded'] / size:.2f}x file)", flush=True)


if __name__ == "__main__":
    main()
