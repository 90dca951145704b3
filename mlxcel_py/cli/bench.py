"""`mlxcel-py bench admit|ttft`: serving benchmarks against servers this command starts
(`--arm NAME="serve flags"`) or already running (`--url NAME=http://host:port`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Sequence

import typer
from rich.console import Console
from rich.table import Table

from ..errors import MlxcelError
from ..flags import AdmitFlags, TtftFlags
from .common import fail
from .parse import parses

app = typer.Typer(help="Serving benchmarks: admission under live decode, single-stream TTFT.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _err() -> Console:
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _arms(arm: Sequence[str], url: Sequence[str], itl_budget_ms: Optional[int] = None):
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
@parses(AdmitFlags)
def admit(flags: AdmitFlags) -> None:
    """N streams decode; then one long prompt is admitted. Stream inter-token latency before and
    during its prefill, and its TTFT, per arm and round."""
    from ..loadtest.admit import AdmitConfig, run_admit
    from ..loadtest.report import ADMIT_HEADERS, admit_checks, admit_rows, budget_checks

    f, budget = flags, flags.itl_budget_ms
    arms = _arms(f.targets.arm, f.targets.url, budget)
    cfg = AdmitConfig(num_streams=f.streams, prompt_tokens=f.prompt_tokens,
                      stream_prompt_tokens=f.stream_prompt_tokens, quiet_s=f.quiet_s, rounds=f.rounds,
                      warmup_rounds=f.warmup_rounds, tail_tokens=f.tail_tokens, seed=f.seed)
    say = lambda m: _err().print(m, markup=False)  # noqa: E731
    result = _run(lambda: run_admit(arms, cfg, f.targets.model, say), f.out)
    _print_table(ADMIT_HEADERS, admit_rows(result))
    names = set(result["arms"])
    checks = admit_checks(result) if {"policy", "c512", "c2048"} <= names else []
    if budget is not None and "c512" in names:
        checks += budget_checks(result, budget)
    for check in checks:
        Console().print(f"{check.status:5} {check.name}: {check.detail}", markup=False, highlight=False)


@app.command("ttft")
@parses(TtftFlags)
def ttft(flags: TtftFlags) -> None:
    """Single-stream TTFT per arm, rounds interleaved; each arm's median against the null arm's range."""
    from ..loadtest.report import TTFT_HEADERS, ttft_rows
    from ..loadtest.servers import null_arm
    from ..loadtest.ttft import TtftConfig, run_ttft

    arms = _arms(flags.targets.arm, flags.targets.url)
    try:
        null_arm(arms, flags.null)
    except MlxcelError as exc:
        fail(str(exc), code=2)
    cfg = TtftConfig(prompt_tokens=flags.prompt_tokens, rounds=flags.rounds, parallel=flags.parallel, seed=flags.seed)
    say = lambda m: _err().print(m, markup=False)  # noqa: E731
    result = _run(lambda: run_ttft(arms, cfg, flags.targets.model, say, null=flags.null), flags.out)
    _print_table(TTFT_HEADERS, ttft_rows(result))
