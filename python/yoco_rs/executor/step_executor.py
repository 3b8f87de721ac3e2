"""``StepExecutor``: the model, the sampler and the per-request sampling state, stepped by a Rust
step loop (``yoco_server``'s ``Executor`` trait, bound by ``crates/yoco-py/src/step_executor.rs``).
``yoco-serve`` runs one per step loop; ``AsyncEngine`` runs one under its ``_core.EngineLoop``.
"""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
import torch

from yoco_rs.executor.batch import plan_batch
from yoco_rs.executor.grammar_mask import apply_token_bitmask_
from yoco_rs.executor.sampler import RowParams, derive_seed, logprobs_topk
from yoco_rs.runtime import Runtime

_NO_OUTPUT = np.zeros(0, dtype=np.int64)


class StepExecutor:
    """The model, the sampler and the per-request sampling state, stepped by the Rust loop.

    ``launch(plan, tables, resumed, masks, scoring)`` runs the forward and samples (on a GPU both are
    enqueued and the call returns at once); ``collect()`` returns what the step produced, copying it to
    the host: the sampled ids as an int32 array, or, when logprobs were asked, ``(sampled,
    sample_logprobs, prompt_logprobs)`` (``yoco_server::executor::StepOutput``'s flat arrays; see
    ``collect``). ``tables[g]`` is KV group g's block-table rows of the plan (``[R, cols]`` int32);
    ``resumed`` maps the requests the plan resumes after a preemption to their outputs so far (the
    sampler restores their penalty counts and random streams from them); ``masks`` is the step's
    ``_core.StepMasks`` (None when no sampling row is constrained); ``scoring`` is ``(rows int64,
    targets int64, k)``, the logits rows whose prompt token's logprob (and top ``k``) to report, or
    None.

    With async scheduling the plan of step N+1 is built before step N's update: its decodes whose
    step-N token was unknown carry placeholders (``plan.placeholder_indices`` into ``input_ids``, read
    from ``plan.placeholder_sources`` of step N's sampled ids). The loop launches N+1 only after
    collecting N, so the ids are on the host: they are written into a copy of the plan's ``input_ids``
    (the plan's own buffers are shared with Rust and read-only) before the batch reaches the device,
    which is also what the host-resident per-layer embeddings are gathered by. A plan with grammar
    masks never has placeholders (the loop does not plan ahead while a constrained request is live),
    so the ids ``collect`` returned after the masks are the ones placeholders read."""

    def __init__(self, rt: Runtime):
        self._runner = rt.runner
        self._sampler = rt.sampler
        self._eos = list(rt.tokenizer.eos_token_ids)
        self._engine_seed = int(rt.config.seed)
        self._counter = itertools.count(1)
        self._params: dict[int, RowParams] = {}
        self._prompts: dict[int, np.ndarray] = {}
        self._out = None
        self._prompt_lp = None
        self._prev: np.ndarray = np.zeros(0, dtype=np.int32)  # the ids the last collect() returned
        self._mm = rt.executor.mm  # per-request image / audio items (None: a text-only checkpoint)
        self.last_error: Optional[BaseException] = None
        """What the last failed ``launch``/``collect`` raised: the Rust loop sees only its text, so
        ``AsyncEngine`` chains this object as the cause of the errors its callers get."""

    def add_request(self, req_id: int, prompt: np.ndarray, *, temperature: float, top_p: float, top_k: int,
                    min_p: float, seed: Optional[int], min_tokens: int, ignore_eos: bool,
                    stop_token_ids: list, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    repetition_penalty: float = 1.0, logprobs: int = -1, mm_items=None) -> None:
        mask_ids = list(stop_token_ids) + ([] if ignore_eos else self._eos)
        self._params[req_id] = RowParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repetition_penalty=repetition_penalty,
            seed=seed if seed is not None else derive_seed(self._engine_seed, next(self._counter)),
            min_tokens=min_tokens, min_tokens_ids=mask_ids, logprobs=logprobs)
        self._prompts[req_id] = prompt
        if mm_items and self._mm is not None:
            self._mm.add(req_id, mm_items)

    def remove_request(self, req_id: int) -> None:
        self._params.pop(req_id, None)
        self._prompts.pop(req_id, None)
        if self._mm is not None:
            self._mm.remove(req_id)

    def num_media_requests(self) -> int:
        """Requests whose image / audio items are registered (0 once every media request ended)."""
        return 0 if self._mm is None else self._mm.num_requests()

    def launch(self, plan, tables: list, resumed: dict, masks=None, scoring=None) -> None:
        try:
            self._launch(plan, tables, resumed, masks, scoring)
        except BaseException as e:
            self._failed(e)
            raise

    def collect(self):
        """The sampled ids (int32 ``[S]``), or ``(sampled, sample_logprobs, prompt_logprobs)``:
        ``sample_logprobs = (rows int32[L], logprob float32[L], rank int32[L], top_ids int32[L, K],
        top_logprobs float32[L, K])`` for the L sampling rows whose request asked (``rows`` index
        ``sample_rows``), ``prompt_logprobs`` the same without ``rows`` for the scored prompt positions;
        either is None when not asked."""
        try:
            return self._collect()
        except BaseException as e:
            self._failed(e)
            raise

    def _failed(self, e: BaseException) -> None:
        """A failed step: keep the exception; after an allocation failure hand the allocator's cached
        blocks back so the next step can fit (the loop fails only this step's requests)."""
        self.last_error = e
        self._out = self._prompt_lp = None
        if is_oom(e) and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _launch(self, plan, tables: list, resumed: dict, masks, scoring) -> None:
        ids = plan.admitted_ids
        if len(ids):
            ids = ids.tolist()
            self._sampler.set_rows(plan.admitted_rows.tolist(), [self._params[i] for i in ids],
                                   [self._prompts[i] for i in ids], [resumed.get(i, _NO_OUTPUT) for i in ids])
        batch = plan_batch(plan, [torch.from_numpy(t) for t in tables])
        input_ids = plan.input_ids
        if plan.num_placeholders:
            ids = batch.input_ids.clone()
            ids[torch.from_numpy(plan.placeholder_indices).long()] = torch.from_numpy(
                self._prev[plan.placeholder_sources]).to(ids.dtype)
            batch.input_ids = ids
            if self._mm is not None:
                input_ids = np.array(input_ids)
                input_ids[plan.placeholder_indices] = self._prev[plan.placeholder_sources]
        if self._mm is not None:  # image / audio embeddings of this step's chunks, as Engine builds them
            batch.mm_overlay = self._mm.overlay(plan.req_ids, plan.query_start_loc, plan.seq_lens, input_ids,
                                                int(plan.num_tokens))
        logits = self._runner.execute(batch)
        cross_pos = plan.logits_cross_pos
        if masks is not None:
            rows, bitmask = masks.take()  # computed while the forward ran; waits with the GIL released
            if len(rows):
                apply_token_bitmask_(logits, bitmask, np.asarray(cross_pos, dtype=np.int64)[rows])
        self._prompt_lp = None
        if scoring is not None:
            xs, targets, k = scoring
            lp = torch.log_softmax(logits.index_select(0, torch.from_numpy(xs).to(logits.device)).float(), dim=-1)
            self._prompt_lp = logprobs_topk(lp, torch.from_numpy(targets).to(logits.device), int(k))
        self._out = self._sampler.sample(logits, cross_pos, plan.req_rows[plan.sample_rows])

    def _collect(self):
        so, plp = self._out, self._prompt_lp
        self._out = self._prompt_lp = None
        sampled = np.ascontiguousarray(so.sampled.numpy(), dtype=np.int32)
        self._prev = sampled  # what the next plan's placeholders read
        if so.lp_idx is None and plp is None:
            return sampled
        slp = None
        if so.lp_idx is not None:
            slp = (_i32(so.lp_idx), _f32(so.sampled_logprobs), _i32(so.sampled_ranks), _i32(so.topk_ids),
                   _f32(so.topk_logprobs))
        if plp is not None:
            ids, vals, tgt, rank = plp
            plp = (_f32(tgt), _i32(rank), _i32(ids), _f32(vals))
        return sampled, slp, plp


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def is_oom(e: BaseException) -> bool:
    """An allocation failure (host or device)."""
    return isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)) or "out of memory" in str(e).lower()


def async_scheduling_on(flag: Optional[bool], device: torch.device) -> bool:
    """``--async-scheduling`` as given, else on where the forward runs asynchronously to the host (CUDA).

    On the CPU the forward runs inside ``launch``: there is nothing to overlap, and a step planned ahead
    would hold each token back until the next forward ends (one extra step of latency per token, TTFT
    included). vLLM does not schedule asynchronously on the CPU either. ``--async-scheduling`` still forces
    it (the tests use it to run the real executor on placeholders)."""
    return flag if flag is not None else device.type == "cuda"


__all__ = ["StepExecutor", "async_scheduling_on", "is_oom"]
