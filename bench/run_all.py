"""The whole benchmark set (`make bench`): admission under live decode (ours and the peers),
single-stream TTFT with a null arm, and the scaled 8192-token admission on a random model;
then the results markdown, the raw JSON and the plots in docs/benchmark_results/.

    .venv/bin/python -m bench all                      # everything, on a quiet machine (= make bench)
    .venv/bin/python -m bench all --quick              # smoke test: 1 round, short prompts, temp dir
    .venv/bin/python -m bench all --only admit,ttft    # a subset (steps: admit peers ttft scaled budget)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from bench import peers
from bench.peers import ROOT
from mlxcel_py.loadtest.admit import AdmitConfig, run_admit
from mlxcel_py.loadtest.report import write_results
from mlxcel_py.loadtest.scaled import write_scaled_gguf
from mlxcel_py.loadtest.servers import Arm, budget_arm, parse_arm
from mlxcel_py.loadtest.ttft import TtftConfig, run_ttft

STEPS = ("admit", "peers", "ttft", "scaled", "budget")
BUDGET_MS = 300  # the ITL budget's target: --itl-budget-ms 300 against --prefill-chunk-size 512
OUR_ARMS = [parse_arm("policy="), parse_arm("c512=--prefill-chunk-size 512"),
            parse_arm("c2048=--prefill-chunk-size 2048")]
TTFT_ARMS = [parse_arm("policy="), parse_arm("c2048=--prefill-chunk-size 2048"),
             parse_arm("c2048-null=--prefill-chunk-size 2048")]


@dataclasses.dataclass(frozen=True)
class Plan:
    admit: AdmitConfig
    ttft: TtftConfig
    scaled: AdmitConfig
    budget_prompts: tuple[int, ...]  # the admitted prompt lengths of the budget step


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        plan = Plan(AdmitConfig(rounds=1, warmup_rounds=0, prompt_tokens=256, stream_prompt_tokens=16, quiet_s=1.0, pause_s=0.5),
                    TtftConfig(prompt_tokens=256, rounds=2),
                    AdmitConfig(rounds=1, warmup_rounds=0, prompt_tokens=1024, stream_prompt_tokens=16, quiet_s=1.0, pause_s=0.5),
                    (256,))
    else:
        plan = Plan(AdmitConfig(), TtftConfig(rounds=5), AdmitConfig(prompt_tokens=8192), (2048, 6144))
    if args.rounds:
        plan = Plan(*(dataclasses.replace(c, rounds=args.rounds) for c in (plan.admit, plan.ttft, plan.scaled)),
                    plan.budget_prompts)
    return plan


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "commit": commit.stdout.strip() or None}


def step_admit(plan: Plan) -> list[dict]:
    result = run_admit(OUR_ARMS, plan.admit, None, say)
    return [{"id": "admit", "kind": "admit", "checks": True, "result": result,
             "title": "Admission under live decode, default model (mlxcel-py serve)"}]


def step_peers(plan: Plan, status: list[dict]) -> list[dict]:
    arms, step_of, lines = peers.peer_arms()
    status += lines
    runs = []
    if arms:
        model_dir = peers.ensure_converted()
        spec_for = lambda arm: peers.mlx_lm_spec(arm.name, model_dir, step_of[arm.name])  # noqa: E731
        result = run_admit(arms, plan.admit, None, say, spec_for=spec_for)
        result["model"] = f"{model_dir} (dense float32 conversion of the default model)"
        runs.append({"id": "admit-mlx-lm", "kind": "admit", "result": result,
                     "title": "Admission under live decode, mlx_lm.server (dense float32)"})
    binary = peers.llama_server_binary()
    if binary:
        from mlxcel_py.models import default_model_path

        parallel = plan.admit.num_streams + 1
        spec_for = lambda arm: peers.llama_server_spec(arm.name, binary, default_model_path(),  # noqa: E731
                                                       int(arm.name.removeprefix("llama-b")), parallel)
        result = run_admit([Arm("llama-b2048"), Arm("llama-b512")], plan.admit, None, say, spec_for=spec_for)
        result["model"] = f"{default_model_path()} (Q4_1 GGUF)"
        status.append({"name": "llama-server", "status": "run", "note": binary})
        runs.append({"id": "admit-llama", "kind": "admit", "result": result,
                     "title": "Admission under live decode, llama-server"})
    return runs


def step_ttft(plan: Plan) -> list[dict]:
    result = run_ttft(TTFT_ARMS, plan.ttft, None, say)
    return [{"id": "ttft", "kind": "ttft", "checks": True, "result": result,
             "title": "Single-stream TTFT through the server path, default model"}]


def step_scaled(plan: Plan) -> list[dict]:
    model = str(write_scaled_gguf(peers.CACHE / "bench-scaled-random.gguf"))
    result = run_admit(OUR_ARMS, plan.scaled, model, say)
    return [{"id": "admit-scaled", "kind": "admit", "checks": True, "result": result,
             "title": f"Admission of {plan.scaled.prompt_tokens} tokens, scaled random model"}]


def step_budget(plan: Plan) -> list[dict]:
    runs = []
    for tokens in plan.budget_prompts:
        config = dataclasses.replace(plan.admit, prompt_tokens=tokens)
        result = run_admit([parse_arm("c512=--prefill-chunk-size 512"), budget_arm(BUDGET_MS)], config, None, say)
        runs.append({"id": f"admit-budget-{tokens}", "kind": "admit", "checks": True, "itl_budget_ms": BUDGET_MS,
                     "result": result, "title": f"ITL budget {BUDGET_MS} ms, {tokens}-token admission, default model"})
    return runs


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round, short prompts; results in a temp dir")
    p.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps of {', '.join(STEPS)}")
    p.add_argument("--rounds", type=int, help="override every scenario's rounds")
    p.add_argument("--name", help="results file name (default: bench, or quick with --quick)")
    p.add_argument("--out-dir", type=Path, help="default: docs/benchmark_results (a temp dir with --quick)")
    args = p.parse_args()
    unknown = set(args.only.split(",")) - set(STEPS)
    if unknown:
        p.error(f"unknown steps {', '.join(sorted(unknown))} (choose from {', '.join(STEPS)})")
    return args


def main() -> None:
    args = parse_args()
    plan, steps = make_plan(args), args.only.split(",")
    name = args.name or ("quick" if args.quick else "bench")
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="mlxcel-bench-")) if args.quick
                               else ROOT / "docs" / "benchmark_results")
    date = datetime.date.today().isoformat()
    results = {"name": name, "date": date, "stem": f"{name}-{date}", "machine": machine(), "runs": [], "peers": []}
    for step in STEPS:
        if step not in steps:
            continue
        say(f"== {step}")
        if step == "peers":
            results["runs"] += step_peers(plan, results["peers"])
        else:
            step_fn = {"admit": step_admit, "ttft": step_ttft, "scaled": step_scaled, "budget": step_budget}[step]
            results["runs"] += step_fn(plan)
        paths = write_results(results, out_dir, results["stem"])  # after every step: partial results survive
    say("wrote " + ", ".join(str(p) for p in paths))

