"""Type stubs of the ``yoco_rs._core`` extension module (crates/yoco-py).

Per engine step: one ``Scheduler.schedule()`` and one ``Scheduler.update()``. Arrays are numpy views of
Rust buffers (no copies); ``schedule``/``update``/``add_request`` release the GIL while Rust works.
Field meanings: ``crates/yoco-core/src/sched/plan.rs``.
"""

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

__version__: str

NOT_FINISHED: int
"""0: ``StepOutcome.finish_reasons`` code of a request still running."""
FINISH_STOP: int
"""1: EOS sampled."""
FINISH_STOP_TOKEN: int
"""2: a stop token id sampled."""
FINISH_LENGTH: int
"""3: max_tokens reached, or max_model_len."""
FINISH_ABORT: int
"""4: aborted by the engine."""
FINISH_STOP_STRING: int
"""5: finished by the engine after a stop string matched."""

class CapacityError(ValueError):
    """The KV pool can never hold the request (prompt + max_tokens, capped at max_model_len)."""

class EngineDied(RuntimeError):
    """``serve_http``: every step loop stopped after too many failed steps in a row (the last one's error)."""

def mask_logits(logits: np.ndarray, rows: np.ndarray, bitmask: np.ndarray) -> None:
    """``logits[rows[i], t] = -inf`` where row ``i`` of ``bitmask`` (``[C, words]`` int32) disallows ``t``;
    in place on C-contiguous float32 ``[X, V]`` host logits (GIL released)."""

def linear_f32(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], y: npt.NDArray[np.float32], kc: int,
               threads: int) -> None:
    """``y[M, N] = x[M, K] @ w[N, K]^T`` (``yoco_cpu``: sequential FMA chains over blocks of ``kc`` terms,
    the same bits for any M); ``w`` row-major or K-major. ValueError names a shape that does not line up."""
def linear_bf16(x: npt.NDArray[np.uint16], w: npt.NDArray[np.uint16], y: npt.NDArray[np.uint16], kc: int,
                threads: int) -> None:
    """The same on bf16 bits: widened, the f32 order, rounded once to bf16."""
def cpu_linear_available() -> bool:
    """Whether this CPU runs the kernel (x86-64 with AVX2 and FMA)."""


def serve_http(
    loops: list[tuple["Scheduler", object]], *, tokenizer_file: str, eos_token_ids: list[int],
    bos_token_id: int | None, host: str, port: int, served_model_names: list[str], max_model_len: int,
    vocab_size: int, api_keys: list[str] = ..., max_n: int = 16, max_prompts_per_request: int = 256,
    max_request_body_bytes: int = ..., metrics_prefix: str = "yoco", max_consecutive_failures: int = 8,
    async_scheduling: bool = True, on_ready: object | None = None, chat_template: str | None = None,
    special_tokens: list[tuple[str, str]] = ..., trust_request_chat_template: bool = False,
    chat_template_timeout: float = 2.0, chat_template_content_format: str = "auto",
    sampling_defaults: list[tuple[str, float]] = ...,
    compat_metric_names: bool = False, allowed_origins: list[str] = ..., return_tokens_as_token_ids: bool = False,
    version: str | None = None, cache_config_info: list[tuple[str, str]] = ..., kv_sharing_fast_prefill: bool = True,
    max_logprobs: int = 20, structured_outputs_config: dict | None = None,
) -> None:
    """Serve the OpenAI API from Rust (``crates/yoco-server``) until SIGINT/SIGTERM, GIL released. ``loops``:
    one ``(scheduler, executor)`` per step loop; the executor has ``add_request``, ``remove_request``,
    ``launch(plan, tables, resumed, masks, scoring)`` and ``collect()`` (``serve.rust_frontend.StepExecutor``
    documents both). ``async_scheduling``: plan step N+1 while N runs (its plan's placeholder inputs are filled
    by the executor from the ids its last ``collect`` returned; not while a structured-output request is live).
    ``on_ready(url)`` is called once the port is bound. ``chat_template`` is the template chat
    renders with (``--chat-template`` or the checkpoint's), ``special_tokens`` its ``bos_token``/``eos_token``/...
    values, ``sampling_defaults`` the generation config's defaults, ``cache_config_info`` the labels of that
    metric, ``structured_outputs_config`` the engine's (compile budgets, ``disable_any_whitespace``)."""
    ...

class StepMasks:
    """The token bitmasks of one step's constrained sampling rows, computed on the grammar pool while the
    forward runs (handed to ``StepExecutor.launch`` by the Rust serving path)."""

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait (GIL released) and return ``(rows int64[C], bitmask int32[C, words])``: ``rows`` are positions
        into the plan's ``sample_rows``; bit ``t % 32`` of word ``t // 32`` allows token ``t``."""
        ...

class EngineLoop:
    """The Rust step loop (the one ``serve_http`` runs) over one ``StepExecutor``. Scheduling,
    detokenization, stop strings and grammar masks in Rust; the executor called once per step with the GIL
    held only for that call. On its own thread (``AsyncEngine``), or with ``manual=True`` stepped by the
    caller, one synchronous step per ``step()`` (``Engine``)."""

    def __init__(self, scheduler: "Scheduler", executor: Any, *, tokenizer_file: str, eos_token_ids: list[int],
                 vocab_size: int, max_consecutive_failures: int = 3, async_scheduling: bool = False,
                 manual: bool = False) -> None: ...
    def submit(self, prompt: list[int], max_tokens: int, *, min_tokens: int = 0, ignore_eos: bool = False,
               stop_token_ids: list[int] = ..., stop: list[str] = ..., include_stop_str: bool = False,
               skip_special_tokens: bool = True, stream: bool = True, detokenize: bool = True, cache_salt: Optional[str] = None,
               priority: int = 0, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               min_p: float = 0.0, seed: Optional[int] = None, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, logprobs: Optional[int] = None,
               prompt_logprobs: Optional[int] = None, grammar: Optional["CompiledGrammar"] = None,
               mm_placeholders: list[tuple[int, int, str]] = ..., mm_items: Any = None,
               after: Optional[int] = None) -> int:
        """Queue one completion; its loop id. ``EngineDied`` once a threaded loop has stopped.
        ``detokenize=False``: its events carry token ids and empty text. ``after``: a sibling completion's
        loop id whose prompt this one waits for and reuses."""
        ...
    def abort(self, id: int) -> None:
        """Abort a request (a manual loop frees its blocks before returning)."""
        ...
    def poll(self, timeout: float) -> list[tuple]:
        """Wait up to ``timeout`` s (GIL released) for events: ``(id, token_id | None, text, logprob | None,
        prompt_logprobs | None)`` deltas and ``(id, finished: dict)`` ends. A manual loop returns at once."""
        ...
    def step(self) -> tuple[bool, Optional[str]]:
        """Manual loops: run one step; ``(ran, error)``, ``error`` the failed step's message."""
        ...
    def num_unfinished(self) -> int:
        """Manual loops: requests submitted and not yet ended."""
        ...
    def check_invariants(self) -> None:
        """Manual loops: the scheduler's invariants and the loop's per-request tables (AssertionError)."""
        ...
    def reset_prefix_cache(self) -> bool:
        """Manual loops: drop every cached prefix; False while requests hold blocks."""
        ...
    def take_kv_events(self) -> list[dict]:
        """Manual loops: KV events since the last call (as ``Scheduler.take_kv_events``)."""
        ...
    def is_dead(self) -> bool: ...
    def dead_error(self) -> Optional[str]: ...
    def stats(self) -> dict:
        """``EngineMetrics``' fields; a histogram as ``(bounds, per-bucket counts, sum)``."""
        ...
    def shutdown(self) -> None: ...

class GrammarBusyError(RuntimeError):
    """Too many grammars are compiling at once (``max_in_flight``); retry later (a server answers 503)."""

class StepPlan:
    """One step's plan: R rows, T tokens (T_pad padded), S samplers, X cross rows (X_pad padded), C copies.

    Every array attribute is a zero-copy numpy view of a Rust buffer, created per access in O(1) (fetch
    each once per step); views keep the plan alive. When the plan and its views are gone, the scheduler
    reuses the buffers. Do not write into the views.
    """

    @property
    def step_id(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def num_placeholders(self) -> int:
        """P: inputs to fill from the previous step's sampled ids (async scheduling; 0 otherwise)."""
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_tokens_padded(self) -> int: ...
    @property
    def num_cross(self) -> int: ...
    @property
    def num_cross_padded(self) -> int: ...
    @property
    def max_query_len(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def req_ids(self) -> npt.NDArray[np.uint64]:
        """[R] request id of each row."""
    @property
    def req_rows(self) -> npt.NDArray[np.int32]:
        """[R] persistent row (block tables) of each row."""
    @property
    def query_start_loc(self) -> npt.NDArray[np.int32]:
        """[R+1] prefix sums of scheduled tokens."""
    @property
    def seq_lens(self) -> npt.NDArray[np.int32]:
        """[R] context length after this step."""
    @property
    def input_ids(self) -> npt.NDArray[np.int32]:
        """[T_pad] token ids (padding 0)."""
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """[T_pad] positions (padding 0)."""
    @property
    def placeholder_indices(self) -> npt.NDArray[np.int32]:
        """[P] token indices whose input id is the previous step's sample (``input_ids`` holds 0 there)."""
    @property
    def placeholder_sources(self) -> npt.NDArray[np.int32]:
        """[P] index into the previous step's sampled ids for each placeholder."""
    @property
    def slot_mapping(self) -> npt.NDArray[np.int64]:
        """[G, T_pad] KV slot per group and token (padding: slot 0 of block 0)."""
    @property
    def kv_copies(self) -> npt.NDArray[np.int32]:
        """[C, 4] (group, src_block, dst_block, num_tokens), applied before the forward."""
    @property
    def logits_indices(self) -> npt.NDArray[np.int32]:
        """[S] token index of each sampling request's last scheduled token."""
    @property
    def sample_rows(self) -> npt.NDArray[np.int32]:
        """[S] row of each sampling request."""
    @property
    def cross_indices(self) -> npt.NDArray[np.int32]:
        """[X_pad] token indices the cross-decoder computes; padding repeats the last."""
    @property
    def cross_query_start_loc(self) -> npt.NDArray[np.int32]:
        """[R+1] prefix sums of cross rows per row."""
    @property
    def logits_cross_pos(self) -> npt.NDArray[np.int32]:
        """[S] position of each sampling token within the cross rows."""
    @property
    def admitted_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def admitted_rows(self) -> npt.NDArray[np.int32]: ...
    @property
    def admitted_num_cached(self) -> npt.NDArray[np.int32]:
        """Prefix-cache hit (tokens) of each admitted request."""
    @property
    def preempted_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def dirty_rows(self) -> npt.NDArray[np.int32]:
        """Block-table rows changed since the previous plan (copy only these to the device)."""
    def __len__(self) -> int: ...

class StepOutcome:
    """What ``update`` did: K requests that received a token this step."""

    @property
    def req_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def new_tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def finish_reasons(self) -> npt.NDArray[np.uint8]:
        """0 = running, else a FINISH_* code."""
    @property
    def num_finished(self) -> int: ...
    def __len__(self) -> int: ...

class Scheduler:
    def __init__(
        self,
        layer_kinds: Sequence[str],
        *,
        num_blocks: int | Sequence[int],
        block_size: int = 16,
        sub_block_size: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 4096,
        long_prefill_token_threshold: int = 0,
        enable_prefix_caching: bool = True,
        policy: str = "fcfs",
        max_admission_skips: int = 16,
        token_capture_sizes: Sequence[int] = (),
        cross_capture_sizes: Sequence[int] = (),
        enable_kv_events: bool = False,
        hash_seed: bytes | None = None,
        max_num_encoder_input_tokens: int | None = None,
    ) -> None:
        """``layer_kinds``: per layer "full" | "sliding:W" | "shared:DONOR". ``num_blocks``: per KV group
        (block 0 included), or one int for all. ``max_num_encoder_input_tokens``: the step's encoder budget
        in multimodal soft tokens (None: ``max_num_batched_tokens``). Raises ValueError on a bad configuration."""
    def kv_groups(self) -> list[dict[str, Any]]:
        """Per KV group: {"kind": "full"|"sliding", "window": int|None, "layers": [...],
        "readers": [(layer, donor), ...]}; ``layers[i]`` is slice i of the group's KV tensor."""
    def add_request(
        self,
        req_id: int,
        prompt: npt.NDArray[np.int32] | npt.NDArray[np.uint32] | npt.NDArray[np.int64] | Sequence[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        eos_token_ids: Sequence[int] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        prompt_logprobs: bool = False,
        after: int | None = None,
        mm_placeholders: Sequence[tuple[int, int, str]] = (),
    ) -> None:
        """Queues a request. ValueError for a bad request, CapacityError if the pool can never hold it.
        ``mm_placeholders``: ``(offset, length, content hash)`` of each image / audio placeholder run (sorted,
        disjoint, inside the prompt): hashed into the prefix cache's keys and charged to the encoder budget."""
    def abort(self, req_id: int) -> bool: ...
    def finish(self, req_id: int, reason_code: int) -> bool: ...
    def schedule(self) -> StepPlan:
        """Plans the next step. RuntimeError if the previous non-empty plan awaits ``update``."""
    def update(self, sampled: npt.NDArray[np.int32] | Sequence[int]) -> StepOutcome:
        """One sampled id per ``logits_indices`` entry of the last plan."""
    def block_tables(self) -> list[npt.NDArray[np.int32]]:
        """Per group, the persistent [max_num_seqs, max_blocks_per_seq] table: views of Rust buffers that
        ``schedule()`` updates in place (rows listed in ``plan.dirty_rows``). Fetch once; never write."""
    @property
    def max_blocks_per_seq(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def num_unfinished(self) -> int: ...
    def contains(self, req_id: int) -> bool: ...
    def __contains__(self, req_id: int) -> bool: ...
    def stats(self) -> dict[str, int]:
        """running, waiting, preemptions, and every KV metric (blocks_total, blocks_free, ...)."""
    def take_kv_events(self) -> list[dict[str, Any]]: ...
    def reset_prefix_cache(self) -> bool: ...
    def start_kv_events(
        self, endpoint: str, *, replay_endpoint: Optional[str] = None, buffer_steps: int = 10000, hwm: int = 100000,
        max_queue_size: int = 100000, topic: str = "", encoding: str = "array", block_size: int = 16,
        group: Optional[int] = 0, data_parallel_rank: Optional[int] = None, medium: str = "GPU",
    ) -> None:
        """Publish KV events in vLLM's ZMQ wire format from now on (crates/yoco-events); needs
        ``enable_kv_events=True``. ValueError for bad settings or an endpoint that cannot be bound."""
    def stop_kv_events(self, timeout_s: float = 1.0) -> None: ...
    def kv_events_stats(self) -> dict[str, int]:
        """published, dropped (full queue), send_errors, log_dropped (the core's bounded log)."""
    def check_invariants(self) -> None:
        """Raises AssertionError naming the first broken invariant (tests; O(pool))."""

class MockExecutor:
    """Deterministic mock model (``yoco_core::mock``). With ``scheduler``: simulates paged KV through
    that scheduler's block tables, so any wrong plan changes the sampled stream."""

    def __init__(
        self,
        vocab_size: int,
        *,
        first_token: int = 0,
        scheduler: Scheduler | None = None,
        base_us: float = 0.0,
        per_token_us: float = 0.0,
        per_cross_row_us: float = 0.0,
        sleep: bool = False,
    ) -> None: ...
    def sample(self, plan: StepPlan) -> npt.NDArray[np.int32]: ...
    @property
    def modelled_us(self) -> float: ...
    @property
    def simulates_kv(self) -> bool: ...
    def reference_next(self, tokens: Sequence[int]) -> int: ...

# ---- yoco-text (engine) ----------------------------------------------------------------------

class TextBatch:
    """Incremental detokenization and stop strings for all live requests (crates/yoco-text)."""

    def __init__(self, tokenizer_json: str) -> None: ...
    def add(self, req_id: int, prompt: Sequence[int], *, skip_special_tokens: bool = True,
            include_stop_str_in_output: bool = False, stop: Sequence[str] = ..., stream: bool = False,
            detokenize: bool = True) -> None: ...
    def step(self, req_ids: npt.NDArray[np.uint64], tokens: npt.NDArray[np.int32], finish: npt.NDArray[np.uint8]
             ) -> tuple[npt.NDArray[np.uint32], list[str], npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
        """(delta_idx, deltas, stop_idx, stop_which) over the K inputs."""
    def text(self, req_id: int) -> str | None: ...
    def token_ids(self, req_id: int) -> npt.NDArray[np.int32] | None: ...
    def take(self, req_id: int) -> tuple[str, npt.NDArray[np.int32]] | None: ...
    def remove(self, req_id: int) -> bool: ...
    def __contains__(self, req_id: int) -> bool: ...
    def __len__(self) -> int: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def decode_each(self, ids: Sequence[int]) -> list[str]: ...


class CompiledGrammar:
    """A compiled structured-output constraint (crates/yoco-grammar); start matchers from it."""


class GrammarCompiler:
    """Compiles constraints with llguidance for one tokenizer, cached by canonical text, under a budget."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int], *, time_budget_ms: int = 10000,
                 max_grammar_size: int = 500000, initial_lexer_fuel: int = 1000000, max_in_flight: int = 4,
                 cache_size: int = 256) -> None: ...
    def compile(self, kind: str, text: str) -> CompiledGrammar:
        """kind: json | json_object | regex | choice (JSON list) | grammar (Lark). ValueError names the problem."""
    @property
    def cached(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_ids(self) -> list[int]: ...


class MatcherTable:
    """One matcher per constrained sequence; a step's packed int32 bitmasks, computed in the background."""

    def __init__(self, vocab_size: int, eos_ids: Sequence[int]) -> None: ...
    def add(self, seq_id: int, grammar: CompiledGrammar) -> None: ...
    def remove(self, seq_id: int) -> bool: ...
    def __len__(self) -> int: ...
    def __contains__(self, seq_id: int) -> bool: ...
    @property
    def words(self) -> int: ...
    def error(self, seq_id: int) -> str | None: ...
    def is_accepting(self, seq_id: int) -> bool: ...
    def start_masks(self, seq_ids: npt.NDArray[np.uint64], adv_ids: npt.NDArray[np.uint64] | None = None,
                    adv_tokens: npt.NDArray[np.int32] | None = None) -> None: ...
    def wait_masks(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], list[int]]:
        """(rows into the start_masks seq_ids, bitmask [C, words], failed sequence ids)."""
    def masks(self, seq_ids: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], list[int]]: ...
    def advance(self, seq_ids: npt.NDArray[np.uint64], tokens: npt.NDArray[np.int32]) -> list[int]: ...
