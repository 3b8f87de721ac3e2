"""Engine metrics: monotonic counters, gauges and fixed-bucket histograms, snapshot as plain data.

Built so a Prometheus exporter maps them 1:1 (vLLM's metric names in the comments): counters only
grow, histograms are cumulative (``buckets`` upper bounds, ``counts`` per bucket *not* cumulative,
plus ``sum`` and ``count``), so any number of readers can scrape without draining anything. The
engine observes per step with vectorized numpy (no per-token Python), and per finished request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

# vLLM's bucket sets (seconds / tokens), so dashboards built for vLLM read ours.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class Histogram:
    """A fixed-bucket histogram with vectorized observation. Not thread-safe on its own; the engine
    observes from its loop thread and snapshots under the metrics lock."""

    def __init__(self, buckets):
        self.buckets = tuple(float(b) for b in buckets)
        self._edges = np.asarray(self.buckets, dtype=np.float64)
        self.counts = np.zeros(len(self.buckets) + 1, dtype=np.int64)  # last = +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one value in its bucket."""
        self.counts[int(np.searchsorted(self._edges, value, side="left"))] += 1
        self.sum += float(value)

    def observe_many(self, values: np.ndarray) -> None:
        """Count an array of values at once (one numpy pass per step, not per token)."""
        if len(values) == 0:
            return
        idx = np.searchsorted(self._edges, values, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.sum += float(np.sum(values))

    def snapshot(self) -> "HistogramSnapshot":
        """An immutable copy for readers on other threads."""
        return HistogramSnapshot(self.buckets, tuple(int(c) for c in self.counts), self.sum)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram frozen at snapshot time; ``cumulative()`` gives Prometheus' bucket layout."""

    buckets: tuple[float, ...]
    """Upper bounds (le), ascending; +Inf is implied as the last bucket."""
    counts: tuple[int, ...]
    """Observations per bucket (len(buckets) + 1, not cumulative)."""
    sum: float

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(le, cumulative count), ...]`` ending with ``(inf, count)``, Prometheus' layout."""
        out, acc = [], 0
        for le, c in zip(self.buckets + (float("inf"),), self.counts):
            acc += c
            out.append((le, acc))
        return out


@dataclass(frozen=True)
class EngineMetrics:
    """One consistent snapshot of the engine's metrics (``Engine.get_metrics()``)."""

    # ---- gauges ---------------------------------------------------------------------------------
    num_requests_running: int = 0  # vllm:num_requests_running (core sequences, n>1 counts n)
    num_requests_waiting: int = 0  # vllm:num_requests_waiting
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc (0..1: used / usable blocks)
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    kv_blocks_cached: int = 0
    # ---- counters -------------------------------------------------------------------------------
    prefix_cache_queries: int = 0  # vllm:prefix_cache_queries_total (tokens)
    prefix_cache_hits: int = 0  # vllm:prefix_cache_hits_total (tokens)
    num_preemptions: int = 0  # vllm:num_preemptions_total
    prompt_tokens: int = 0  # vllm:prompt_tokens_total
    generation_tokens: int = 0  # vllm:generation_tokens_total
    request_success: dict = field(default_factory=dict)  # vllm:request_success_total{finished_reason}
    num_steps: int = 0
    scheduled_tokens: int = 0  # yoco: tokens through the self-decoder
    cross_rows: int = 0  # yoco: rows through the cross-decoder (fast prefill: << scheduled_tokens)
    kv_copies: int = 0  # yoco: sub-block copy-on-match operations
    kv_copied_tokens: int = 0
    kv_adoptions: int = 0  # yoco: partial blocks adopted instead of copied
    kv_events_published: int = 0  # yoco: KV event batches sent (--kv-events-config)
    kv_events_dropped: int = 0  # yoco: KV event batches/events dropped (publisher queue full, log overflow)
    # ---- histograms -----------------------------------------------------------------------------
    time_to_first_token: HistogramSnapshot | None = None  # vllm:time_to_first_token_seconds
    inter_token_latency: HistogramSnapshot | None = None  # vllm:inter_token_latency_seconds
    e2e_request_latency: HistogramSnapshot | None = None  # vllm:e2e_request_latency_seconds
    request_queue_time: HistogramSnapshot | None = None  # vllm:request_queue_time_seconds
    request_prefill_time: HistogramSnapshot | None = None  # vllm:request_prefill_time_seconds
    request_decode_time: HistogramSnapshot | None = None  # vllm:request_decode_time_seconds
    request_prompt_tokens: HistogramSnapshot | None = None  # vllm:request_prompt_tokens
    request_generation_tokens: HistogramSnapshot | None = None  # vllm:request_generation_tokens
    iteration_tokens: HistogramSnapshot | None = None  # vllm:iteration_tokens_total


def loop_metrics(stats: dict, fast_prefill: bool) -> EngineMetrics:
    """A snapshot from a Rust step loop's figures (``_core.EngineLoop.stats()``: the same names, a
    histogram as ``(bounds, per-bucket counts with +Inf last, sum)``). Without fast prefill every
    scheduled token runs the cross-decoder, whatever rows the plan selected (the server's rule)."""
    if not fast_prefill:
        stats["cross_rows"] = stats["scheduled_tokens"]
    for name, v in stats.items():
        if isinstance(v, tuple):
            bounds, counts, total = v
            stats[name] = HistogramSnapshot(tuple(bounds), tuple(counts), total)
    return EngineMetrics(**stats)


class MetricsRecorder:
    """The engine's mutable metrics; ``snapshot()`` is safe from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: dict[str, int] = dict(
            prompt_tokens=0, generation_tokens=0, num_steps=0, scheduled_tokens=0, cross_rows=0,
        )
        self.request_success = {"stop": 0, "length": 0, "abort": 0}
        self.hist = dict(
            time_to_first_token=Histogram(TTFT_BUCKETS),
            inter_token_latency=Histogram(ITL_BUCKETS),
            e2e_request_latency=Histogram(LATENCY_BUCKETS),
            request_queue_time=Histogram(LATENCY_BUCKETS),
            request_prefill_time=Histogram(LATENCY_BUCKETS),
            request_decode_time=Histogram(LATENCY_BUCKETS),
            request_prompt_tokens=Histogram(TOKEN_BUCKETS),
            request_generation_tokens=Histogram(TOKEN_BUCKETS),
            iteration_tokens=Histogram(TOKEN_BUCKETS),
        )

    def snapshot(self, core_stats: dict | None = None) -> EngineMetrics:
        """Counters and histograms, plus the core's gauges/counters from ``core_stats`` (the dict the
        scheduler's ``stats()`` returns)."""
        s = core_stats or {}
        with self.lock:
            hists = {k: h.snapshot() for k, h in self.hist.items()}
            counters = dict(self.counters)
            success = dict(self.request_success)
        total = int(s.get("blocks_total", 0))
        used = int(s.get("blocks_used", 0))
        return EngineMetrics(
            num_requests_running=int(s.get("running", 0)),
            num_requests_waiting=int(s.get("waiting", 0)),
            kv_cache_usage=(used / total) if total else 0.0,
            kv_blocks_total=total,
            kv_blocks_used=used,
            kv_blocks_free=int(s.get("blocks_free", 0)),
            kv_blocks_cached=int(s.get("blocks_cached", 0)),
            prefix_cache_queries=int(s.get("prefix_query_tokens", 0)),
            prefix_cache_hits=int(s.get("prefix_hit_tokens", 0)),
            num_preemptions=int(s.get("preemptions", 0)),
            kv_copies=int(s.get("copies", 0)),
            kv_copied_tokens=int(s.get("copied_tokens", 0)),
            kv_adoptions=int(s.get("adoptions", 0)),
            kv_events_published=int(s.get("kv_events_published", 0)),
            kv_events_dropped=int(s.get("kv_events_dropped", 0)),
            request_success=success,
            **counters,
            **hists,
        )


__all__ = ["EngineMetrics", "HistogramSnapshot", "Histogram", "MetricsRecorder"]
