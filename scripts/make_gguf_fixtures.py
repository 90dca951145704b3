"""Make the cross-implementation GGUF fixtures in tests/fixtures/gguf/ (run with a venv that
has torch, transformers, sentencepiece and llama.cpp's gguf-py; not the project's venv).

For each architecture: a tiny random-weight model in Hugging Face format (config.json,
model.safetensors, a byte-level BPE tokenizer), written by transformers itself; then the
GGUF made from it by llama.cpp's own `convert_hf_to_gguf.py`; then, when llama-server is
installed, its greedy tokens on a fixed prompt, recorded in llama_server_tokens.json.

    $VENV/bin/python scripts/make_gguf_fixtures.py \
        --llama-cpp $LLAMA_CPP_SOURCE \
        [--server llama-server] [--quantize llama-quantize] [--only ARCH ...]

($VENV: a venv with those packages; $LLAMA_CPP_SOURCE: a llama.cpp source tree, e.g. the one
scripts/build_llama_server.sh unpacks under its build directory.)

llama-quantize makes the K-quant files and the `requants` ones (from the f16 file; `cmake --build
BUILD --target llama-quantize` in the same llama.cpp tree); without it, or without llama-server, those
steps are skipped.

The converter recognises a tokenizer by hashing its output on a test string; ours are
new, so the script tells it which llama.cpp pre-tokenizer each one is (the only
change to the converter's behaviour, patched in the converter's own process)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_models import ARCHS, PROMPT, make_hf_dir  # noqa: E402
from llama_server_tokens import record_tokens  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
CONVERT = """
import os, sys
sys.path.insert(0, os.environ["LLAMA_CPP_DIR"])
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ["FIXTURE_PRE"]
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(llama_cpp: Path, hf_dir: Path, out: Path, outtype: str, pre: str) -> None:
    env = {**os.environ, "LLAMA_CPP_DIR": str(llama_cpp), "FIXTURE_PRE": pre}
    # A neutral general.name: llama.cpp changes token attributes for names containing "phi3".
    cmd = [sys.executable, "-c", CONVERT, str(hf_dir), "--outfile", str(out), "--outtype", outtype,
           "--model-name", "tiny"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    print(f"converted {hf_dir.name} -> {out.name} ({out.stat().st_size} bytes)")


def quantize(quantizer: str, src: Path, out: Path, kind: str, *flags: str) -> None:
    subprocess.run([quantizer, *flags, str(src), str(out), kind], check=True, capture_output=True)
    print(f"quantized {src.name} -> {out.name} ({kind}, {out.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    parser.add_argument("--server", default=shutil.which("llama-server"), help="llama-server binary (skip tokens if absent)")
    parser.add_argument("--quantize", default=shutil.which("llama-quantize"), help="llama-quantize binary (K-quant fixtures)")
    parser.add_argument("--only", nargs="*", help="architectures to (re)make")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    made = []
    for seed, (name, spec) in enumerate(ARCHS.items()):
        if args.only and name not in args.only:
            continue
        # A model made only to be K-quantized keeps its HF dir and base GGUF out of the repo.
        folder = Path(tempfile.mkdtemp()) if not spec.outtypes else OUT
        hf_dir = make_hf_dir(spec, folder / f"{name}-hf", seed=seed)
        for outtype in spec.outtypes:
            out = OUT / f"{name}-{outtype}.gguf"
            convert(args.llama_cpp, hf_dir, out, outtype, spec.pre)
            made.append(out)
        if spec.kquants and args.quantize:
            base = folder / f"{name}-f32.gguf"
            convert(args.llama_cpp, hf_dir, base, "f32", spec.pre)
            for kind in spec.kquants:
                out = OUT / f"{name}-{kind.lower()}.gguf"
                quantize(args.quantize, base, out, kind)
                made.append(out)
        elif spec.kquants:
            print(f"llama-quantize not found: {name} K-quant fixtures not made")
        for kind in spec.requants if args.quantize else ():
            out = OUT / f"{name}-{kind.lower()}.gguf"
            quantize(args.quantize, OUT / f"{name}-f16.gguf", out, kind, "--allow-requantize")
            made.append(out)
    if args.server:
        record_tokens(args.server, made, OUT / "llama_server_tokens.json", PROMPT)
    else:
        print("llama-server not found: greedy tokens not recorded")


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
