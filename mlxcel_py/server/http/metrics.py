"""/metrics through prometheus-client, on a registry of the app's own (no process globals).

Latencies are measured here, from when events reach the HTTP side, so they include the
worker bridge and match what a client sees (minus the network). Engine counters and
gauges are read from the worker's latest snapshot at scrape time.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...engine import EngineStats
from ...engine import BudgetStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTERS = (
    ("mlxcel_prompt_tokens", "num_prompt_tokens", "Prompt tokens run through the model."),
    ("mlxcel_cached_prompt_tokens", "num_cached_prompt_tokens", "Prompt tokens reused from the prompt cache."),
    ("mlxcel_generated_tokens", "num_generated_tokens", "Tokens generated."),
    ("mlxcel_decode_steps", "num_decode_steps", "Batched decode steps."),
    ("mlxcel_draft_tokens", "num_draft_tokens", "Prompt-lookup draft tokens verified (--lookup-ngram)."),
    ("mlxcel_draft_accepted_tokens", "num_draft_accepted", "Draft tokens accepted."),
    ("mlxcel_context_shifts", "num_context_shifts", "Context shifts (--context-shift)."),
    ("mlxcel_context_shift_discarded_tokens", "num_discarded_tokens", "KV tokens the context shifts discarded."),
)
_GAUGES = (
    ("mlxcel_queue_depth", lambda s: s.num_waiting, "Requests waiting for a slot."),
    ("mlxcel_busy_slots", lambda s: s.num_busy_slots, "Slots prefilling or decoding."),
    ("mlxcel_slots", lambda s: len(s.slots), "Slots (--parallel)."),
    ("mlxcel_slot_context_tokens", lambda s: s.slot_context, "KV tokens per slot."),
    ("mlxcel_kv_tokens", lambda s: s.num_kv_tokens, "KV tokens in use."),
    ("mlxcel_prompt_cache_entries", lambda s: s.prompt_cache_entries, "Prompt cache entries."),
    ("mlxcel_prompt_cache_bytes", lambda s: s.prompt_cache_bytes, "Prompt cache size in bytes."),
    ("mlxcel_kv_bytes_per_token", lambda s: s.kv.bytes_per_token,
     "KV bytes one token takes over the layers that keep every position (--cache-type-k/-v)."),
    ("mlxcel_kv_bytes", lambda s: sum(s.kv.slot_bytes(x.processed + x.generated) for x in s.slots),
     "KV bytes of the tokens in use (sliding-window layers: their window's)."),
)


class EngineCollector(Collector):
    """The engine's counters and gauges from its latest snapshot, read at each scrape."""

    def __init__(self, stats: Callable[[], EngineStats], model_id: Callable[[], str]):
        self._stats, self._model_id = stats, model_id

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("mlxcel_info", "The served model.", labels=["model"])
        info.add_metric([self._model_id()], 1)
        yield info
        stats = self._stats()
        for name, attr, help_text in _COUNTERS:
            yield CounterMetricFamily(name, help_text, value=getattr(stats, attr))
        pieces = CounterMetricFamily("mlxcel_prefill_pieces", "Prefill pieces run, by chunk size in tokens.",
                                     labels=["chunk"])
        for chunk, count in stats.prefill_pieces_by_chunk:
            pieces.add_metric([str(chunk)], count)
        yield pieces
        for name, read, help_text in _GAUGES:
            yield GaugeMetricFamily(name, help_text, value=read(stats))
        if stats.budget is not None:
            yield from _budget_metrics(stats.budget)


def _budget_metrics(b: BudgetStats) -> Iterator[Metric]:
    """The ITL-budget policy and its cost model (docs/adr/0008-itl-budget.md)."""
    yield GaugeMetricFamily("mlxcel_itl_budget_seconds", "The --itl-budget-ms target.", value=b.budget_ms / 1000.0)
    yield GaugeMetricFamily("mlxcel_itl_budget_margin", "Share of the budget held back for prediction error.",
                            value=b.margin)
    chunks = GaugeMetricFamily("mlxcel_itl_budget_chunk_tokens", "The last chunk chosen, by state.", labels=["state"])
    for state, chunk in (("contended", b.last_contended_chunk), ("alone", b.last_alone_chunk)):
        if chunk is not None:
            chunks.add_metric([state], chunk)
    yield chunks
    yield CounterMetricFamily("mlxcel_itl_budget_contended_ticks", "Ticks with a prefill piece and decode rows.",
                              value=b.num_contended_ticks)
    yield CounterMetricFamily("mlxcel_itl_budget_over_ticks", "Contended ticks that took longer than the budget.",
                              value=b.num_over_budget)
    yield CounterMetricFamily("mlxcel_itl_budget_floor_ticks", "Contended chunks chosen when even the smallest "
                              "piece was predicted over the budget (the honest floor).", value=b.num_floor_ticks)
    if b.floor_ms is not None:
        yield GaugeMetricFamily("mlxcel_itl_budget_floor_seconds", "The smallest piece's predicted tick, the last "
                                "time it did not fit the budget.", value=b.floor_ms / 1000.0)
    coef = GaugeMetricFamily("mlxcel_cost_model_coefficient", "Fitted seconds per unit of each tick feature.",
                             labels=["feature"])
    for feature, value in b.model.coefficients:
        coef.add_metric([feature], value)
    yield coef
    if b.model.recent_error is not None:
        yield GaugeMetricFamily("mlxcel_cost_model_recent_error", "EWMA of |predicted - measured| / measured tick time.",
                                value=b.model.recent_error)
    yield GaugeMetricFamily("mlxcel_cost_model_speed_factor", "Measured over seed-predicted tick time, recently.",
                            value=b.model.speed_factor)


def render_by_model(pairs: list[tuple[str, "ServerMetrics"]]) -> bytes:
    """Several models' metrics as one exposition: every sample labelled `model`, each family once."""
    families: dict[str, Metric] = {}
    for name, metrics in pairs:
        for family in metrics.registry.collect():
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            merged.samples += [s._replace(labels={"model": name, **s.labels}) for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class ServerMetrics:
    """What the HTTP side counts (finishes, rejections, TTFT, ITL) plus the engine's snapshot."""

    def __init__(self, stats: Callable[[], EngineStats], model_id: Callable[[], str]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.finished = Counter("mlxcel_requests", "Finished requests by finish reason.", ["finish_reason"],
                                registry=self.registry)
        for reason in ("stop", "length"):
            self.finished.labels(reason)  # present from the start, at 0
        self.rejected = Counter("mlxcel_requests_rejected", "Generation requests refused before queueing, by status.",
                                ["status"], registry=self.registry)
        self.ttft = Histogram("mlxcel_time_to_first_token_seconds",
                              "From request arrival to its first token, measured by the server.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("mlxcel_inter_token_latency_seconds",
                             "Between consecutive tokens of one request, measured by the server.",
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.registry.register(EngineCollector(stats, model_id))

    def observe_finish(self, reason: str) -> None:
        self.finished.labels(reason).inc()

    def observe_rejection(self, status: int) -> None:
        self.rejected.labels(str(status)).inc()

    def render(self) -> bytes:
        """The exposition text of every metric, as of now."""
        return generate_latest(self.registry)
