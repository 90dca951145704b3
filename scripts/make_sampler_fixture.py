"""Record llama.cpp's samplers on fixed logits in tests/fixtures/samplers_llama_cpp.json: top-k, typical, top-p,
min-p, XTC, dynamic temperature, top-n-sigma, each alone and in llama-server's default order, and mirostat 1 and
2 over several steps (the tokens they drew recorded, so a test replays them). tests/test_sampler_chain.py holds
our chain (engine/runner/sampler_chain.py) to the record.

scripts/sampler_reference.cpp is compiled against the static libraries scripts/build_llama_server.sh leaves in
the llama.cpp tree (its source tree inside the llama-cpp-python sdist):

    .venv/bin/python scripts/make_sampler_fixture.py --llama-cpp DIR/llama_cpp_python-*/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
OUT = HERE.parent / "tests" / "fixtures" / "samplers_llama_cpp.json"
SOURCE = HERE / "sampler_reference.cpp"
LIBS = ("build/src/libllama.a", "build/ggml/src/libggml.a", "build/ggml/src/libggml-cpu.a",
        "build/ggml/src/libggml-base.a")


def rows(seed: int = 7) -> dict[str, list[float]]:
    """Fixed logits: a spread row, a peaked one, a flat one, one with very low values."""
    rng = np.random.default_rng(seed)
    spread = rng.standard_normal(64) * 2.0
    peaked = rng.standard_normal(64)
    peaked[[3, 17]] = [9.0, 7.5]
    flat = rng.standard_normal(64) * 0.05
    odd = rng.standard_normal(64) * 3.0
    odd[[5, 6]] = -30.0  # far below the rest (no exact ties: llama.cpp's order among them is unspecified)
    return {name: [float(np.float32(v)) for v in row] for name, row in
            (("spread", spread), ("peaked", peaked), ("flat", flat), ("odd", odd))}


# Each case: the chain (llama.cpp's names and arguments, in order), on every row, one step each.
CHAINS = {
    "top_k": [["top_k", 5]],
    "typical": [["typical", 0.7, 1]],
    "typical_keep": [["typical", 0.2, 4]],
    "top_p": [["top_p", 0.8, 1]],
    "top_p_keep": [["top_p", 0.1, 5]],
    "min_p": [["min_p", 0.1, 1]],
    "min_p_keep": [["min_p", 0.5, 6]],
    "xtc": [["xtc", 1.0, 0.05, 1, 1]],
    "xtc_keep": [["xtc", 1.0, 0.01, 30, 1]],
    "temp": [["temp_ext", 0.7, 0.0, 1.0]],
    "greedy": [["temp_ext", 0.0, 0.0, 1.0]],
    "dynatemp": [["temp_ext", 0.8, 0.5, 1.0]],
    "dynatemp_exp": [["temp_ext", 1.0, 0.6, 2.0]],
    "top_n_sigma": [["top_n_sigma", 1.0]],
    # llama-server's order (top-n-sigma off: its -inf logits make typical's entropy NaN in llama.cpp, whose
    # std::sort then orders by an invalid comparison)
    "default_order": [["top_k", 40], ["typical", 0.9, 1], ["top_p", 0.95, 1], ["min_p", 0.05, 1],
                      ["xtc", 1.0, 0.1, 1, 1], ["temp_ext", 0.8, 0.2, 1.0]],
    "sigma_first": [["top_n_sigma", 1.0], ["top_k", 40], ["top_p", 0.9, 1], ["min_p", 0.02, 1],
                    ["temp_ext", 0.8, 0.0, 1.0]],
    "reordered": [["temp_ext", 1.5, 0.0, 1.0], ["min_p", 0.1, 1], ["top_k", 20], ["top_p", 0.9, 1]],
}
# Stateful cases: several steps on the rows in turn, the drawn token accepted after each.
MIROSTAT = {
    "mirostat": [["temp_ext", 1.0, 0.0, 1.0], ["mirostat", 64, 11, 5.0, 0.1, 100]],
    "mirostat_hot": [["temp_ext", 0.6, 0.0, 1.0], ["mirostat", 64, 12, 3.0, 0.3, 100]],
    "mirostat_v2": [["temp_ext", 1.0, 0.0, 1.0], ["mirostat_v2", 13, 5.0, 0.1]],
    "mirostat_v2_low": [["temp_ext", 0.9, 0.0, 1.0], ["mirostat_v2", 14, 2.0, 0.5]],
}
STEPS = 6
# DRY on token histories (the chain's only sampler, on zero logits: what is left is each token's penalty).
# multiplier, base, allowed length, last n, then the breakers as token lists (head first).
DRY = {
    "dry_repeat": ([["dry", 0.8, 1.75, 2, 64, "9", "7,8"]], [1, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 3]),
    "dry_breaker": ([["dry", 0.8, 1.75, 2, 64, "9", "7,8"]], [1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3]),
    "dry_tail_breaker": ([["dry", 1.0, 2.0, 1, 64, "9", "7,8"]], [1, 2, 7, 8, 1, 2, 4, 1, 2, 7, 8, 1, 2]),
    "dry_window": ([["dry", 0.5, 1.5, 1, 6, "9"]], [1, 2, 3, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]),
    "dry_long": ([["dry", 0.8, 1.1, 2, 200, "9"]], [1, 2, 3, 4, 5, 6] * 12 + [1, 2, 3]),
    "dry_single_breaker_token": ([["dry", 0.8, 1.75, 1, 64, "3"]], [1, 2, 3, 1, 2, 3, 1, 2]),
}


def build(llama_cpp: Path, binary: Path) -> None:
    cmd = ["g++", "-O2", "-std=c++17", str(SOURCE), "-I", str(llama_cpp / "include"), "-I",
           str(llama_cpp / "ggml/include"), "-I", str(llama_cpp / "src"), *[str(llama_cpp / lib) for lib in LIBS],
           "-lpthread", "-fopenmp", "-ldl", "-o", str(binary)]
    subprocess.run(cmd, check=True)


def run(binary: Path, chain: list, steps: list[tuple[str, list[float]]], accept: bool,
        history: tuple[int, ...] = ()) -> list[dict]:
    lines = [" ".join(["sampler", *map(str, s)]) for s in chain] + [f"accept {t}" for t in history]
    out, results = [], []
    # one process per step sequence; accepted tokens are fed back line by line
    proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in lines:
        proc.stdin.write(line + "\n")
    for row, logits in steps:
        proc.stdin.write("step " + " ".join(repr(v) for v in logits) + "\n")
        proc.stdin.flush()
        kept = proc.stdout.readline().split()[1:]
        selected = int(proc.stdout.readline().split()[1])
        entry = {"row": row, "kept": [[int(i), float(l), float(p)] for i, l, p in (k.split(":") for k in kept)],
                 "selected": selected}
        results.append(entry)
        if accept and selected >= 0:
            proc.stdin.write(f"accept {selected}\n")
    proc.stdin.close()
    out.append(proc.wait())
    return results


# DRY end to end: llama-server's greedy tokens with DRY on a committed fixture (its breakers found in that
# vocabulary from the strings, the prompt in the history).
SERVER_MODEL = HERE.parent / "tests" / "fixtures" / "gguf" / "llama-f16.gguf"
SERVER_PROMPT = "one two three four one two three four one two three four one two"
SERVER_BODIES = [
    {"dry_multiplier": 0.8, "dry_allowed_length": 2},
    {"dry_multiplier": 2.0, "dry_base": 1.3, "dry_allowed_length": 1, "dry_penalty_last_n": 12,
     "dry_sequence_breakers": [" three", "\n"]},
]


def record_server(server: str) -> list[dict]:
    from fixture_gguf import llama_server
    from llama_server_tokens import _post

    out = []
    with llama_server(server, SERVER_MODEL, "-c", "1024", "-np", "1", "-t", "2", "--no-warmup") as (port, _):
        for body in SERVER_BODIES:
            got = _post(port, "/completion", {"prompt": SERVER_PROMPT, "n_predict": 16, "temperature": 0,
                                              "cache_prompt": False, "return_tokens": True, **body})
            plain = _post(port, "/completion", {"prompt": SERVER_PROMPT, "n_predict": 16, "temperature": 0,
                                                "cache_prompt": False, "return_tokens": True})
            out.append({"body": body, "tokens": got["tokens"], "without": plain["tokens"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="the llama.cpp source tree, built")
    parser.add_argument("--server", help="llama-server, for DRY end to end (scripts/build_llama_server.sh)")
    args = parser.parse_args()
    table = rows()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "sampler_reference"
        build(args.llama_cpp, binary)
        cases = {name: {"chain": chain, "steps": run(binary, chain, list(table.items()), False)}
                 for name, chain in CHAINS.items()}
        order = list(table.items())
        for name, (chain, history) in DRY.items():
            cases[name] = {"chain": chain, "history": history,
                           "steps": run(binary, chain, [("zeros", [0.0] * 16)], False, tuple(history))}
        for name, chain in MIROSTAT.items():
            cases[name] = {"chain": chain, "steps": run(binary, chain, [order[i % len(order)] for i in range(STEPS)],
                                                         True)}
    dry_server = record_server(args.server) if args.server else []
    OUT.write_text(json.dumps({"llama_cpp": "llama-cpp-python 0.3.36 sdist", "rows": {**table, "zeros": [0.0] * 16},
                               "cases": cases, "dry_server": {"model": SERVER_MODEL.name, "prompt": SERVER_PROMPT,
                                                              "runs": dry_server}},
                              separators=(",", ":")) + "\n")
    print(f"recorded {len(cases)} cases in {OUT.name}")


if __name__ == "__main__":
    main()
