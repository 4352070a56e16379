"""Prometheus metrics for /metrics, under flashlane's names and under vLLM's.

Request-side figures (requests, tokens, latencies) are observed by the server as replies
finish; engine-side figures (sessions, queue, drafts, prompt cache) are read from
`engine.stats()` at scrape time. Each registry is the app's own, never prometheus' global one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Latency buckets (seconds), vLLM's for TTFT and E2E; finer ones for per-token times.
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5)
_E2E = (0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480)

# Token counts per request: 1, 2, 5, 10, 20, 50, ... up to 2**20 (vLLM's 1-2-5 series).
_TOKENS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))
# Phase times (queue, prefill, decode), vLLM's request-time buckets.
_PHASE = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960)

# engine.stats() key -> (flashlane name, vLLM name or None, is a cumulative counter). The
# vLLM names mean what vLLM's do: prefix-cache queries and hits count tokens, preemptions
# count the times a stream began to wait for a session with room.
_ENGINE_KEYS: dict[str, tuple[str, str | None, bool]] = {
    "sessions_busy": ("flashlane_sessions_busy", "vllm:num_requests_running", False),
    "sessions_total": ("flashlane_sessions_total", None, False),
    "queue": ("flashlane_queue_waiting", "vllm:num_requests_waiting", False),
    "rounds": ("flashlane_rounds", None, True),
    "drafted": ("flashlane_drafted_tokens", "vllm:spec_decode_num_draft_tokens", True),
    "accepted": ("flashlane_accepted_tokens", "vllm:spec_decode_num_accepted_tokens", True),
    "prompt_cache_queries": ("flashlane_prompt_cache_queries", None, True),  # requests
    "prompt_cache_hits": ("flashlane_prompt_cache_hits", None, True),  # requests
    "prompt_cache_query_tokens": (
        "flashlane_prompt_cache_query_tokens",
        "vllm:prefix_cache_queries",
        True,
    ),
    "prompt_cache_hit_tokens": (
        "flashlane_prompt_cache_hit_tokens",
        "vllm:prefix_cache_hits",
        True,
    ),
    "kv_cache_usage": ("flashlane_kv_cache_usage", "vllm:kv_cache_usage_perc", False),
    "prompt_cache_bytes": ("flashlane_prompt_cache_bytes", None, False),
    "prompt_cache_capacity_bytes": ("flashlane_prompt_cache_capacity_bytes", None, False),
    "moves": ("flashlane_session_moves", None, True),
    "pauses": ("flashlane_session_pause_rounds", None, True),
    "preemptions": ("flashlane_session_pauses", "vllm:num_preemptions", True),
}


class EngineCollector(Collector):
    """Reads engine.stats() when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict[str, float] | None], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[Metric]:
        stats = self._stats() or {}
        for key, value in sorted(stats.items()):
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            name, vllm_name, cumulative = _ENGINE_KEYS.get(
                key, (f"flashlane_engine_{key}", None, False)
            )
            family = CounterMetricFamily if cumulative else GaugeMetricFamily
            yield family(name, f"engine {key}", value=value)
            if vllm_name is not None:
                metric = family(vllm_name, f"engine {key}", labels=["model_name"])
                metric.add_metric([self._model], value)
                yield metric


class ServerMetrics:
    """The server's own observations, each recorded once under both names."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model
        r = self.registry
        self.requests = Counter(
            "flashlane_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.in_flight = Gauge("flashlane_replies_in_flight", "replies being served", registry=r)

        def pair(kind: type[Counter] | type[Histogram], name: str, doc: str, **kw: Any) -> _Pair:
            return _Pair(kind, name, doc, r, model, **kw)

        self.prompt_tokens = pair(Counter, "prompt_tokens", "prompt tokens")
        self.cached_tokens = pair(
            Counter, "prompt_cached_tokens", "prompt tokens from the prompt cache", vllm=False
        )
        self.generation_tokens = pair(Counter, "generation_tokens", "generated tokens")
        self.success = pair(
            Counter, "request_success", "finished replies by reason", labels=("finished_reason",)
        )
        self.ttft = pair(Histogram, "time_to_first_token_seconds", "TTFT", buckets=_TTFT)
        self.tpot = pair(Histogram, "time_per_output_token_seconds", "TPOT", buckets=_TPOT)
        self.e2e = pair(Histogram, "e2e_request_latency_seconds", "reply latency", buckets=_E2E)
        self.itl = pair(
            Histogram, "inter_token_latency_seconds", "time between tokens", buckets=_TPOT
        )
        self.request_prompt = pair(
            Histogram, "request_prompt_tokens", "prompt tokens a request", buckets=_TOKENS
        )
        self.request_generation = pair(
            Histogram, "request_generation_tokens", "reply tokens a request", buckets=_TOKENS
        )
        # the most reply tokens among a request's choices (one choice a request here)
        self.request_max_generation = pair(
            Histogram,
            "request_max_num_generation_tokens",
            "reply tokens, the longest choice",
            buckets=_TOKENS,
        )
        self.queue_time = pair(
            Histogram, "request_queue_time_seconds", "waiting for a session", buckets=_PHASE
        )
        self.prefill_time = pair(
            Histogram, "request_prefill_time_seconds", "prompt to first token", buckets=_PHASE
        )
        self.decode_time = pair(
            Histogram, "request_decode_time_seconds", "first token to the end", buckets=_PHASE
        )

    def watch_engine(self, stats: Callable[[], dict[str, float] | None]) -> None:
        self.registry.register(EngineCollector(stats, self.model))

    def finished(
        self,
        *,
        reason: str,
        prompt_tokens: int,
        cached_tokens: int,
        generation_tokens: int,
        ttft: float | None,
        e2e: float,
        phases: tuple[float, float, float] | None = None,
    ) -> None:
        """Records one finished reply (any finish reason, errors and aborts included);
        `phases`: the engine's (queue, prefill, decode) seconds, where it ran."""
        self.prompt_tokens.inc(prompt_tokens)
        self.request_prompt.observe(prompt_tokens)
        self.request_generation.observe(generation_tokens)
        self.request_max_generation.observe(generation_tokens)
        if phases is not None:
            for metric, seconds in zip(
                (self.queue_time, self.prefill_time, self.decode_time), phases
            ):
                metric.observe(seconds)
        self.cached_tokens.inc(cached_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.success.inc(1, reason)
        if ttft is not None:
            self.ttft.observe(ttft)
            if generation_tokens > 1:
                self.tpot.observe((e2e - ttft) / (generation_tokens - 1))
        self.e2e.observe(e2e)

    def tokens_arrived(self, seconds: float, count: int) -> None:
        """`count` tokens arrived `seconds` after the previous ones: each observes its share
        (a round that lands drafts delivers several at once)."""
        for _ in range(count):
            self.itl.observe(seconds / count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Pair:
    """One observation, two metrics: flashlane_<name>, and vllm:<name> labelled model_name."""

    def __init__(
        self,
        kind: type[Counter] | type[Histogram],
        name: str,
        doc: str,
        registry: CollectorRegistry,
        model: str,
        *,
        labels: tuple[str, ...] = (),
        vllm: bool = True,
        **kw: object,
    ) -> None:
        self._model = model
        self._ours = kind(f"flashlane_{name}", doc, labels, registry=registry, **kw)
        self._theirs = None
        if vllm:
            names = ("model_name", *labels)
            self._theirs = kind(f"vllm:{name}", doc, names, registry=registry, **kw)

    def _each(self, *values: str) -> list[Counter | Histogram]:
        out = [self._ours.labels(*values) if values else self._ours]
        if self._theirs is not None:
            out.append(self._theirs.labels(self._model, *values))
        return out

    def inc(self, amount: float, *values: str) -> None:
        for metric in self._each(*values):
            metric.inc(amount)  # type: ignore[union-attr]

    def observe(self, value: float) -> None:
        for metric in self._each():
            metric.observe(value)  # type: ignore[union-attr]
