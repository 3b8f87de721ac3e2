"""``yoco-serve``: an OpenAI-compatible HTTP server over ``AsyncEngine``, shaped like vLLM's.

``create_app(engine, ServerSettings(...))`` builds the ASGI app; ``yoco_rs.serve.cli:main`` is the
console script. One concept per module: ``protocol`` (request bodies), ``body`` (parsing into 400s),
``validation`` (prompts and SamplingParams), ``completions``/``chat`` (the generation endpoints),
``sse`` (streaming, disconnects), ``logprobs``, ``tokenize``, ``metrics`` (Prometheus),
``middleware`` (request ids, body limit, auth), ``state`` (admission and engine facts), ``args``/``cli``.
"""

from yoco_rs.serve.app import begin_drain, create_app
from yoco_rs.serve.state import ServerSettings, ServerState

__all__ = ["create_app", "begin_drain", "ServerSettings", "ServerState"]
