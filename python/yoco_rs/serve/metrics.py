"""``GET /metrics``: the engine's metrics in Prometheus text, with vLLM's names and label layout.

The vLLM-named series are published as ``yoco:<name>`` (or ``vllm:<name>`` with ``--metrics-prefix
vllm``, for routers and dashboards that scrape those); every series carries ``model_name`` (the first
served name) and ``engine`` ("0"). ``--compat-metric-names`` adds the deprecated names older consumers
still read (``gpu_cache_usage_perc``, ``gpu_prefix_cache_queries/hits``, ``time_per_output_token_seconds``).
yoco's own series (fast-prefill rows, sub-block copies, adoptions, block counts) are always ``yoco:``.

A collector reads one ``engine.get_metrics()`` snapshot per scrape (counters are monotonic in the
engine, so any number of scrapers can read them); server-side series (request parameters, HTTP
requests) are plain prometheus_client metrics in the same per-app registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from yoco_rs.metrics import TOKEN_BUCKETS

LABELS = ["model_name", "engine"]

# (snapshot field, vLLM name, help, deprecated alias)
_GAUGES = [
    ("num_requests_running", "num_requests_running", "Number of requests in model execution batches.", None),
    ("num_requests_waiting", "num_requests_waiting", "Number of requests waiting to be processed.", None),
    ("kv_cache_usage", "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gpu_cache_usage_perc"),
]
_COUNTERS = [
    ("prefix_cache_queries", "prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", "gpu_prefix_cache_queries"),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "gpu_prefix_cache_hits"),
    ("num_preemptions", "num_preemptions", "Cumulative number of preemptions from the engine.", None),
    ("prompt_tokens", "prompt_tokens", "Number of prefill tokens processed.", None),
    ("generation_tokens", "generation_tokens", "Number of generation tokens processed.", None),
]
_HISTOGRAMS = [
    ("time_to_first_token", "time_to_first_token_seconds", "Histogram of time to first token in seconds.", None),
    ("inter_token_latency", "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     "time_per_output_token_seconds"),
    ("e2e_request_latency", "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", None),
    ("request_queue_time", "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     None),
    ("request_prefill_time", "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     None),
    ("request_decode_time", "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     None),
    ("request_prompt_tokens", "request_prompt_tokens", "Number of prefill tokens processed.", None),
    ("request_generation_tokens", "request_generation_tokens", "Number of generation tokens processed.", None),
    ("iteration_tokens", "iteration_tokens_total", "Histogram of number of tokens per engine_step.", None),
]
# yoco's own: (snapshot field, name, help)
_YOCO_COUNTERS = [
    ("scheduled_tokens", "scheduled_tokens", "Tokens run through the self-decoder (every scheduled token)."),
    ("cross_rows", "cross_decoder_rows",
     "Rows run through the cross-decoder (only rows whose logits are needed with fast prefill)."),
    ("kv_copies", "kv_sub_block_copies", "Sub-block prefix-cache hits served by copying KV into a fresh block."),
    ("kv_copied_tokens", "kv_sub_block_copied_tokens", "Tokens of KV copied by sub-block prefix-cache hits."),
    ("kv_adoptions", "kv_block_adoptions", "Partial cached blocks adopted in place instead of copied."),
    ("num_steps", "engine_steps", "Engine steps run."),
    ("kv_events_published", "kv_events_published", "KV event batches published (--kv-events-config)."),
    ("kv_events_dropped", "kv_events_dropped",
     "KV event batches dropped on a full publisher queue, plus events the bounded log discarded."),
]
_YOCO_GAUGES = [
    ("kv_blocks_total", "kv_blocks_total", "Usable KV blocks per group."),
    ("kv_blocks_used", "kv_blocks_used", "KV blocks referenced by requests (0 when idle: nothing leaked)."),
    ("kv_blocks_free", "kv_blocks_free", "KV blocks on the free list (cached or empty)."),
    ("kv_blocks_cached", "kv_blocks_cached", "Free KV blocks that still hold a cached prefix."),
]


def cache_config_info(cfg) -> dict:
    """The labels of ``cache_config_info`` (vLLM's CacheConfig info series) for an ``EngineConfig``; the
    Rust front end publishes the same ones."""
    return {
        "block_size": cfg.block_size,
        "sub_block_size": cfg.sub_block_size,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "kv_sharing_fast_prefill": cfg.kv_sharing_fast_prefill,
        "num_gpu_blocks": getattr(cfg, "num_gpu_blocks_override", None),
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "dtype": cfg.dtype,
    }


def _hist_buckets(snap) -> list:
    return [(floatToGoString(le), float(c)) for le, c in snap.cumulative()]


class EngineCollector:
    """Reads the engine snapshot at scrape time and yields vLLM-named families."""

    def __init__(self, state):
        self.state = state

    def describe(self):
        """Nothing up front: the series depend on the engine's state and are produced at scrape time."""
        return []

    def collect(self):
        """The engine's metrics snapshot as Prometheus families, under vLLM's names (read at each scrape)."""
        st = self.state
        prefix = st.settings.metrics_prefix
        compat = st.settings.compat_metric_names
        values = [st.model_name, "0"]
        yield from self._config_info(prefix, values)
        try:
            m = st.engine.get_metrics()
        except Exception:
            return  # still loading (or dead): only the info series
        for field, name, doc, alias in _GAUGES:
            for n in (name, alias if compat else None):
                if n:
                    g = GaugeMetricFamily(f"{prefix}:{n}", doc, labels=LABELS)
                    g.add_metric(values, float(getattr(m, field)))
                    yield g
        for field, name, doc, alias in _COUNTERS:
            for n in (name, alias if compat else None):
                if n:
                    c = CounterMetricFamily(f"{prefix}:{n}", doc, labels=LABELS)
                    c.add_metric(values, float(getattr(m, field)))
                    yield c
        c = CounterMetricFamily(f"{prefix}:request_success", "Count of successfully processed requests.",
                                labels=LABELS + ["finished_reason"])
        success = dict(m.request_success or {})
        for reason in ("stop", "length", "abort"):
            success.setdefault(reason, 0)
        for reason, v in sorted(success.items()):
            c.add_metric(values + [str(reason)], float(v))
        yield c
        for field, name, doc, alias in _HISTOGRAMS:
            snap = getattr(m, field)
            if snap is None:
                continue
            for n in (name, alias if compat else None):
                if n:
                    h = HistogramMetricFamily(f"{prefix}:{n}", doc, labels=LABELS)
                    h.add_metric(values, _hist_buckets(snap), float(snap.sum))
                    yield h
        for field, name, doc in _YOCO_COUNTERS:
            c = CounterMetricFamily(f"yoco:{name}", doc, labels=LABELS)
            c.add_metric(values, float(getattr(m, field)))
            yield c
        for field, name, doc in _YOCO_GAUGES:
            g = GaugeMetricFamily(f"yoco:{name}", doc, labels=LABELS)
            g.add_metric(values, float(getattr(m, field)))
            yield g

    def _config_info(self, prefix, values):
        try:
            info = cache_config_info(self.state.engine.config)
        except Exception:
            return
        g = GaugeMetricFamily(f"{prefix}:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=LABELS + sorted(info))
        g.add_metric(values + [str(info[k]) for k in sorted(info)], 1.0)
        yield g


class ServerMetrics:
    """The per-app registry: the engine collector plus server-side series."""

    def __init__(self, state):
        prefix = state.settings.metrics_prefix
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(state))
        self._label = state.model_name
        self.params_n = Histogram(f"{prefix}:request_params_n", "Histogram of the n request parameter.",
                                  LABELS, buckets=(1, 2, 5, 10, 20), registry=self.registry)
        self.params_max_tokens = Histogram(f"{prefix}:request_params_max_tokens",
                                           "Histogram of the max_tokens request parameter.", LABELS,
                                           buckets=TOKEN_BUCKETS, registry=self.registry)
        self.http_requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                     ["method", "status", "handler"], registry=self.registry)

    def observe_params(self, n: int, max_tokens) -> None:
        """Record a request's ``n`` and ``max_tokens`` (vLLM's request-parameter histograms)."""
        self.params_n.labels(self._label, "0").observe(n)
        if max_tokens is not None:
            self.params_max_tokens.labels(self._label, "0").observe(max_tokens)


__all__ = ["EngineCollector", "ServerMetrics", "LABELS", "cache_config_info"]
