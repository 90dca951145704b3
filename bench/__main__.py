"""One entry point for the benchmarks: `python -m bench <subcommand> [args]`, from the repository root.

    .venv/bin/python -m bench --help                      # the subcommands, one line each
    .venv/bin/python -m bench vs-llama-server --help      # a subcommand's own flags
    .venv/bin/python -m bench decode --streams 1 4 --rounds 3

Each subcommand runs an existing script's `main()` with the remaining arguments, exactly as
`python bench/<script>.py [args]` does (those commands keep working; docs/BENCHMARKS.md lists both).
Only the chosen script is imported, so `--help` loads no model and imports only what that script does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent


class Command(NamedTuple):
    name: str
    script: str  # the module's file name in bench/, without .py
    help: str
    aliases: tuple[str, ...] = ()


COMMANDS: tuple[Command, ...] = (
    Command("vs-llama-server", "bench_vs_llama_server",
            "ours against llama-server, same GGUF: RSS, tok/s, TTFT, KV bytes", ("side-by-side",)),
    Command("decode", "bench_decode", "decode tok/s over HTTP at 1 and 4 streams, ours and peers"),
    Command("prefill", "bench_prefill", "prefill time per chunk size; --routes: fused rows vs mlx-lm"),
    Command("admission", "run_all", "the whole set of `make bench`: admission, TTFT, plots", ("all",)),
    Command("kv-bytes", "bench_kv_bytes", "resident KV bytes per token, ours against llama-server"),
    Command("speculative", "bench_speculative", "decode tok/s with and without prompt lookup or a draft"),
    Command("quant-kernels", "bench_quant_kernels", "quantized decode kernels and tiled prefill vs float32"),
    Command("decode-step", "bench_decode_step", "the CPU decoder's step alone: ms per step, per class"),
    Command("decode-sweep", "bench_decode_sweep",
            "the decode step's products per row width: GB/s against the measured read bandwidth"),
    Command("memory", "bench_memory", "resident memory of a GGUF after load and after decode"),
    Command("synthetic-gguf", "make_synthetic_gguf", "write a random GGUF in llama.cpp's Q4_K_M type mix"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=40, width=140),
        description="Run one benchmark. Every flag after the subcommand goes to its script; "
                    "`python -m bench <subcommand> --help` lists them.",
    )
    sub = p.add_subparsers(dest="command", metavar="<subcommand>", title="subcommands")
    for c in COMMANDS:
        sub.add_parser(c.name, aliases=list(c.aliases), add_help=False,
                       help=f"{c.help} (bench/{c.script}.py)")
    return p


def lookup(name: str) -> Optional[Command]:
    for c in COMMANDS:
        if name == c.name or name in c.aliases:
            return c
    return None


def run(command: Command, args: Sequence[str]) -> object:
    """Import bench/<script>.py as `python bench/<script>.py` would find it and call its main() with args."""
    sys.argv = [str(BENCH_DIR / f"{command.script}.py"), *args]
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    module = importlib.import_module(command.script)
    return module.main()


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
