"""Results tables, acceptance checks and the written files, from synthetic benchmark JSON."""

from __future__ import annotations

from mlxcel_py.loadtest.admit import summarize_round
from mlxcel_py.loadtest.report import (
    admit_checks, admit_rows, budget_checks, render_markdown, run_checks, ttft_check, ttft_rows, write_results,
)
from mlxcel_py.loadtest.ttft import null_verdicts


def fake_round(index: int, stall_s: float, ttft_s: float = 1.0) -> dict:
    """Two streams at 50 ms, each stalled by `stall_s` once during the prefill [0, ttft_s]."""
    times = [-0.2, -0.15, -0.1, -0.05, 0.0]
    t = 0.0
    while t < ttft_s + 0.2:
        t += stall_s if t < ttft_s else 0.05
        times.append(round(t, 6))
    progress = [{"t_ms": 500.0, "total": 2048, "cache": 0, "processed": 512, "time_ms": 1.0},
                {"t_ms": 1000.0, "total": 2048, "cache": 0, "processed": 2048, "time_ms": 2.0}]
    quiet, window = (-0.2, 0.0), (0.0, ttft_s)
    return {"round": index, "quiet_window_s": list(quiet), "admit_window_s": list(window),
            "admitted": {"prompt_tokens": 2048, "server_prompt_tokens": 2048, "ttft_ms": ttft_s * 1000,
                         "progress": progress},
            "streams": [{"token_times_s": times, "finish_reason": "closed", "error": None}] * 2,
            "stream_stats": summarize_round([times, times], quiet, window)}


def admit_result(policy_stall: float) -> dict:
    arms = {
        "policy": {"flags": [], "url": None, "server": "serve", "rounds": [fake_round(0, policy_stall)]},
        "c512": {"flags": ["--prefill-chunk-size", "512"], "url": None, "rounds": [fake_round(0, 0.25)]},
        "c2048": {"flags": ["--prefill-chunk-size", "2048"], "url": None, "rounds": [fake_round(0, 1.0)]},
        "broken": {"flags": [], "url": None, "error": "server exited with 1\ntraceback"},
    }
    cfg = {"num_streams": 2, "prompt_tokens": 2048, "quiet_s": 0.2, "rounds": 1}
    return {"scenario": "admit", "model": "default", "config": cfg, "arms": arms}


def test_admit_rows():
    rows = admit_rows(admit_result(0.25))
    assert rows[0] == ["policy", "0", "50.0", "250", "250", "4, 4", "1000", "512+1536"]
    assert rows[-1][:3] == ["broken", "-", "not run: server exited with 1"]


def test_admit_checks_pass_and_fail():
    assert [c.status for c in admit_checks(admit_result(0.25))] == ["pass", "pass"]
    assert [c.status for c in admit_checks(admit_result(0.5))] == ["fail", "pass"]
    missing = admit_result(0.25)
    del missing["arms"]["c512"]["rounds"]
    assert admit_checks(missing)[0].status == "n/a"


def budget_result(stalls: list[float], ttfts: list[float]) -> dict:
    result = admit_result(0.25)
    result["arms"]["c512"]["rounds"] = [fake_round(0, 0.25, 1.0), fake_round(1, 0.25, 1.2), fake_round(2, 0.25, 3.0)]
    result["arms"]["budget"] = {"flags": ["--itl-budget-ms", "300"], "url": None,
                                "rounds": [fake_round(i, s, t) for i, (s, t) in enumerate(zip(stalls, ttfts))]}
    return result


def test_budget_checks():
    # p95 during admission is the stall; the 512 arm's median TTFT is 1200 ms, so the limit is 1800 ms.
    checks = budget_checks(budget_result([0.3, 0.38, 0.2], [1.5, 1.8, 9.0]), 300)
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("budget p95 during admission <= 1.3 x 300 ms (every round)", "pass", "200..380 ms vs limit 390 ms"),
        ("budget admitted TTFT <= 1.5 x c512 (medians over rounds)", "pass",
         "1800 ms vs c512 1200 ms (ratio 1.50)"),
    ]
    checks = budget_checks(budget_result([0.3, 0.4, 0.2], [1.5, 1.9, 1.9]), 300)
    assert [c.status for c in checks] == ["fail", "fail"]
    assert [c.status for c in budget_checks(admit_result(0.25), 300)] == ["n/a", "n/a"]


def test_a_run_with_a_budget_asks_for_its_checks():
    run = {"kind": "admit", "checks": True, "result": budget_result([0.3], [1.5]), "itl_budget_ms": 300}
    assert [c.status for c in run_checks(run)] == ["pass", "pass", "pass", "pass"]
    del run["itl_budget_ms"]
    assert len(run_checks(run)) == 2
    del run["result"]["arms"]["policy"]  # bench/run_all.py's budget step: c512 and budget only
    run["itl_budget_ms"] = 300
    assert [c.name.split()[0] for c in run_checks(run)] == ["budget", "budget"]


def ttft_result() -> dict:
    values = {"c2048": [100.0, 110.0], "policy": [104.0, 106.0], "c2048-null": [101.0, 112.0]}
    arms = {n: {"flags": ["--prefill-chunk-size", "2048"] if n != "policy" else [], "url": None,
                "rounds": [{"round": i, "ttft_ms": v} for i, v in enumerate(vs)]} for n, vs in values.items()}
    return {"scenario": "ttft", "model": "default", "config": {"prompt_tokens": 2048, "rounds": 2},
            "null_arm": "c2048-null", "arms": arms, "summary": null_verdicts(values, "c2048-null")}


def test_ttft_rows_and_check():
    rows = ttft_rows(ttft_result())
    assert rows[1] == ["policy", "(none)", "104", "105", "106", "yes", "104, 106"]
    check = ttft_check(ttft_result())
    assert check.status == "pass" and "105" in check.detail


def results() -> dict:
    return {"name": "bench", "date": "2026-11-29", "stem": "bench-2026-11-29",
            "machine": {"platform": "Linux", "cpus": 2},
            "runs": [{"id": "admit", "title": "Admission", "kind": "admit", "checks": True,
                      "result": admit_result(0.25)},
                     {"id": "ttft", "title": "TTFT", "kind": "ttft", "checks": True, "result": ttft_result()}],
            "peers": [{"name": "llama-server", "status": "not run", "note": "not installed on this machine"}]}


def test_markdown_has_checks_tables_and_not_run_peers():
    md = render_markdown(results())
    assert "## Acceptance checks" in md and md.count("| pass |") == 3
    assert "| llama-server | not run | not installed on this machine |" in md
    assert "## Admission" in md and "## TTFT" in md


def test_write_results_files(tmp_path):
    paths = write_results(results(), tmp_path, "bench-2026-11-29")
    assert sorted(p.name for p in paths) == ["bench-2026-11-29-admit.png", "bench-2026-11-29.json",
                                             "bench-2026-11-29.md"]
    assert (tmp_path / "bench-2026-11-29-admit.png").read_bytes()[:4] == b"\x89PNG"
    assert "![Admission](bench-2026-11-29-admit.png)" in (tmp_path / "bench-2026-11-29.md").read_text()
