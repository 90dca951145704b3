"""`mlxcel-py bench admit|ttft`: serving benchmarks against servers this command starts
(`--arm NAME="serve flags"`) or already running (`--url NAME=http://host:port`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import MlxcelError
from .common import fail

app = typer.Typer(help="Serving benchmarks: admission under live decode, single-stream TTFT.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

ArmOpt = Annotated[list[str], typer.Option(
    "--arm", help='NAME="serve flags": start `python -m mlxcel_py serve` with these flags (repeatable).')]
UrlOpt = Annotated[list[str], typer.Option(
    "--url", help="NAME=http://host:port: measure a running OpenAI-compatible server (repeatable).")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Model for started servers and for the prompt tokenizer. Default: the bundled model.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write the raw results as JSON here.")]
PromptTokensOpt = Annotated[int, typer.Option("--prompt-tokens", min=1, help="Tokens in the measured prompt.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random-word prompts.")]


def _err() -> Console:
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _arms(arm: list[str], url: list[str], itl_budget_ms: Optional[int] = None):
    from ..loadtest.servers import budget_arm, parse_arms

    try:
        return parse_arms(arm, url, [budget_arm(itl_budget_ms)] if itl_budget_ms is not None else [])
    except MlxcelError as exc:
        fail(str(exc), code=2)


def _run(work: Callable[[], dict], out: Optional[Path]) -> dict:
    try:
        result = work()
    except MlxcelError as exc:  # bad settings, e.g. a prompt the tokenizer cannot build
        fail(str(exc), code=2)
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
        _err().print(f"wrote {out}", markup=False)
    return result


def _print_table(headers, rows) -> None:
    table = Table(*headers, show_lines=False)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


@app.command("admit")
def admit(
    arm: ArmOpt = [],  # noqa: B006 (Typer reads list defaults)
    url: UrlOpt = [],  # noqa: B006
    model: ModelOpt = None,
    streams: Annotated[int, typer.Option("--streams", min=1, help="Decoding streams.")] = 4,
    prompt_tokens: PromptTokensOpt = 2048,
    stream_prompt_tokens: Annotated[int, typer.Option("--stream-prompt-tokens", min=1)] = 32,
    quiet_s: Annotated[float, typer.Option("--quiet-s", min=0.0, help="Decode-only window before admission.")] = 3.0,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 3,
    warmup_rounds: Annotated[
        int, typer.Option("--warmup-rounds", min=0, help="Full rounds run first and discarded.")
    ] = 1,
    tail_tokens: Annotated[int, typer.Option("--tail-tokens", min=1, help="Stream tokens after the admitted first token.")] = 2,
    seed: SeedOpt = 0,
    itl_budget_ms: Annotated[Optional[int], typer.Option(
        "--itl-budget-ms", min=1, help="Add the arm `budget`: a server started with --itl-budget-ms N.")] = None,
    out: OutOpt = None,
) -> None:
    """N streams decode; then one long prompt is admitted. Stream inter-token latency before and
    during its prefill, and its TTFT, per arm and round."""
    from ..loadtest.admit import AdmitConfig, run_admit
    from ..loadtest.report import ADMIT_HEADERS, admit_checks, admit_rows, budget_checks

    arms = _arms(arm, url, itl_budget_ms)
    cfg = AdmitConfig(num_streams=streams, prompt_tokens=prompt_tokens, stream_prompt_tokens=stream_prompt_tokens,
                      quiet_s=quiet_s, rounds=rounds, warmup_rounds=warmup_rounds, tail_tokens=tail_tokens,
                      seed=seed)
    say = lambda m: _err().print(m, markup=False)  # noqa: E731
    result = _run(lambda: run_admit(arms, cfg, model, say), out)
    _print_table(ADMIT_HEADERS, admit_rows(result))
    names = set(result["arms"])
    checks = admit_checks(result) if {"policy", "c512", "c2048"} <= names else []
    if itl_budget_ms is not None and "c512" in names:
        checks += budget_checks(result, itl_budget_ms)
    for check in checks:
        Console().print(f"{check.status:5} {check.name}: {check.detail}", markup=False, highlight=False)


@app.command("ttft")
def ttft(
    arm: ArmOpt = [],  # noqa: B006
    url: UrlOpt = [],  # noqa: B006
    model: ModelOpt = None,
    prompt_tokens: PromptTokensOpt = 2048,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 5,
    parallel: Annotated[Optional[int], typer.Option("--parallel", min=1, help="--parallel of started servers.")] = None,
    null: Annotated[Optional[str], typer.Option(
        "--null", help="The null arm. Default: the first arm whose flags repeat an earlier arm's.")] = None,
    seed: SeedOpt = 0,
    out: OutOpt = None,
) -> None:
    """Single-stream TTFT per arm, rounds interleaved; each arm's median against the null arm's range."""
    from ..loadtest.report import TTFT_HEADERS, ttft_rows
    from ..loadtest.servers import null_arm
    from ..loadtest.ttft import TtftConfig, run_ttft

    arms = _arms(arm, url)
    try:
        null_arm(arms, null)
    except MlxcelError as exc:
        fail(str(exc), code=2)
    cfg = TtftConfig(prompt_tokens=prompt_tokens, rounds=rounds, parallel=parallel, seed=seed)
    say = lambda m: _err().print(m, markup=False)  # noqa: E731
    result = _run(lambda: run_ttft(arms, cfg, model, say, null=null), out)
    _print_table(TTFT_HEADERS, ttft_rows(result))
