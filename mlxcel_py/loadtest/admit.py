"""Admission under live decode: N streams decode, then one long prompt is admitted.

Per round it records every stream token's arrival and the admitted request's progress frames,
with times in seconds relative to the moment the admission request was sent."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from ..errors import ConfigError
from .client import StreamLog, completion_body, new_client, stream_request
from .prompts import Encode, build_prompt, load_encoder, round_seed
from .servers import Arm, SpecFor, arm_endpoint, mlxcel_spec
from .stats import itls_overlapping, itls_within, summarize, tokens_within

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class AdmitConfig:
    num_streams: int = 4
    prompt_tokens: int = 2048  # the admitted prompt
    stream_prompt_tokens: int = 32
    stream_max_tokens: int = 4096  # streams are closed long before this
    admit_max_tokens: int = 4
    quiet_s: float = 3.0  # decode-only window before the admission
    tail_tokens: int = 2  # tokens each stream must get after the admitted first token
    rounds: int = 3
    warmup_rounds: int = 1  # full rounds run first and discarded (first-round effects on every server)
    seed: int = 0
    start_timeout_s: float = 300.0
    admit_timeout_s: float = 1800.0
    tail_timeout_s: float = 120.0
    pause_s: float = 2.0  # between rounds, so the server has dropped the closed streams

    def __post_init__(self) -> None:
        if self.num_streams < 1 or self.rounds < 1 or self.prompt_tokens < 1:
            raise ConfigError("streams, rounds and prompt tokens must be at least 1")


@dataclass(frozen=True, slots=True)
class RoundPrompts:
    streams: tuple[str, ...]
    admitted: str


def build_round_prompts(encode: Encode, cfg: AdmitConfig) -> list[RoundPrompts]:
    """Every round's prompts (warm-up rounds first): unique per round and stream, identical for every arm."""
    out = []
    for r in range(-cfg.warmup_rounds, cfg.rounds):
        streams = tuple(build_prompt(encode, cfg.stream_prompt_tokens, round_seed(cfg.seed, r, "stream", i))
                        for i in range(cfg.num_streams))
        out.append(RoundPrompts(streams, build_prompt(encode, cfg.prompt_tokens, round_seed(cfg.seed, r, "admit"))))
    return out


def summarize_round(stream_times: Sequence[Sequence[float]], quiet: tuple[float, float],
                    admit: tuple[float, float]) -> list[dict]:
    """Per stream: ITL stats in the quiet window and during the admitted prefill, and the
    tokens it got during the prefill. Windows are (start, end) on the token times' clock."""
    out = []
    for times in stream_times:
        out.append({
            "quiet": summarize(itls_within(times, *quiet)).to_json(),
            "during": summarize(itls_overlapping(times, *admit)).to_json(),
            "tokens_during": tokens_within(times, *admit),
        })
    return out


async def _wait(changed: asyncio.Condition, done: Callable[[], bool], timeout_s: float, what: str,
                strict: bool = True) -> bool:
    try:
        async with changed:
            await asyncio.wait_for(changed.wait_for(done), timeout_s)
        return True
    except asyncio.TimeoutError:
        if strict:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}") from None
        return False


def _failed(logs: Sequence[StreamLog], who: str) -> None:
    for i, log in enumerate(logs):
        if log.error is not None or (log.ended and log.finish_reason != "closed" and not log.token_times):
            raise RuntimeError(f"{who} {i} failed: {log.error or log.finish_reason}")


async def admit_round(base_url: str, cfg: AdmitConfig, prompts: RoundPrompts, eos_ids: frozenset[int],
                      index: int = 0) -> dict:
    """One round against a running server; returns its raw times and per-stream stats."""
    url, changed = base_url + "/v1/completions", asyncio.Condition()
    logs = [StreamLog() for _ in prompts.streams]
    admitted = StreamLog()
    tasks: list[asyncio.Task] = []
    async with new_client() as client:
        try:
            for prompt, log in zip(prompts.streams, logs):
                body = completion_body(prompt, cfg.stream_max_tokens, eos_ids=eos_ids)
                tasks.append(asyncio.create_task(stream_request(client, url, body, log, changed)))
            await _wait(changed, lambda: all(len(g.token_times) >= 2 or g.ended for g in logs),
                        cfg.start_timeout_s, "every stream's first tokens")
            _failed(logs, "stream")
            quiet_start = time.perf_counter()
            await asyncio.sleep(cfg.quiet_s)
            body = completion_body(prompts.admitted, cfg.admit_max_tokens, progress=True, eos_ids=eos_ids)
            tasks.append(asyncio.create_task(stream_request(client, url, body, admitted, changed)))
            await _wait(changed, lambda: admitted.first_token is not None or admitted.ended,
                        cfg.admit_timeout_s, "the admitted request's first token")
            _failed([admitted], "admitted request")
            if admitted.first_token is None:
                raise RuntimeError(f"the admitted request ended without a token ({admitted.finish_reason})")
            end = admitted.first_token
            await _wait(changed, lambda: all(sum(t > end for t in g.token_times) >= cfg.tail_tokens or g.ended
                                             for g in logs), cfg.tail_timeout_s, "the tail", strict=False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return _round_json(index, logs, admitted, quiet_start, cfg.prompt_tokens)


def _round_json(index: int, logs: Sequence[StreamLog], admitted: StreamLog, quiet_start: float,
                prompt_tokens: int) -> dict:
    t0 = admitted.sent or 0.0
    rel = lambda t: round(t - t0, 6)  # noqa: E731
    times = [[rel(t) for t in log.token_times] for log in logs]
    quiet, window = (rel(quiet_start), 0.0), (0.0, rel(admitted.first_token or t0))
    progress = [{"t_ms": round((t - t0) * 1000, 3), **p} for t, p in admitted.progress]
    return {
        "round": index,
        "quiet_window_s": list(quiet),
        "admit_window_s": list(window),
        "admitted": {
            "prompt_tokens": prompt_tokens,
            "server_prompt_tokens": progress[-1].get("total") if progress else None,
            "ttft_ms": round(window[1] * 1000, 3),
            "progress": progress,
        },
        "streams": [{"token_times_s": ts, "finish_reason": log.finish_reason, "error": log.error}
                    for ts, log in zip(times, logs)],
        "stream_stats": summarize_round(times, quiet, window),
    }


async def warm_up(base_url: str, encode: Encode, eos_ids: frozenset[int], seed: int) -> None:
    """One short request, so first-call allocations land outside the measured rounds."""
    log = StreamLog()
    body = completion_body(build_prompt(encode, 16, round_seed(seed, -1, "warmup")), 4, eos_ids=eos_ids)
    async with new_client() as client:
        await stream_request(client, base_url + "/v1/completions", body, log)
    if log.error is not None:
        raise RuntimeError(f"warm-up request failed: {log.error}")


async def admit_rounds(base_url: str, cfg: AdmitConfig, prompts: Sequence[RoundPrompts], encode: Encode,
                       eos_ids: frozenset[int], say: Optional[Say] = None) -> list[dict]:
    """Warm up, then run every round against one server."""
    await warm_up(base_url, encode, eos_ids, cfg.seed)
    rounds = []
    for n, round_prompts in enumerate(prompts):
        i = n - cfg.warmup_rounds  # negative: a warm-up round, run and discarded
        if n:
            await asyncio.sleep(cfg.pause_s)
        result = await admit_round(base_url, cfg, round_prompts, eos_ids, i)
        if say:
            say(("warm-up (discarded) " if i < 0 else "") + round_line(i, result))
        if i >= 0:
            rounds.append(result)
    return rounds


def round_line(index: int, result: dict) -> str:
    """A one-line summary of a round for progress output."""
    stats = result["stream_stats"]
    p95 = [s["during"]["p95_ms"] for s in stats if s["during"]["p95_ms"] is not None]
    quiet = [s["quiet"]["p95_ms"] for s in stats if s["quiet"]["p95_ms"] is not None]
    fmt = lambda v: f"{max(v):.0f} ms" if v else "-"  # noqa: E731
    return (f"round {index}: admitted TTFT {result['admitted']['ttft_ms']:.0f} ms, "
            f"stream ITL p95 quiet {fmt(quiet)}, during admission {fmt(p95)} (worst stream)")


def run_admit(arms: Sequence[Arm], cfg: AdmitConfig, model: Optional[str] = None, say: Say = lambda _m: None,
              spec_for: Optional[SpecFor] = None, encoder: Optional[tuple[Encode, frozenset[int]]] = None) -> dict:
    """Every arm in turn (a server started per arm with --parallel streams+1, or its --url);
    an arm that fails is recorded with its error and the others still run. `encoder` is
    (encode, EOS ids), loaded from `model` when not given."""
    encode, eos_ids = encoder or load_encoder(model)
    prompts = build_round_prompts(encode, cfg)
    spec_for = spec_for or (lambda arm: mlxcel_spec(arm, cfg.num_streams + 1, model))
    result: dict = {"scenario": "admit", "model": model or "default", "config": asdict(cfg), "arms": {}}
    for arm in arms:
        entry: dict = {"flags": list(arm.flags), "url": arm.url}
        say(f"[admit] arm {arm.name}: starting")
        try:
            with arm_endpoint(arm, spec_for) as (url, how):
                entry["server"] = how
                entry["rounds"] = asyncio.run(admit_rounds(url, cfg, prompts, encode, eos_ids,
                                                           lambda m: say(f"[admit] {arm.name} {m}")))
        except (RuntimeError, OSError) as exc:
            entry["error"] = str(exc)
            say(f"[admit] arm {arm.name} failed: {exc}")
        result["arms"][arm.name] = entry
    return result
