"""``/metrics``: parses with prometheus_client's parser, carries vLLM's names and labels, and the
counters move by exactly what a request did."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import API_KEY, FRONTENDS, RustServer, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

H = {"Authorization": f"Bearer {API_KEY}"}


def _complete(srv, **body):
    r = httpx.post(srv.url + "/v1/completions", json={"model": "yoco-tiny", **body}, headers=H, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_text_parses_and_has_vllm_names_and_labels(srv):
    _complete(srv, prompt="warm up", max_tokens=2)
    text = httpx.get(srv.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in [
        ("yoco:num_requests_running", "gauge"), ("yoco:num_requests_waiting", "gauge"),
        ("yoco:kv_cache_usage_perc", "gauge"), ("yoco:prefix_cache_queries", "counter"),
        ("yoco:prefix_cache_hits", "counter"), ("yoco:num_preemptions", "counter"),
        ("yoco:prompt_tokens", "counter"), ("yoco:generation_tokens", "counter"),
        ("yoco:request_success", "counter"), ("yoco:time_to_first_token_seconds", "histogram"),
        ("yoco:inter_token_latency_seconds", "histogram"), ("yoco:e2e_request_latency_seconds", "histogram"),
        ("yoco:request_queue_time_seconds", "histogram"), ("yoco:cross_decoder_rows", "counter"),
        ("yoco:scheduled_tokens", "counter"), ("yoco:kv_sub_block_copies", "counter"),
        ("yoco:kv_sub_block_copied_tokens", "counter"), ("yoco:kv_block_adoptions", "counter"),
        ("yoco:cache_config_info", "gauge"),
    ]:
        assert name in fams, name
        assert fams[name].type == kind, (name, fams[name].type)
        for s in fams[name].samples:
            assert s.labels["model_name"] == "yoco-tiny" and s.labels["engine"] == "0"
    reasons = {s.labels["finished_reason"] for s in fams["yoco:request_success"].samples}
    assert {"stop", "length", "abort"} <= reasons
    assert "yoco:request_success_total" in text and "yoco:prompt_tokens_total" in text


def test_counters_move_by_what_one_request_did(srv):
    srv.wait_idle()
    m0 = srv.metrics()
    out = _complete(srv, prompt="Count these prompt tokens exactly", max_tokens=6, ignore_eos=True)
    m1 = srv.wait_idle()

    def d(name, **labels):
        k = (name, frozenset(labels.items()))
        return m1.get(k, 0) - m0.get(k, 0)

    assert d("yoco:prompt_tokens_total") == out["usage"]["prompt_tokens"]
    assert d("yoco:generation_tokens_total") == 6
    assert d("yoco:request_success_total", finished_reason="length") == 1
    assert d("yoco:time_to_first_token_seconds_count") == 1
    assert d("yoco:e2e_request_latency_seconds_count") == 1
    assert d("yoco:inter_token_latency_seconds_count") == 5
    assert d("yoco:request_params_max_tokens_count") == 1
    assert d("http_requests_total", method="POST", status="2xx", handler="/v1/completions") == 1
    # fast prefill: the cross-decoder saw fewer rows than the self-decoder's scheduled tokens
    assert d("yoco:scheduled_tokens_total") == out["usage"]["prompt_tokens"] + 5
    assert 0 < d("yoco:cross_decoder_rows_total") < d("yoco:scheduled_tokens_total")


def test_prefix_cache_counters_count_tokens(srv):
    prefix = "Shared prefix for the prefix cache counters test, long enough to span blocks. " * 2
    _complete(srv, prompt=prefix + "first", max_tokens=1)
    srv.wait_idle()
    m0 = srv.metrics()
    out = _complete(srv, prompt=prefix + "second", max_tokens=1)
    m1 = srv.wait_idle()
    q = m1[("yoco:prefix_cache_queries_total", frozenset())] - m0[("yoco:prefix_cache_queries_total", frozenset())]
    h = m1[("yoco:prefix_cache_hits_total", frozenset())] - m0[("yoco:prefix_cache_hits_total", frozenset())]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert q == out["usage"]["prompt_tokens"]
    assert h == cached > 0


def _names(url: str) -> set:
    return {f.name for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)}


def test_vllm_prefix_and_deprecated_names_on_request():
    srv = RustServer("--max-model-len", "128", "--kv-cache-memory", str(16 << 20), "--served-model-name", "m",
                     "--metrics-prefix", "vllm", "--compat-metric-names", api_key=None)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        names = _names(srv.url)
    finally:
        srv.stop()
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits",
              "vllm:gpu_prefix_cache_queries", "vllm:time_per_output_token_seconds",
              "vllm:inter_token_latency_seconds", "yoco:cross_decoder_rows"):
        assert n in names, n
    assert not any(n.startswith("yoco:") and n[5:] in ("num_requests_running", "prompt_tokens") for n in names)


def test_deprecated_names_are_off_by_default(srv):
    names = _names(srv.url)
    assert "yoco:gpu_cache_usage_perc" not in names and "yoco:kv_cache_usage_perc" in names
