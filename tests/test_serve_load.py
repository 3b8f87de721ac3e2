"""Load and faults: many concurrent streaming clients, a third of which disconnect at random points
(while queued, mid-stream); survivors get complete streams with exact usage, and afterwards nothing
runs, waits or holds a KV block. A non-streaming client that gives up aborts its request too."""

import asyncio
import json
import random
import socket
import time

import httpx
import pytest

from serve_helpers import API_KEY, FRONTENDS, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

PREFIX = "You are a helpful assistant. Answer the question below briefly and precisely. "


async def _client(client, url, i, rng, disconnect):
    max_tokens = rng.randint(4, 24)
    body = {"model": "yoco-tiny", "prompt": PREFIX + f"Question {i}: what is {i} plus {i}?",
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0.8, "seed": i,
            "stream_options": {"include_usage": True, "continuous_usage_stats": i % 2 == 0}}
    cut_after = rng.randint(0, max_tokens) if disconnect else None
    give_up = rng.uniform(0.0, 2.0) if disconnect and rng.random() < 0.3 else None

    async def run():
        chunks, lines = 0, []
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line)
                if line != "data: [DONE]" and json.loads(line[6:])["choices"]:
                    chunks += 1
                if cut_after is not None and give_up is None and chunks >= cut_after:
                    return None  # leaving the block drops the connection mid-stream
        return max_tokens, lines

    if give_up is not None:
        try:
            return await asyncio.wait_for(run(), give_up)
        except asyncio.TimeoutError:
            return None
    return await run()


async def _storm(url, n, seed):
    rng = random.Random(seed)
    plan = [rng.random() < 1 / 3 for _ in range(n)]
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300)) as client:
        results = await asyncio.gather(*[_client(client, url, i, rng, plan[i]) for i in range(n)])
    return plan, results


def _prompt_tokens(url, text):
    return httpx.post(url + "/tokenize", json={"prompt": text}).json()["count"]


def test_concurrent_streams_with_random_disconnects_leave_nothing_behind(srv):
    n = 200
    before = srv.metrics()
    plan, results = asyncio.run(_storm(srv.url, n, seed=1))
    survivors = [(i, r) for i, r in enumerate(results) if r is not None]
    assert len(survivors) >= sum(1 for d in plan if not d)
    for i, (max_tokens, lines) in survivors:
        assert lines[-1] == "data: [DONE]"
        final = json.loads(lines[-2][6:])
        assert final["choices"] == []
        usage = final["usage"]
        assert usage["completion_tokens"] == max_tokens, (i, usage)
        assert usage["prompt_tokens"] == _prompt_tokens(srv.url, PREFIX + f"Question {i}: what is {i} plus {i}?")
        finishes = [json.loads(ln[6:])["choices"][0]["finish_reason"] for ln in lines[:-2]]
        assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    after = srv.wait_idle()
    key = ("yoco:request_success_total", frozenset({("finished_reason", "abort")}))
    aborted = after.get(key, 0) - before.get(key, 0)
    dropped = n - len(survivors)
    assert 0 < aborted <= dropped
    assert after[("yoco:kv_blocks_used", frozenset())] == 0
    assert after[("yoco:num_requests_running", frozenset())] == 0
    assert after[("yoco:num_requests_waiting", frozenset())] == 0
    # the server still serves
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "after the storm", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200


def test_non_streaming_client_that_gives_up_aborts_its_request(srv):
    key = ("yoco:request_success_total", frozenset({("finished_reason", "abort")}))
    srv.wait_idle()
    before = srv.metrics().get(key, 0)
    body = json.dumps({"prompt": "a very long answer please", "max_tokens": 240, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 10
    while srv.metric("yoco:num_requests_running") < 1:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)
    sock.close()  # the client gives up while its request runs
    after = srv.wait_idle()
    assert after.get(key, 0) == before + 1
