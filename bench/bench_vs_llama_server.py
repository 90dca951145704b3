"""Side by side with llama-server: same GGUF, same slots and context, one server at a time,
the same client (mlxcel_py.loadtest) for both.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_vs_llama_server.py [--models A.gguf B.gguf] [--servers ours llama]
        [--slots 4] [--ctx 16384] [--threads 2] [--rounds 2] [--window-s 10] [--json out.json] [--ttft-only]

Per model and server: resident memory (RSS of the server's process tree) after load and after decoding,
decode tok/s at 1 and 4 streams (token frames over a window, greedy, EOS ignored), the time to first
token of a lone 2,048-token prompt, greedy completions of side_by_side.GREEDY_PROMPTS (their first dozen
characters compared across servers), and KV bytes per token. llama-server is $LLAMA_SERVER, else
`llama-server` on PATH (scripts/build_llama_server.sh builds one). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import side_by_side as sbs  # noqa: E402

from mlxcel_py.loadtest.admit import warm_up  # noqa: E402
from mlxcel_py.loadtest.prompts import build_prompt, load_encoder, round_seed  # noqa: E402
from mlxcel_py.loadtest.servers import ManagedServer  # noqa: E402

DECODE_PROMPT_TOKENS = 32
TTFT_TOKENS = 2048
AGREE_CHARS = 12


def measure(name: str, model: str, args: argparse.Namespace) -> dict:
    """Everything for one server on one model; the server is up only inside this call."""
    encode, eos_ids = load_encoder(model)
    spec = sbs.server_spec(name, model, args.slots, args.ctx, args.threads)
    out: dict = {"server": name, "model": Path(model).name, "argv": " ".join(spec.argv)}
    with ManagedServer(spec, health_timeout_s=600) as server:
        pid = server.proc.pid
        out["rss_after_load"] = sbs.settled_rss(pid)
        asyncio.run(warm_up(server.spec.url, encode, eos_ids, 0))
        out["greedy"] = [] if args.ttft_only else sbs.greedy_texts(server.spec.url)
        max_tokens = args.ctx // args.slots - DECODE_PROMPT_TOKENS - 16
        for streams in [] if args.ttft_only else args.streams:
            rates = []
            for r in range(args.rounds):
                prompts = [build_prompt(encode, DECODE_PROMPT_TOKENS, round_seed(0, r, "decode", i))
                           for i in range(streams)]
                rates.append(asyncio.run(sbs.decode_rate(server.spec.url, prompts, eos_ids, args.window_s,
                                                         max_tokens)))
            out[f"decode_{streams}"] = {"median": statistics.median(rates), "rounds": rates}
        lone = [build_prompt(encode, TTFT_TOKENS, round_seed(0, r, "ttft")) for r in range(args.rounds)]
        ttfts = [asyncio.run(sbs.lone_ttft_ms(server.spec.url, p, eos_ids)) for p in lone]
        out["ttft_ms"] = {"median": statistics.median(ttfts), "rounds": ttfts}
        out["rss_after_decoding"] = sbs.resident_mb(pid)
        log = server.log_path.read_text(errors="replace")
        out["kv"] = None if name == "llama" else sbs.ours_kv(server.spec.url, log, model)
        out["load_line"] = sbs.ours_description(log) if name == "ours" else ""
    if name == "llama" and not args.ttft_only:
        out["kv"] = sbs.llama_kv_probe(model, args.slots, args.ctx, args.threads)
    return out


def agreement(results: list[dict]) -> None:
    """Per ours-result: how many greedy prompts agree with llama-server's on the first AGREE_CHARS chars."""
    by = {(r["model"], r["server"]): r for r in results}
    for r in results:
        other = by.get((r["model"], "llama"))
        if r["server"] == "ours" and other is not None and r["greedy"]:
            same = [a[:AGREE_CHARS] == b[:AGREE_CHARS] for a, b in zip(r["greedy"], other["greedy"])]
            r["greedy_agree"] = f"{sum(same)}/{len(same)}"


def table(results: list[dict], streams: list[int]) -> str:
    head = ("| model | server | RSS after load MB | RSS after decoding MB (peak) | "
            + " | ".join(f"decode tok/s {s} stream{'s' if s > 1 else ''}" for s in streams)
            + f" | lone {TTFT_TOKENS}-token TTFT s | KV bytes/token | greedy first {AGREE_CHARS} chars agree |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        rates = " | ".join(f"{r[f'decode_{s}']['median']:.1f}" if f"decode_{s}" in r else "-" for s in streams)
        after = r["rss_after_decoding"]
        kv = r["kv"]
        rows.append(f"| {r['model']} | {r['server']} | {r['rss_after_load']['rss_mb']:.0f} | "
                    f"{after['rss_mb']:.0f} ({after['peak_mb']:.0f}) | {rates} | {r['ttft_ms']['median'] / 1000:.2f} | "
                    f"{kv['bytes_per_token'] if kv else '?'} | {r.get('greedy_agree', '-')} |")
    return "\n".join(rows)


def machine() -> str:
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    flags = open("/proc/cpuinfo").read()
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "amx_tile") if f" {f} " in flags]
    return f"{model}, {os.cpu_count()} cores, {'+'.join(simd)}; {platform.platform()}; load {os.getloadavg()[0]:.2f}"


def main() -> None:
    from mlxcel_py.models import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=[str(default_model_path()), str(ROOT / "tests/fixtures/gguf/llamaq-q4_k_m.gguf")])
    ap.add_argument("--servers", nargs="+", default=["ours", "llama"], choices=["ours", "llama"])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=16384, help="total context (both servers split it over the slots)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--previous", type=Path, help="an earlier run's output: its result lines are kept, not rerun")
    ap.add_argument("--ttft-only", action="store_true", help="memory and TTFT only: no greedy texts, decode or KV probe")
    args = ap.parse_args()
    # A SIGTERM (timeout, Ctrl-C's cousin) unwinds, so the server started here is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(machine(), flush=True)
    results = [json.loads(line) for line in (args.previous.read_text().splitlines() if args.previous else [])
               if line.startswith('{"server"')]
    for model in args.models:
        for name in args.servers:
            kept = [r for r in results if r["model"] == Path(model).name and r["server"] == name]
            if kept and kept[0]["server"] == "llama" and kept[0]["kv"] is None:
                kept[0]["kv"] = sbs.llama_kv_probe(model, args.slots, args.ctx, args.threads)
            if kept:
                continue
            print(f"{Path(model).name}: {name} ...", flush=True)
            results.append(measure(name, model, args))
            print(json.dumps(results[-1]), flush=True)
    agreement(results)
    print(f"\nend: {machine()}\n")
    print(table(results, args.streams))
    for r in results:
        print(f"\n{r['model']} {r['server']}: KV {r['kv']}; {r['load_line']}")
        for prompt, text in zip(sbs.GREEDY_PROMPTS, r["greedy"]):
            print(f"  {prompt!r} -> {text!r}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
