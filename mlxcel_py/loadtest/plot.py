"""PNG of an admission run: each stream's token arrivals around the admission, one panel per arm."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def median_round(rounds: list[dict]) -> dict:
    """The round whose admitted TTFT is the median (the lower one of an even count)."""
    ordered = sorted(rounds, key=lambda r: r["admitted"]["ttft_ms"])
    return ordered[(len(ordered) - 1) // 2]


def plot_admission(result: dict, path: Path, title: Optional[str] = None) -> Path:
    """Token timelines (x: seconds since the admission was sent); dashed line: admission sent,
    red line: the admitted request's first token; squares on the bottom row: progress frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [(name, a) for name, a in result["arms"].items() if a.get("rounds")]
    fig, axes = plt.subplots(len(arms), 1, figsize=(11, 1.2 + 1.6 * len(arms)), squeeze=False, sharex=True)
    x_max = 0.0
    for ax, (name, arm) in zip(axes[:, 0], arms):
        rnd = median_round(arm["rounds"])
        x_max = max(x_max, _panel(ax, name, rnd))
    axes[0, 0].legend(loc="upper right", fontsize=7, framealpha=0.9)
    # Some quiet decode for context, scaled to the admission so the stall stays readable.
    left = min(result["config"]["quiet_s"], max(0.3 * x_max, 0.2))
    axes[-1, 0].set_xlim(-left, x_max)
    axes[-1, 0].set_xlabel("seconds since the admission request was sent")
    fig.suptitle(title or "Stream token arrivals around the admission")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _panel(ax, name: str, rnd: dict) -> float:
    ttft_s = rnd["admitted"]["ttft_ms"] / 1000
    last = ttft_s
    for i, stream in enumerate(rnd["streams"]):
        times = stream["token_times_s"]
        ax.plot(times, [i] * len(times), "|", markersize=9, color="tab:blue", label="stream token" if i == 0 else None)
        last = max([last] + times)
    pieces = [p["t_ms"] / 1000 for p in rnd["admitted"]["progress"]]
    ax.plot(pieces, [-1] * len(pieces), "s", markersize=4, color="tab:orange", label="prefill progress frame")
    ax.axvline(0.0, linestyle="--", color="gray", label="admission sent")
    ax.axvline(ttft_s, color="tab:red", label="admitted first token")
    labels = ["admitted"] + [f"stream {i}" for i in range(len(rnd["streams"]))]
    ax.set_yticks(range(-1, len(rnd["streams"])), labels, fontsize=7)
    ax.set_ylim(-1.7, len(rnd["streams"]) - 0.3)
    ax.set_title(f"{name} (round {rnd['round']}, admitted TTFT {rnd['admitted']['ttft_ms'] / 1000:.2f} s)",
                 fontsize=9, loc="left")
    return min(last, ttft_s * 1.5 + 1.0)
