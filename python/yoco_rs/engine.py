"""``Engine``: the synchronous face of yoco-rs (vLLM's ``LLM`` + ``LLMEngine``).

One step: ``core.schedule()`` -> ``ForwardBatch`` (zero-copy views of the plan) -> ``executor.execute``
-> ``Sampler`` (all rows at once, on the device) -> ``core.update(sampled)`` -> Rust detokenizer and
stop strings (finishing requests through the core) -> ``RequestOutput``s. Python work per step is
O(1) calls plus O(requests that produced output), never O(tokens).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence, Union

from yoco_rs.config import EngineConfig
from yoco_rs.inputs import PromptType
from yoco_rs.metrics import EngineMetrics
from yoco_rs.outputs import RequestOutput
from yoco_rs.sampling_params import SamplingParams
from yoco_rs.tokenizer import Tokenizer

Messages = Sequence[dict]


class Engine:
    """Generate text with a Gemma 3n checkpoint.

    >>> engine = Engine()                        # the bundled tiny model, offline
    >>> out = engine.generate("Hello", SamplingParams(max_tokens=8, temperature=0))
    >>> out[0].outputs[0].text

    ``Engine(model, **settings)``: ``settings`` are ``EngineConfig`` fields (``max_model_len``,
    ``max_num_seqs``, ``block_size``, ``kv_sharing_fast_prefill``, ...), named like vLLM's flags.
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, *, config: Optional[EngineConfig] = None,
                 **settings) -> None:
        if config is not None and (model is not None or settings):
            raise TypeError("pass either config=EngineConfig(...) or model/settings, not both")
        self.config_in = config if config is not None else EngineConfig.from_kwargs(
            os.fspath(model) if model is not None else None, **settings)
        raise NotImplementedError("Engine: loop not implemented yet")

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        return cls(config=config)

    # ---- what the engine runs ------------------------------------------------------------------
    config: EngineConfig
    """The resolved config: every ``None`` replaced by the value in use."""
    model_name: str
    """The checkpoint directory's name (``"yoco-tiny"`` for the bundled model)."""
    max_model_len: int
    kv_capacity_tokens: int
    """Tokens the KV pool holds (per group, the smallest)."""

    # ---- offline generation ------------------------------------------------------------------------
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        priority: Optional[Sequence[int]] = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in prompt order.

        ``prompts``: one prompt or a list (str, token-id list, or ``{"prompt"|"prompt_token_ids",
        "cache_salt"?}``). ``sampling_params``: one for all or one per prompt (default
        ``SamplingParams()``). A progress bar shows for batches when ``use_tqdm``. Invalid input raises
        ``ValueError`` before anything runs.
        """
        raise NotImplementedError

    def chat(
        self,
        messages: Union[Messages, Sequence[Messages]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[dict] = None,
    ) -> list[RequestOutput]:
        """``generate`` over conversations rendered with the checkpoint's chat template.
        ``messages`` is one conversation (a list of ``{"role", "content"}``) or a list of them."""
        raise NotImplementedError

    # ---- step-level API (what AsyncEngine drives) ---------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                    priority: int = 0, arrival_time: Optional[float] = None) -> list[int]:
        """Validate, tokenize and queue one request (``n`` core sequences); returns the prompt ids.
        ``ValueError`` for bad input (prompt too long, logprobs over ``max_logprobs``, duplicate id)."""
        raise NotImplementedError

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests in any state; their blocks are freed at once. Unknown ids are ignored.
        The next ``step()`` reports them finished with ``finish_reason="abort"``."""
        raise NotImplementedError

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the outputs it produced (per each request's ``output_kind``)."""
        raise NotImplementedError

    def has_unfinished_requests(self) -> bool:
        raise NotImplementedError

    def get_num_unfinished_requests(self) -> int:
        raise NotImplementedError

    # ---- tokenizer ----------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        raise NotImplementedError

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Messages, **kwargs) -> Union[str, list[int]]:
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    # ---- observability and control -----------------------------------------------------------------
    def get_metrics(self) -> EngineMetrics:
        """A consistent snapshot of counters, gauges and histograms (safe from any thread)."""
        raise NotImplementedError

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix; False while requests hold blocks."""
        raise NotImplementedError

    def take_kv_events(self) -> list:
        """KV cache events since the last call (needs ``enable_kv_events``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Abort everything and release the executor's memory."""
        raise NotImplementedError

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Engine"]
