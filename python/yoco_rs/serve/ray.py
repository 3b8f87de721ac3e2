"""An OpenAI-compatible Ray Serve app of N yoco-rs replicas with prefix-cache affinity.

``build_app(model, num_replicas, serve_args=[...])`` returns a Ray Serve application: an ingress (FastAPI,
no engine) in front of ``num_replicas`` engine replicas. Each replica runs a whole ``yoco-serve`` (the Rust
front end and its engine: the same routes, validation, errors, SSE and metrics as the CLI, with the same
flags) as a child process of its actor, on a loopback port; the ingress hands each request to a replica
through a Ray ``DeploymentHandle`` and relays the answer, streamed or not. A replica whose server exits
fails Ray's health check and is replaced.

Routing: with ``prefix_affinity`` (default) Ray's ``PrefixCacheAffinityRouter`` chooses the replica: while
load is balanced it sends a request to the replica whose earlier prompts share the longest prefix with
it (that replica's prefix cache holds the KV), otherwise the less loaded of two (power of two choices).
The router reads ``.prompt`` / ``.messages`` from the handle call's argument, which ``RoutedRequest``
carries. Without it, Ray's default power-of-two router.

Resources: ``num_cpus`` / ``num_gpus`` per replica (``ray_actor_options``). On a multi-node GPU cluster,
``num_gpus=1`` places one replica per GPU (see README, "Ray Serve"); on a CPU box fractional CPUs let
several replicas share cores.

    from ray import serve
    from yoco_rs.serve.ray import build_app
    serve.run(build_app(None, num_replicas=2, num_cpus=0.5, serve_args=["--max-model-len", "512"]),
              route_prefix="/")

Needs ``ray[serve]`` and ``pyarrow`` (the prefix router's module imports it).
"""

# No `from __future__ import annotations` here: FastAPI reads the ingress methods' annotations at
# route registration, and `Request` is imported inside `build_app`, so a string annotation would not
# resolve and FastAPI would take `request` for a required query parameter (every call a 422).

import os
from typing import Any, Optional, Sequence

from yoco_rs.serve.child_server import ChildServer as ReplicaServer

#: Ray's prefix-aware router (the public ``ray.serve.llm.request_router`` path needs vLLM installed).
PREFIX_ROUTER = "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter"

#: Response header naming the replica that served a request (routing is observable from outside).
REPLICA_HEADER = "x-yoco-replica"


class RoutedRequest:
    """One HTTP request handed to a replica. Exactly one of ``prompt`` / ``messages`` exists as an
    attribute: Ray's prefix router takes the first of the two it finds by ``hasattr`` (messages first),
    so an unset one must be absent, not None."""

    def __init__(self, path: str, body: bytes, headers: Optional[dict] = None, *, prompt: Any = None,
                 messages: Any = None, stream: bool = False) -> None:
        self.path, self.body, self.headers, self.stream = path, body, dict(headers or {}), stream
        if messages is not None:
            self.messages = messages
        else:
            self.prompt = prompt if prompt is not None else ""


def _routing_text(obj: Any) -> tuple[Any, Any]:
    if not isinstance(obj, dict):
        return None, None
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        prompt = " ".join(map(str, prompt))  # token ids: still a usable prefix key
    return prompt, obj.get("messages")


def build_app(model: Optional[str] = None, num_replicas: int = 2, *, serve_args: Sequence[str] = (),
              num_cpus: float = 1.0, num_gpus: float = 0.0, prefix_affinity: bool = True,
              router_kwargs: Optional[dict] = None, name: str = "yoco"):
    """The Ray Serve application (pass it to ``serve.run``). ``serve_args`` are ``yoco-serve`` flags, passed
    to every replica's server as they are (e.g. ``["--max-model-len", "4096", "--metrics-prefix", "vllm"]``;
    ``--host`` and ``--port`` are the replica's own). A bad flag fails the replica's start with the
    server's message."""
    import json

    import httpx
    from fastapi import FastAPI, Request
    from ray import serve
    from starlette.responses import Response, StreamingResponse

    router_config = None
    if prefix_affinity:
        from ray.serve.config import RequestRouterConfig

        router_config = RequestRouterConfig(request_router_class=PREFIX_ROUTER,
                                            request_router_kwargs=dict(router_kwargs or {}))
    options: dict = dict(num_replicas=num_replicas, ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
                         name=f"{name}-replica")
    if router_config is not None:
        options["request_router_config"] = router_config

    @serve.deployment(**options)
    class YocoReplica:
        """One ``yoco-serve`` (the Rust front end and its engine) as a child process of this actor, on a
        loopback port; the actor relays the ingress's requests to it."""

        def __init__(self) -> None:
            self.replica_id = serve.get_replica_context().replica_tag
            threads = str(max(1, int(num_cpus)))
            self.server = ReplicaServer(model, serve_args, env={"OMP_NUM_THREADS": os.environ.get(
                "OMP_NUM_THREADS", threads)})
            self.url = self.server.url
            self.client = httpx.AsyncClient(base_url=self.url, timeout=None)

        async def handle(self, req: RoutedRequest) -> dict:
            """A whole (non-streamed) answer: status, body and the serving replica."""
            r = await self.client.post(req.path, content=req.body, headers=req.headers)
            return {"status": r.status_code, "body": r.content, "replica": self.replica_id,
                    "content_type": r.headers.get("content-type", "application/json")}

        async def handle_stream(self, req: RoutedRequest):
            """An SSE answer relayed chunk by chunk; the first item names the replica and the status."""
            async with self.client.stream("POST", req.path, content=req.body, headers=req.headers) as r:
                yield {"status": r.status_code, "replica": self.replica_id,
                       "content_type": r.headers.get("content-type", "text/event-stream")}
                async for chunk in r.aiter_raw():
                    yield chunk

        async def metrics(self) -> str:
            return (await self.client.get("/metrics")).text

        def check_health(self) -> None:
            """Ray Serve's health check: a replica whose server exited is unhealthy (Ray replaces it)."""
            if not self.server.alive():
                raise RuntimeError(f"the replica's yoco-serve exited:\n{self.server.log_tail()}")

        def __del__(self) -> None:
            server = getattr(self, "server", None)
            if server is not None:
                server.stop()

    api = FastAPI(title="yoco-rs on Ray Serve")

    @serve.deployment(name=f"{name}-ingress", num_replicas=1, ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class Ingress:
        def __init__(self, replicas) -> None:
            self.replicas = replicas

        async def _forward(self, path: str, request: Request):
            body = await request.body()
            try:
                obj = json.loads(body) if body else None
            except ValueError:
                obj = None
            prompt, messages = _routing_text(obj)
            headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type",
                                                                                 "x-request-id")}
            stream = isinstance(obj, dict) and bool(obj.get("stream"))
            req = RoutedRequest(path, body, headers, prompt=prompt, messages=messages, stream=stream)
            if not stream:
                out = await self.replicas.handle.remote(req)
                return Response(out["body"], status_code=out["status"], media_type=out["content_type"],
                                headers={REPLICA_HEADER: out["replica"]})
            gen = self.replicas.options(stream=True).handle_stream.remote(req)
            head = await gen.__anext__()

            async def relay():
                async for chunk in gen:
                    yield chunk

            return StreamingResponse(relay(), status_code=head["status"], media_type=head["content_type"],
                                     headers={REPLICA_HEADER: head["replica"]})

        @api.post("/v1/completions")
        async def completions(self, request: Request):
            return await self._forward("/v1/completions", request)

        @api.post("/v1/chat/completions")
        async def chat_completions(self, request: Request):
            return await self._forward("/v1/chat/completions", request)

        @api.post("/v1/completions/render")
        async def completions_render(self, request: Request):
            return await self._forward("/v1/completions/render", request)

        @api.post("/v1/chat/completions/render")
        async def chat_render(self, request: Request):
            return await self._forward("/v1/chat/completions/render", request)

        @api.post("/tokenize")
        async def tokenize(self, request: Request):
            return await self._forward("/tokenize", request)

        @api.get("/health")
        async def health(self):
            return {"status": "ok"}

    return Ingress.bind(YocoReplica.bind())


__all__ = ["build_app", "RoutedRequest", "PREFIX_ROUTER", "REPLICA_HEADER"]
