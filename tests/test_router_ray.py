"""``yoco_rs.serve.ray.build_app``: two tiny yoco replicas on Ray Serve with fractional CPUs, behind
Ray's prefix-cache-affinity router.

Default (light) form, no cluster: the application's wiring (2 replicas at 0.5 CPU, Ray's
``PrefixCacheAffinityRouter``) and that Ray's router reads the prefix text of our handle-call argument.
``YOCO_HEAVY=1`` deploys it on a local Ray: requests sharing a prefix go to one replica (named by the
``x-yoco-replica`` header), streaming works through the ingress, bad input keeps its 400, and shutdown
leaves no process behind."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from conftest import heavy

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

PER_FAMILY = 10
FLAGS = ["--max-model-len", "512", "--kv-cache-memory", str(64 << 20), "--max-num-seqs", "8", "--seed", "0",
         "--metrics-prefix", "vllm"]


def descendants() -> dict[int, str]:
    """This process's descendants (pid -> command line), from /proc (no psutil in the environment)."""
    import os

    children: dict[int, list[int]] = {}
    cmd: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd[int(d)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = {}, [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            out[c] = cmd.get(c, "")
            todo.append(c)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    import os

    # A loaded 2-core box starts Ray's agents slowly; the raylet's default wait for them is too short.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "180000")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")  # no metrics agent to wait for
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from yoco_rs.serve.ray import build_app

    import time

    before = set(descendants())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # serve.run waits until both replicas answer /health (each builds an engine: tens of seconds on
        # a loaded 2-core box; the replica gives up after 300 s, the module's timeout is 600 s).
        serve.run(build_app(None, num_replicas=2, serve_args=FLAGS, num_cpus=0.5),
                  name="yoco", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
    # Nothing of the local cluster outlives the tests (raylet, GCS, workers, replicas' servers).
    deadline = time.monotonic() + 60
    while (left := {p: c for p, c in descendants().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind by ray.shutdown(): {left}"


def test_app_wires_fractional_replicas_behind_rays_prefix_router():
    from yoco_rs.serve.ray import PREFIX_ROUTER, build_app

    app = build_app(None, num_replicas=2, num_cpus=0.5, serve_args=FLAGS)
    ingress = app._bound_deployment
    replica = ingress.init_args[0]._bound_deployment
    assert ingress.ray_actor_options["num_cpus"] == 0, "the ingress holds no engine"
    assert (replica.num_replicas, replica.ray_actor_options["num_cpus"]) == (2, 0.5)
    assert replica._deployment_config.request_router_config.request_router_class == PREFIX_ROUTER
    plain = build_app(None, num_replicas=2, prefix_affinity=False)._bound_deployment.init_args[0]._bound_deployment
    assert plain._deployment_config.request_router_config.request_router_class != PREFIX_ROUTER


def test_rays_prefix_router_reads_the_prompt_or_messages_we_hand_it():
    from types import SimpleNamespace

    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )

    from yoco_rs.serve.ray import RoutedRequest

    router = object.__new__(PrefixCacheAffinityRouter)  # only its request-to-text method is used

    def text(req):
        return router._extract_text_from_request(SimpleNamespace(args=[req]))

    assert text(RoutedRequest("/v1/completions", b"", prompt="alpha beta")) == "alpha beta"
    assert text(RoutedRequest("/v1/chat/completions", b"", messages=[{"role": "user", "content": "hi"}])) == "hi"
    assert text(RoutedRequest("/tokenize", b"")) == "", "requests without text still route (no ValueError)"


deploy = pytest.mark.skipif(not heavy(), reason="deploys on a local Ray cluster: YOCO_HEAVY=1")


def complete(url: str, prompt: str, **kw) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", json={"model": "yoco-tiny", "prompt": prompt, "max_tokens": 2, **kw},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r


@deploy
def test_each_prefix_family_sticks_to_one_replica(app_url):
    families = {"A": "alpha " * 100, "B": "bravo " * 100}
    homes = {}
    for name, fam in families.items():
        first = complete(app_url, fam + "first").headers["x-yoco-replica"]
        later = {complete(app_url, fam + f" question {j}").headers["x-yoco-replica"] for j in range(PER_FAMILY)}
        assert later == {first}, f"family {name}: served by {later}, first by {first}"
        homes[name] = first
    assert homes["A"] != homes["B"], "with balanced load, a new prefix goes to the replica with the least cached text"


@deploy
def test_streaming_relays_sse_chunks_through_the_ingress(app_url):
    body = {"model": "yoco-tiny", "prompt": "stream me", "max_tokens": 6, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", app_url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-yoco-replica"]
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert len(chunks) >= 2 and all(c["object"] == "text_completion" for c in chunks)


@deploy
def test_bad_input_gets_the_servers_400_through_ray(app_url):
    r = httpx.post(app_url + "/v1/completions", json={"model": "yoco-tiny", "prompt": "x", "max_tokens": -1},
                   timeout=60)
    assert r.status_code == 400 and "max_tokens" in r.text
