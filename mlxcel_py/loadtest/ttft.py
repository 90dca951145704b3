"""Single-stream time to first token through the server path, arms interleaved round by round.

One server per arm stays up for the whole run (an idle server uses no CPU). A null arm (the
same flags as another arm) shows the run-to-run noise a difference must exceed."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Optional, Sequence

from ..errors import ConfigError
from .admit import warm_up
from .client import StreamLog, completion_body, new_client, stream_request
from .prompts import Encode, build_prompt, load_encoder, round_seed
from .servers import Arm, SpecFor, arm_endpoint, mlxcel_spec, null_arm
from .stats import min_med_max

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TtftConfig:
    prompt_tokens: int = 2048
    rounds: int = 5
    max_tokens: int = 1
    parallel: Optional[int] = None  # --parallel for started servers (None: serve's default)
    seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.prompt_tokens < 1:
            raise ConfigError("rounds and prompt tokens must be at least 1")


def arm_order(names: Sequence[str], round_index: int) -> list[str]:
    """The arms rotated by one per round, so no arm always runs first (or right after another)."""
    if not names:
        return []
    k = round_index % len(names)
    return list(names[k:]) + list(names[:k])


def null_verdicts(ttfts_ms: Mapping[str, Sequence[float]], null: Optional[str]) -> dict[str, dict]:
    """Per arm: min/median/max, and whether its median lies inside the null arm's [min, max]."""
    low = high = None
    if null is not None and ttfts_ms.get(null):
        low, _, high = min_med_max(ttfts_ms[null])
    out = {}
    for name, values in ttfts_ms.items():
        lo, med, hi = min_med_max(values)
        inside = None if low is None or med is None else bool(low <= med <= high)
        out[name] = {"n": len(values), "min_ms": lo, "median_ms": med, "max_ms": hi, "inside_null_range": inside}
    return out


async def measure_ttft(base_url: str, prompt: str, cfg: TtftConfig, eos_ids: frozenset[int]) -> dict:
    """One streamed request; TTFT is its first token frame's arrival minus its send time."""
    log = StreamLog()
    body = completion_body(prompt, cfg.max_tokens, progress=True, eos_ids=eos_ids)
    async with new_client() as client:
        await asyncio.wait_for(stream_request(client, base_url + "/v1/completions", body, log), cfg.timeout_s)
    if log.first_token is None or log.sent is None:
        raise RuntimeError(f"no token came back: {log.error or log.finish_reason}")
    progress = [{"t_ms": round((t - log.sent) * 1000, 3), **p} for t, p in log.progress]
    return {"ttft_ms": round((log.first_token - log.sent) * 1000, 3), "progress": progress,
            "server_prompt_tokens": progress[-1].get("total") if progress else None}


def run_ttft(arms: Sequence[Arm], cfg: TtftConfig, model: Optional[str] = None, say: Say = lambda _m: None,
             spec_for: Optional[SpecFor] = None, null: Optional[str] = None,
             encoder: Optional[tuple[Encode, frozenset[int]]] = None) -> dict:
    """Start (or reach) every arm, then measure round by round in rotating arm order.

    `encoder` is (encode, EOS ids), loaded from `model` when not given."""
    encode, eos_ids = encoder or load_encoder(model)
    prompts = [build_prompt(encode, cfg.prompt_tokens, round_seed(cfg.seed, r, "ttft")) for r in range(cfg.rounds)]
    spec_for = spec_for or (lambda arm: mlxcel_spec(arm, cfg.parallel, model))
    null_name = (null_arm(arms, null) or Arm("")).name or None
    entries: dict[str, dict] = {a.name: {"flags": list(a.flags), "url": a.url, "rounds": []} for a in arms}
    with contextlib.ExitStack() as stack:
        urls = _start_all(arms, stack, spec_for, entries, encode, eos_ids, cfg, say)
        for r in range(cfg.rounds):
            for name in arm_order(list(urls), r):
                try:
                    got = asyncio.run(measure_ttft(urls[name], prompts[r], cfg, eos_ids))
                except (RuntimeError, OSError, asyncio.TimeoutError) as exc:
                    got = {"ttft_ms": None, "error": str(exc) or type(exc).__name__}
                entries[name]["rounds"].append({"round": r, **got})
                say(f"[ttft] round {r} {name}: " + (f"{got['ttft_ms']:.0f} ms" if got["ttft_ms"] else got["error"]))
    ttfts = {n: [x["ttft_ms"] for x in e["rounds"] if x.get("ttft_ms") is not None] for n, e in entries.items()}
    return {"scenario": "ttft", "model": model or "default", "config": asdict(cfg), "null_arm": null_name,
            "arms": entries, "summary": null_verdicts(ttfts, null_name)}


def _start_all(arms: Sequence[Arm], stack: contextlib.ExitStack, spec_for: SpecFor, entries: dict,
               encode, eos_ids: frozenset[int], cfg: TtftConfig, say: Say) -> dict[str, str]:
    urls = {}
    for arm in arms:
        say(f"[ttft] arm {arm.name}: starting")
        try:
            url, how = stack.enter_context(arm_endpoint(arm, spec_for))
            asyncio.run(warm_up(url, encode, eos_ids, cfg.seed))
        except (RuntimeError, OSError) as exc:
            entries[arm.name]["error"] = str(exc)
            say(f"[ttft] arm {arm.name} failed: {exc}")
            continue
        entries[arm.name]["server"] = how
        urls[arm.name] = url
    return urls
