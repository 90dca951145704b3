"""Benchmark JSON -> a markdown results file, the acceptance checks, and (plot.py) a PNG.

A run that did not happen (a peer missing on the machine, an arm that failed) is written as
"not run" with its reason; nothing is filled in."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

CONTENDED_SLACK = 1.10  # policy p95 during admission may exceed the 512 arm's by at most 10 %
ITL_SLACK = 1.3  # the budget's promise: with --itl-budget-ms B, stream ITL p95 during admission <= 1.3 B
TTFT_SLACK = 1.5  # ... and the admitted TTFT <= 1.5 x the explicit-512 arm's


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # "pass" | "fail" | "n/a"
    detail: str


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _span(values: Sequence[Optional[float]]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return _ms(lo) if _ms(lo) == _ms(hi) else f"{_ms(lo)}..{_ms(hi)}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def stream_values(rnd: dict, window: str, key: str) -> list[Optional[float]]:
    """One statistic (e.g. "p95_ms") of every stream in one round's window ("quiet"/"during")."""
    return [s[window][key] for s in rnd["stream_stats"]]


def worst(rnd: dict, window: str, key: str) -> Optional[float]:
    """The worst stream's value in a round (None when no stream had an interval)."""
    vals = [v for v in stream_values(rnd, window, key) if v is not None]
    return max(vals) if vals else None


def admit_rows(result: dict) -> list[list[str]]:
    """Per arm per round: stream ITL p95 quiet / during, mean during (ranges over streams),
    tokens each stream got during the prefill, admitted TTFT, and the prefill pieces seen."""
    rows = []
    for name, arm in result["arms"].items():
        if "rounds" not in arm:
            rows.append([name, "-", "not run: " + arm.get("error", "?").splitlines()[0]] + ["-"] * 5)
            continue
        for rnd in arm["rounds"]:
            progress = rnd["admitted"]["progress"]
            pieces = _pieces([p.get("processed") for p in progress])
            rows.append([
                name, str(rnd["round"]), _span(stream_values(rnd, "quiet", "p95_ms")),
                _span(stream_values(rnd, "during", "p95_ms")), _span(stream_values(rnd, "during", "mean_ms")),
                ", ".join(str(s["tokens_during"]) for s in rnd["stream_stats"]),
                _ms(rnd["admitted"]["ttft_ms"]), pieces,
            ])
    return rows


def _pieces(processed: Sequence[Optional[int]]) -> str:
    """Progress frames' processed counts as piece sizes, e.g. "512+512+1024"."""
    sizes, last = [], 0
    for p in processed:
        if p is None or p <= last:
            continue
        sizes.append(p - last)
        last = p
    return "+".join(map(str, sizes)) if sizes else "-"


ADMIT_HEADERS = ("arm", "round", "stream ITL p95 quiet (ms)", "stream ITL p95 during admission (ms)",
                 "stream ITL mean during admission (ms)", "tokens per stream during prefill",
                 "admitted TTFT (ms)", "prefill pieces")


def ttft_rows(result: dict) -> list[list[str]]:
    rows = []
    for name, s in result["summary"].items():
        arm = result["arms"][name]
        if "error" in arm and not s["n"]:
            rows.append([name, " ".join(arm["flags"]) or "(none)", "not run", "-", "-", "-", "-"])
            continue
        inside = {None: "-", True: "yes", False: "no"}[s["inside_null_range"]]
        rounds = ", ".join(_ms(r.get("ttft_ms")) for r in arm["rounds"])
        rows.append([name, " ".join(arm["flags"]) or arm.get("url") or "(none)", _ms(s["min_ms"]),
                     _ms(s["median_ms"]), _ms(s["max_ms"]), inside, rounds])
    return rows


TTFT_HEADERS = ("arm", "flags", "min (ms)", "median (ms)", "max (ms)", "median inside null range", "rounds (ms)")


def _round_worsts(result: dict, arm: str) -> Optional[list[float]]:
    entry = result["arms"].get(arm)
    if not entry or "rounds" not in entry:
        return None
    vals = [worst(r, "during", "p95_ms") for r in entry["rounds"]]
    return None if any(v is None for v in vals) else vals  # type: ignore[return-value]


def admit_checks(result: dict, policy: str = "policy", c512: str = "c512", c2048: str = "c2048") -> list[Check]:
    """Policy p95 during admission (worst stream, every round) <= 1.10 x the 512 arm's worst
    round, and below the 2048 arm's best round."""
    pol, low, high = _round_worsts(result, policy), _round_worsts(result, c512), _round_worsts(result, c2048)
    out = []
    name = f"{policy} p95 during admission <= {CONTENDED_SLACK:.2f} x {c512} (every round)"
    if pol is None or low is None:
        out.append(Check(name, "n/a", "an arm did not run"))
    else:
        limit = CONTENDED_SLACK * max(low)
        ok = all(v <= limit for v in pol)
        out.append(Check(name, "pass" if ok else "fail", f"{_span(pol)} ms vs limit {_ms(limit)} ms"))
    name = f"{policy} p95 during admission < {c2048} (every round)"
    if pol is None or high is None:
        out.append(Check(name, "n/a", "an arm did not run"))
    else:
        ok = max(pol) < min(high)
        out.append(Check(name, "pass" if ok else "fail", f"{_span(pol)} ms vs {c2048} {_span(high)} ms"))
    return out


def budget_checks(result: dict, budget_ms: int, arm: str = "budget", c512: str = "c512") -> list[Check]:
    """The worst stream's ITL p95 during admission <= 1.3 x the budget in every round, and the
    arm's median admitted TTFT <= 1.5 x the 512 arm's median."""
    pol, limit = _round_worsts(result, arm), ITL_SLACK * budget_ms
    name = f"{arm} p95 during admission <= {ITL_SLACK:g} x {budget_ms} ms (every round)"
    if pol is None:
        out = [Check(name, "n/a", "the arm did not run")]
    else:
        ok = all(v <= limit for v in pol)
        out = [Check(name, "pass" if ok else "fail", f"{_span(pol)} ms vs limit {_ms(limit)} ms")]
    name = f"{arm} admitted TTFT <= {TTFT_SLACK:g} x {c512} (medians over rounds)"
    ours, theirs = _median_ttft(result, arm), _median_ttft(result, c512)
    if ours is None or theirs is None:
        return out + [Check(name, "n/a", "an arm did not run")]
    ok = ours <= TTFT_SLACK * theirs
    return out + [Check(name, "pass" if ok else "fail",
                        f"{_ms(ours)} ms vs {c512} {_ms(theirs)} ms (ratio {ours / theirs:.2f})")]


def _median_ttft(result: dict, arm: str) -> Optional[float]:
    entry = result["arms"].get(arm)
    if not entry or not entry.get("rounds"):
        return None
    return statistics.median(r["admitted"]["ttft_ms"] for r in entry["rounds"])


def ttft_check(result: dict, arm: str = "policy") -> Check:
    """The arm's median TTFT lies inside the null arm's [min, max]."""
    null = result.get("null_arm")
    name = f"TTFT {arm} median inside the null arm's range ({null or 'no null arm'})"
    s = result["summary"].get(arm)
    if not s or not null or s["inside_null_range"] is None:
        return Check(name, "n/a", "an arm did not run")
    n = result["summary"][null]
    detail = f"median {_ms(s['median_ms'])} ms vs [{_ms(n['min_ms'])}, {_ms(n['max_ms'])}] ms"
    return Check(name, "pass" if s["inside_null_range"] else "fail", detail)


def run_checks(run: dict) -> list[Check]:
    """The acceptance checks a run asks for (`"checks": true`): admission or TTFT ones."""
    if not run.get("checks"):
        return []
    if run["kind"] == "admit":
        result, budget = run["result"], run.get("itl_budget_ms")
        if not budget:
            return admit_checks(result)
        # a run with a budget arm asks for its checks too; the policy's only where it ran
        return (admit_checks(result) if "policy" in result["arms"] else []) + budget_checks(result, budget)
    return [ttft_check(run["result"])]


def _config_line(result: dict) -> str:
    cfg = result["config"]
    if result["scenario"] == "admit":
        return (f"{cfg['num_streams']} streams, {cfg['prompt_tokens']}-token admitted prompt, "
                f"{cfg['quiet_s']:g} s quiet window, {cfg['rounds']} rounds, model {result['model']}")
    return (f"{cfg['prompt_tokens']}-token prompt, {cfg['rounds']} rounds (arms interleaved), "
            f"null arm {result.get('null_arm') or '-'}, model {result['model']}")


def _run_section(run: dict) -> list[str]:
    result = run["result"]
    out = [f"## {run['title']}", "", _config_line(result), ""]
    if result["scenario"] == "admit":
        out.append(md_table(ADMIT_HEADERS, admit_rows(result)))
    else:
        out.append(md_table(TTFT_HEADERS, ttft_rows(result)))
    servers = [f"- {n}: `{a['server']}`" for n, a in result["arms"].items() if a.get("server")]
    out += ["", "Servers:", *servers] if servers else []
    if run.get("plot"):
        out += ["", f"![{run['title']}]({run['plot']})"]
    return out + [""]


def render_markdown(results: dict) -> str:
    """The whole results file: machine, checks, one section per run, peers."""
    m = results.get("machine", {})
    out = [f"# {results['name']} ({results['date']})", "",
           f"Machine: {m.get('platform', '?')}, {m.get('cpus', '?')} CPUs, load average at start "
           f"{m.get('load_average_at_start', '?')}; commit {m.get('commit') or '?'}. "
           f"Raw data: `{results['stem']}.json`.", ""]
    checks = [(run["title"], c) for run in results["runs"] for c in run_checks(run)]
    if checks:
        rows = [[t, c.name, c.status, c.detail] for t, c in checks]
        out += ["## Acceptance checks", "", md_table(("run", "check", "result", "detail"), rows), ""]
    for run in results["runs"]:
        out += _run_section(run)
    if results.get("peers"):
        rows = [[p["name"], p["status"], p.get("note", "")] for p in results["peers"]]
        out += ["## Peers", "", md_table(("peer", "status", "note"), rows), ""]
    return "\n".join(out)


def write_results(results: dict, out_dir: Path, stem: str) -> list[Path]:
    """<stem>.md, <stem>.json (raw) and <stem>-<run>.png per admission run, in out_dir."""
    from .plot import plot_admission

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, run in enumerate(results["runs"]):
        if run["kind"] == "admit" and any("rounds" in a for a in run["result"]["arms"].values()):
            png = out_dir / f"{stem}-{run['id']}.png"
            plot_admission(run["result"], png, title=run["title"])
            run["plot"] = png.name
            written.append(png)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=1))
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(render_markdown(results))
    return [md_path, json_path] + written
