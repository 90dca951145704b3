"""Typer options of `bench admit` and `bench ttft` (cli/bench.py); their records are in flags.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ArmOpt = Annotated[list[str], typer.Option(
    "--arm", help='NAME="serve flags": start `python -m mlxcel_py serve` with these flags (repeatable).')]
UrlOpt = Annotated[list[str], typer.Option(
    "--url", help="NAME=http://host:port: measure a running OpenAI-compatible server (repeatable).")]
BenchModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Model for started servers and for the prompt tokenizer. Default: the bundled model.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write the raw results as JSON here.")]
PromptTokensOpt = Annotated[int, typer.Option("--prompt-tokens", min=1, help="Tokens in the measured prompt.")]
BenchSeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random-word prompts.")]
RoundsOpt = Annotated[int, typer.Option("--rounds", min=1)]
StreamsOpt = Annotated[int, typer.Option("--streams", min=1, help="Decoding streams.")]
StreamPromptTokensOpt = Annotated[int, typer.Option("--stream-prompt-tokens", min=1)]
QuietOpt = Annotated[float, typer.Option("--quiet-s", min=0.0, help="Decode-only window before admission.")]
WarmupRoundsOpt = Annotated[int, typer.Option("--warmup-rounds", min=0, help="Full rounds run first and discarded.")]
TailTokensOpt = Annotated[int, typer.Option("--tail-tokens", min=1, help="Stream tokens after the admitted first token.")]
BudgetArmOpt = Annotated[Optional[int], typer.Option(
    "--itl-budget-ms", min=1, help="Add the arm `budget`: a server started with --itl-budget-ms N.")]
ServerParallelOpt = Annotated[Optional[int], typer.Option("--parallel", min=1, help="--parallel of started servers.")]
NullOpt = Annotated[Optional[str], typer.Option(
    "--null", help="The null arm. Default: the first arm whose flags repeat an earlier arm's.")]
