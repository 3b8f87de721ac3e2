"""GuideLLM, a load generator users already run against vLLM, completes against yoco-serve (concurrent
profile, shared-prefix synthetic data) and the token counts it reports are the server's: per request
the prompt tokens equal /tokenize of the prompt it sent, and in total they equal the server's counters.
Against the shared server (``serve_helpers.FRONTENDS``)."""

import importlib.util
import json
import os
import subprocess
import sys

import httpx
import pytest

from serve_helpers import API_KEY, FRONTENDS, each_frontend

# guidellm is in the test extra: a missing install fails here rather than skipping silently.
assert importlib.util.find_spec("guidellm") is not None, "guidellm is not installed (make setup installs it)"

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _guidellm(srv, tmp_path, api, streams, count, prompt_tokens=48, prefix_tokens=64, output_tokens=8):
    from yoco_rs.bundled import default_model_dir

    data = {"kind": "synthetic_text", "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
            "prefix_buckets": [{"prefix_count": 2, "prefix_tokens": prefix_tokens}]}
    out = tmp_path / f"guidellm{api.replace('/', '_')}.json"
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={srv.url},model=yoco-tiny,request_format={api},api_key={API_KEY}",
           "--profile", f"kind=concurrent,streams={streams[0]}", "--override", "profile.streams",
           ",".join(map(str, streams)), "--data", json.dumps(data),
           "--tokenizer", f"kind=huggingface_auto,model={default_model_dir()}",
           "--constraint", f"kind=max_requests,count={count}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    r = subprocess.run(cmd, env={**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("api", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_completes_and_its_token_counts_are_the_servers(srv, tmp_path, api):
    srv.wait_idle()
    before = srv.metrics()
    report = _guidellm(srv, tmp_path, api, streams=[1, 4], count=6)
    after = srv.wait_idle()
    reqs = [r for b in report["benchmarks"] for r in b["requests"]["successful"]]
    assert len(report["benchmarks"]) == 2
    for b in report["benchmarks"]:
        # Every request GuideLLM sent succeeded. Its max_requests constraint (0.8.1) sometimes stops
        # creating requests one short of the count (seen twice on this box, once with the machine idle);
        # the token checks below are over exactly the requests it reports, so they stay exact.
        t = b["metrics"]["request_totals"]
        assert t["errored"] == 0 and t["incomplete"] == 0 and t["successful"] == t["total"], t
        assert 5 <= t["total"] <= 6, t
    assert all(r["output_tokens"] == 8 for r in reqs)

    def delta(name):
        k = (name, frozenset())
        return after.get(k, 0) - before.get(k, 0)

    # A benchmark that stops one short may still have sent that request: the server then counted it and
    # GuideLLM did not report it (seen in CI, 2026-12-04: 12 served, 11 reported). Its tokens are the
    # server's surplus, at most one request's each; with nothing missing the sums are exact.
    missing = 2 * 6 - len(reqs)
    extra = {name: delta(name) - sum(r[key] or 0 for r in reqs)
             for name, key in (("yoco:prompt_tokens_total", "prompt_tokens"),
                               ("yoco:generation_tokens_total", "output_tokens"),
                               ("yoco:prefix_cache_hits_total", "cached_tokens"))}
    most = {"yoco:prompt_tokens_total": max(r["prompt_tokens"] for r in reqs), "yoco:generation_tokens_total": 8,
            "yoco:prefix_cache_hits_total": max(r["prompt_tokens"] for r in reqs)}
    for name, e in extra.items():
        assert 0 <= e <= missing * most[name], (name, e, missing)
    assert delta("yoco:prefix_cache_hits_total") > 0
    for r in reqs[:4]:  # the prompt tokens GuideLLM reports are exactly the prompt it sent
        body = json.loads(r["request_args"])["body"]
        tok = {"prompt": body["prompt"]} if "prompt" in body else {"messages": body["messages"]}
        count = httpx.post(srv.url + "/tokenize", json=tok).json()["count"]
        assert r["prompt_tokens"] == count
