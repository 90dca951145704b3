"""One entry point for the benchmarks: `python -m bench <subcommand> [args]`, from the repository root.

    .venv/bin/python -m bench --help                      # the subcommands, one line each
    .venv/bin/python -m bench vs-llama-server --help      # a subcommand's own flags
    .venv/bin/python -m bench decode --streams 1 4 --rounds 3

bench/ holds one module per concern; each subcommand is one mode of a module, run by calling that
module's function for it with the remaining arguments (COMMANDS below). Only the chosen module is
imported, so `--help` loads no model; a module's own imports (numpy, MLX with the BLAS preloaded
first) are all it costs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


class Command(NamedTuple):
    name: str
    module: str  # the module's file name in bench/, without .py
    function: str  # the module's function that runs this mode (it parses sys.argv[1:])
    help: str
    aliases: tuple[str, ...] = ()


COMMANDS: tuple[Command, ...] = (
    # The whole set (`make bench`) and the peers it runs.
    Command("all", "run_all", "main", "the whole set of `make bench`: admission, TTFT, results and plots",
            ("admission",)),
    Command("peers", "peers", "main", "peer servers: status, convert-default (the mlx-lm copy), check"),
    # Ours beside llama-server and the other peers, over HTTP.
    Command("vs-llama-server", "vs_llama_server", "main",
            "ours against llama-server, same GGUF: RSS, tok/s, TTFT, greedy text, KV bytes", ("side-by-side",)),
    Command("kv-bytes", "vs_llama_server", "kv_bytes_main", "resident KV bytes per token, ours against llama-server"),
    Command("decode", "serve", "decode_main", "decode tok/s over HTTP at 1 and 4 streams, ours and the peers"),
    Command("serve-path", "serve", "serve_path_main", "the HTTP path's CPU a token: event loop and client"),
    Command("models", "serve", "models_main", "several models behind one server: cold and resident TTFT"),
    Command("mixed-embeddings", "serve", "mixed_embeddings_main", "embeddings arriving while four streams decode"),
    Command("distributed", "serve", "distributed_main", "one process against two tensor-parallel ranks"),
    # In process: the engine and whole-model paths.
    Command("engine", "engine", "engine_main", "the engine's aggregate decode tok/s beside mlx-lm's BatchGenerator"),
    Command("generate", "engine", "generate_main", "one-shot generation: our engine beside mlx-lm's stream_generate"),
    Command("fast-path", "engine", "fast_path_main", "prefill and decode on the CPU: the fast path against stock MLX"),
    Command("prefill", "engine", "prefill_main", "prefill time per chunk size; --routes: fused rows vs mlx-lm"),
    Command("cpu-weights", "engine", "cpu_weights_main",
            "--cpu-weights f32 against native: generate's decode tok/s; --prefill"),
    Command("memory", "engine", "memory_main", "resident memory of a GGUF after load and after decode"),
    # In process: the CPU decode step.
    Command("decode-step", "decode", "decode_step_main", "the CPU decoder's step alone: ms per step, per class"),
    Command("decode-sweep", "decode", "decode_sweep_main",
            "the decode step's products per row width: GB/s against the measured read bandwidth"),
    Command("arch-decode", "decode", "arch_decode_main", "decode per architecture: mlx-lm's forward vs the CPU step"),
    Command("roofline", "decode", "roofline_main",
            "this machine's bandwidth and peak products; decode and prefill as fractions of them"),
    # Kernels alone, without a model.
    Command("quant-kernels", "kernels", "quant_kernels_main", "quantized decode kernels and tiled prefill vs float32"),
    Command("kquant-repack", "kernels", "kquant_repack_main", "the Q4_K and Q6_K products over the file's rows vs repacked eight rows a call"),
    Command("decode-attention", "kernels", "decode_attention_main", "the decode attention kernel alone"),
    Command("vision-encode", "engine", "vision_main",
            "one image through Gemma 3's vision tower and projector, real shapes: time and memory"),
    Command("prefill-attention", "kernels", "prefill_attention_main", "prefill attention alone, per architecture"),
    Command("prefill-weights", "kernels", "prefill_weights_main", "prefill products over a GGUF's weights, three ways"),
    # The engine's tick, its KV and the context shift.
    Command("tick-costs", "tick", "tick_costs_main", "calibrate the tick cost model; predict the ITL budget"),
    Command("tick-fused", "tick", "tick_fused_main", "a tick's cost by piece size and context, fused vs separate"),
    Command("tick-split", "tick", "tick_split_main", "where a fused tick's time goes, by part"),
    Command("tick-spikes", "tick", "tick_spikes_main", "the two O(context) spikes of a long admission's ticks"),
    Command("kv-join", "tick", "kv_join_main", "the cost of a join without the model: mlx-lm's vs the engine's rows"),
    Command("context-shift", "tick", "context_shift_main", "context shift: re-prefill vs re-rotate, time and logits"),
    # Decoding features.
    Command("speculative", "speculative", "main", "decode tok/s with and without prompt lookup or a draft"),
    Command("constraints", "grammar", "constraints_main", "constrained decoding's per-token cost next to a step"),
    Command("grammar-libs", "grammar", "grammar_libs_main", "llguidance, xgrammar and outlines-core compared"),
    # Fixtures.
    Command("synthetic-gguf", "synthetic", "main", "write a random GGUF in llama.cpp's Q4_K_M type mix"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=40, width=140),
        description="Run one benchmark. Every flag after the subcommand goes to it; "
                    "`python -m bench <subcommand> --help` lists them.",
    )
    sub = p.add_subparsers(dest="command", metavar="<subcommand>", title="subcommands")
    for c in COMMANDS:
        sub.add_parser(c.name, aliases=list(c.aliases), add_help=False, help=f"{c.help} (bench/{c.module}.py)")
    return p


def lookup(name: str) -> Optional[Command]:
    for c in COMMANDS:
        if name == c.name or name in c.aliases:
            return c
    return None


def run(command: Command, args: Sequence[str]) -> object:
    """Import bench/<module>.py and call the command's function with sys.argv as its argparse reads it."""
    sys.argv = [f"python -m bench {command.name}", *args]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module(f"bench.{command.module}")
    return getattr(module, command.function)()


def main(argv: Optional[Sequence[str]] = None) -> object:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = lookup(argv[0]) if argv else None
    if command is not None:
        return run(command, argv[1:])
    p = parser()
    p.parse_args(argv)  # --help prints the list and exits; an unknown subcommand is an error
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
