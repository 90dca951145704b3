"""Prometheus text exposition for /metrics: server-side latencies plus the engine's counters.

Latencies are measured here, from when events reach the HTTP side, so they include the
worker bridge and match what a client sees (minus the network).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field

from ..engine.stats import EngineStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class Histogram:
    """A cumulative-bucket histogram; updated only on the event loop thread."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    num: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.num += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{_num(bound)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.num}')
        out += [f"{name}_sum {_num(self.total)}", f"{name}_count {self.num}"]
        return out


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class ServerMetrics:
    """What the HTTP side counts: finishes by reason, rejections by status, TTFT and ITL."""

    def __init__(self) -> None:
        self.finished: Counter[str] = Counter()
        self.rejected: Counter[int] = Counter()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def observe_finish(self, reason: str) -> None:
        self.finished[reason] += 1

    def observe_rejection(self, status: int) -> None:
        self.rejected[status] += 1

    def render(self, stats: EngineStats, model_id: str) -> str:
        """The exposition text for the latest engine snapshot."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples])

        family("mlxcel_info", "gauge", "The served model.", [f'mlxcel_info{{model="{_label(model_id)}"}} 1'])
        reasons = sorted(set(self.finished) | {"stop", "length"})
        family("mlxcel_requests_total", "counter", "Finished requests by finish reason.",
               [f'mlxcel_requests_total{{finish_reason="{r}"}} {self.finished[r]}' for r in reasons])
        family("mlxcel_requests_rejected_total", "counter", "Generation requests refused before queueing, by status.",
               [f'mlxcel_requests_rejected_total{{status="{s}"}} {n}' for s, n in sorted(self.rejected.items())])
        for name, value, help_text in (
            ("mlxcel_prompt_tokens_total", stats.num_prompt_tokens, "Prompt tokens run through the model."),
            ("mlxcel_cached_prompt_tokens_total", stats.num_cached_prompt_tokens,
             "Prompt tokens reused from the prompt cache."),
            ("mlxcel_generated_tokens_total", stats.num_generated_tokens, "Tokens generated."),
            ("mlxcel_decode_steps_total", stats.num_decode_steps, "Batched decode steps."),
        ):
            family(name, "counter", help_text, [f"{name} {value}"])
        family("mlxcel_prefill_pieces_total", "counter", "Prefill pieces run, by chunk size in tokens.",
               [f'mlxcel_prefill_pieces_total{{chunk="{c}"}} {n}' for c, n in stats.prefill_pieces_by_chunk])
        for name, value, help_text in (
            ("mlxcel_queue_depth", stats.num_waiting, "Requests waiting for a slot."),
            ("mlxcel_busy_slots", stats.num_busy_slots, "Slots prefilling or decoding."),
            ("mlxcel_slots", len(stats.slots), "Slots (--parallel)."),
            ("mlxcel_slot_context_tokens", stats.slot_context, "KV tokens per slot."),
            ("mlxcel_kv_tokens", stats.num_kv_tokens, "KV tokens in use."),
            ("mlxcel_prompt_cache_entries", stats.prompt_cache_entries, "Prompt cache entries."),
            ("mlxcel_prompt_cache_bytes", stats.prompt_cache_bytes, "Prompt cache size in bytes."),
        ):
            family(name, "gauge", help_text, [f"{name} {value}"])
        family("mlxcel_time_to_first_token_seconds", "histogram",
               "From request arrival to its first token, measured by the server.",
               self.ttft.lines("mlxcel_time_to_first_token_seconds"))
        family("mlxcel_inter_token_latency_seconds", "histogram",
               "Between consecutive tokens of one request, measured by the server.",
               self.itl.lines("mlxcel_inter_token_latency_seconds"))
        return "\n".join(out) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
