"""``--kv-events-config``: vLLM's ``KVEventsConfig`` keys, validated, and the hand-off to the Rust publisher.

The publisher itself (vLLM's ZMQ wire format, the bounded queue and its thread, the replay socket,
the wire block grain) lives in the ``yoco-events`` crate; this module only reads the settings and
starts it on the scheduler, so a bad key fails at startup with a message naming it.

Keys (vLLM's, with vLLM's defaults): ``enable_kv_cache_events`` (False), ``publisher`` ("null" or
"zmq"), ``endpoint`` ("tcp://*:5557"; bound when it holds ``*``, ``::`` or ``ipc://``, connected
otherwise), ``replay_endpoint`` (None), ``buffer_steps`` (10000), ``hwm`` (100000),
``max_queue_size`` (100000), ``topic`` (""). Added here: ``encoding`` ("array", vLLM's documented
positional events, which llm-d decodes; "map", events tagged by ``type``, which vllm-router 0.1.17
requires), ``block_size`` (16, the tokens per wire block; must divide the engine's prefix-cache
sub-block size), ``data_parallel_rank`` (None; behind ``--data-parallel-size N`` rank r publishes this + r on its own
endpoint, see ``for_rank``), ``medium`` ("GPU"), ``all_groups`` (False: one
logical block stream, see below).

YOCO: only the self-decoder layers own KV, so an event describes one logical token block for all of
them. With several KV groups (sliding and full attention) the first full-attention group is
published, untagged; ``all_groups: true`` publishes every group with its ``group_idx`` instead.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Union

_ENCODINGS = ("array", "map")
_PUBLISHERS = ("null", "zmq")


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    encoding: str = "array"
    block_size: int = 16
    data_parallel_rank: Optional[int] = None
    medium: str = "GPU"
    all_groups: bool = False

    @property
    def active(self) -> bool:
        """Events are collected and published (vLLM: enabled and a real publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, value: Union[None, str, dict, "KVEventsConfig"]) -> Optional["KVEventsConfig"]:
        """From a JSON string (the CLI form), a dict or a config; raises ValueError naming the bad key."""
        if value is None or isinstance(value, KVEventsConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"kv_events_config: not valid JSON ({e.msg} at position {e.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"kv_events_config: expected a JSON object, got {type(value).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"kv_events_config: unknown key(s) {unknown}; known: {sorted(names)}")
        cfg = cls(**value)
        cfg._validate()
        return cfg

    def _validate(self) -> None:
        def bad(key: str, want: str) -> ValueError:
            return ValueError(f"kv_events_config.{key}: expected {want}, got {getattr(self, key)!r}")

        for key in ("enable_kv_cache_events", "all_groups"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "true or false")
        if self.publisher not in _PUBLISHERS:
            raise bad("publisher", "one of " + ", ".join(_PUBLISHERS))
        if self.encoding not in _ENCODINGS:
            raise bad("encoding", "one of " + ", ".join(_ENCODINGS))
        for key in ("endpoint", "topic", "medium"):
            if not isinstance(getattr(self, key), str):
                raise bad(key, "a string")
        for key in ("endpoint", "replay_endpoint"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, str) and v.startswith(("tcp://", "ipc://"))):
                raise bad(key, "a tcp:// or ipc:// endpoint")
        for key, lo in (("buffer_steps", 0), ("hwm", 0), ("max_queue_size", 1), ("block_size", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(key, f"an integer >= {lo}")
        r = self.data_parallel_rank
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
            raise bad("data_parallel_rank", "an integer >= 0 or null")

    def for_rank(self, rank: int) -> "KVEventsConfig":
        """The settings of data-parallel rank ``rank`` behind one front end (vLLM's convention): its own
        endpoints (``offset_endpoint``) and ``data_parallel_rank`` = the configured one (0 if unset) +
        ``rank`` in every batch, so a router's indexer tells the ranks' blocks apart. Rank 0 keeps the
        endpoints as given."""
        base = self.data_parallel_rank or 0
        return dataclasses.replace(self, endpoint=offset_endpoint(self.endpoint, rank),
                                   replay_endpoint=offset_endpoint(self.replay_endpoint, rank),
                                   data_parallel_rank=base + rank)

    def start(self, scheduler: Any) -> None:
        """Starts the Rust publisher on ``scheduler`` (built with ``enable_kv_events=True``)."""
        group: Optional[int] = None
        if not self.all_groups:
            groups = scheduler.kv_groups()
            group = next((i for i, g in enumerate(groups) if g["kind"] == "full"), 0)
        scheduler.start_kv_events(
            self.endpoint, replay_endpoint=self.replay_endpoint, buffer_steps=self.buffer_steps, hwm=self.hwm,
            max_queue_size=self.max_queue_size, topic=self.topic, encoding=self.encoding,
            block_size=self.block_size, group=group, data_parallel_rank=self.data_parallel_rank,
            medium=self.medium)


def offset_endpoint(endpoint: Optional[str], rank: int) -> Optional[str]:
    """Data-parallel rank ``rank``'s endpoint (vLLM's ``offset_endpoint_port``): a ``tcp://`` port plus
    ``rank``, an ``ipc://``/``inproc://`` path with ``_dp{rank}`` appended; rank 0 and None unchanged."""
    if endpoint is None or rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{rank}"
    host, sep, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not port.isdigit():
        raise ValueError(f"kv_events_config.endpoint: {endpoint!r} has no port to offset for data-parallel rank {rank}")
    if int(port) + rank > 65535:
        raise ValueError(f"kv_events_config.endpoint: port {port} + data-parallel rank {rank} exceeds 65535")
    return f"{host}:{int(port) + rank}"


__all__ = ["KVEventsConfig", "offset_endpoint"]
