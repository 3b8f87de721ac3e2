"""``Engine``: the synchronous face of yoco-rs (vLLM's ``LLM`` + ``LLMEngine``).

One step: ``core.schedule()`` -> ``ForwardBatch`` (zero-copy views of the plan) -> ``executor.execute``
-> ``Sampler`` (all rows at once, on the device) -> ``core.update(sampled)`` -> Rust ``TextBatch``
(incremental detokenization, stop strings; matches finish through the core) -> ``RequestOutput``s.
Python work per step is O(1) calls plus O(requests that stream, finish or were admitted), never
O(tokens).

Not thread-safe: one thread drives an ``Engine`` (``AsyncEngine`` runs it in its own thread).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import torch

from yoco_rs import _core
from yoco_rs.config import EngineConfig
from yoco_rs.executor.batch import ForwardBatch, plan_batch
from yoco_rs.executor.sampler import RowParams, derive_seed, logprobs_topk
from yoco_rs.grammar_state import GrammarState
from yoco_rs.inputs import PromptType, is_single_prompt
from yoco_rs.metrics import EngineMetrics, MetricsRecorder
from yoco_rs.outputs import RequestOutput
from yoco_rs.request_prep import RequestPreparer
from yoco_rs.request_state import FINISH_NAMES, RequestState, SeqState, position_logprobs
from yoco_rs.runtime import build_runtime
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.tokenizer import Tokenizer

Messages = Sequence[dict]
_FINISH_ABORT = 4
_FINISH_STOP_STRING = 5


class Engine:
    """Generate text with a Gemma 3n checkpoint.

    >>> engine = Engine()                        # the bundled tiny model, offline
    >>> out = engine.generate("Hello", SamplingParams(max_tokens=8, temperature=0))
    >>> out[0].outputs[0].text

    ``Engine(model, **settings)``: ``settings`` are ``EngineConfig`` fields (``max_model_len``,
    ``max_num_seqs``, ``block_size``, ``kv_sharing_fast_prefill``, ...), named like vLLM's flags.
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, *, config: Optional[EngineConfig] = None,
                 progress: bool = False, **settings) -> None:
        if config is not None and (model is not None or settings):
            raise TypeError("pass either config=EngineConfig(...) or model/settings, not both")
        cfg = config if config is not None else EngineConfig.from_kwargs(
            os.fspath(model) if model is not None else None, **settings)
        rt = build_runtime(cfg, progress=progress)
        self._rt = rt
        self.config: EngineConfig = rt.config
        self.model_name: str = rt.model_name
        self.max_model_len: int = rt.config.max_model_len
        self.kv_capacity_tokens: int = rt.kv_capacity_tokens
        self.memory_split: str = rt.memory_split
        """How device memory was split (weights / step / KV), as the startup line prints it."""
        self.vocab_size: int = rt.vocab_size
        """Token ids in ``[0, vocab_size)`` are valid prompt tokens."""
        self._sched = rt.scheduler
        self._exec = rt.executor
        self._runner = rt.runner
        self._fast_prefill = bool(rt.config.kv_sharing_fast_prefill)
        self.sampling_defaults: dict = dict(rt.sampling_defaults)
        """Default sampling fields from the checkpoint's generation config (``generation_config``)."""
        self._sampler = rt.sampler
        self._text = rt.text
        self._tok = rt.tokenizer
        self._tables = self._sched.block_tables()
        self._eos = list(self._tok.eos_token_ids)
        n = rt.config.max_num_seqs
        self._row_seq: list[Optional[SeqState]] = [None] * n
        self._row_stream = np.zeros(n, dtype=bool)
        self._row_last_time = np.zeros(n, dtype=np.float64)
        self._requests: dict[str, RequestState] = {}
        self._seqs: dict[int, SeqState] = {}
        self._plp: dict[int, SeqState] = {}  # seqs still owed prompt logprobs
        self._ids = itertools.count(1)
        self._rid = itertools.count()
        self._pending_outputs: list[RequestOutput] = []
        self._metrics = MetricsRecorder()
        self._core_stats: dict = self._sched.stats()
        self._closed = False
        self._last_plan_rows = 0
        self.last_failed_request_ids: list[str] = []
        """The requests the last failed ``step()`` aborted (``AsyncEngine`` fails their streams)."""
        self._grammar_failed: list[int] = []
        self._grammars = GrammarState(rt.tokenizer.tokenizer_file, rt.vocab_size, self._eos,
                                      limits=rt.config.structured_outputs_config)
        self._preparer = RequestPreparer(rt, self._grammars)
        self.mm_processor = rt.mm_processor
        """Image / audio preprocessing of a multimodal checkpoint (None for a text-only model)."""
        self._mm = rt.executor.mm  # the executor's per-request items and encoder cache

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """An engine from a complete ``EngineConfig`` (a server builds one from its flags)."""
        return cls(config=config)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the generation config's defaults (vLLM's ``LLM`` method of that
        name): what ``generate`` uses when given no sampling parameters."""
        return SamplingParams(**self.sampling_defaults)

    # ---- offline generation ----------------------------------------------------------------------
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
        ``get_default_sampling_params()``). A progress bar shows for batches when ``use_tqdm``. Invalid input raises
        ``ValueError`` before anything runs.
        """
        plist = [prompts] if is_single_prompt(prompts) else list(prompts)
        n = len(plist)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or self.get_default_sampling_params()] * n
        else:
            params = list(sampling_params)
            if len(params) != n:
                raise ValueError(f"sampling_params has {len(params)} entries for {n} prompts; give one or one per prompt")
        if priority is not None and len(priority) != n:
            raise ValueError(f"priority has {len(priority)} entries for {n} prompts")
        final = {}
        for p in params:
            if id(p) not in final:
                if not isinstance(p, SamplingParams):
                    raise ValueError(f"sampling_params entries must be SamplingParams, got {type(p).__name__}")
                final[id(p)] = p.replace(output_kind=RequestOutputKind.FINAL_ONLY)
        prepared = [self._prepare(prompt, final[id(p)]) for prompt, p in zip(plist, params)]
        ids = []
        try:
            for i, (proc, p) in enumerate(prepared):
                rid = f"gen-{next(self._rid)}"
                self._add_prepared(rid, proc, p, priority[i] if priority is not None else 0, time.monotonic())
                ids.append(rid)
        except BaseException:
            self.abort_request(ids)
            self._pending_outputs.clear()
            raise
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = None
        if use_tqdm and n > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc="Processed prompts", dynamic_ncols=True)
        idle = 0
        try:
            while len(results) < n:
                outs = self.step()
                idle = 0 if outs or self._last_plan_rows else idle + 1
                if idle > 1000:
                    raise RuntimeError("the scheduler planned nothing for 1000 steps with requests pending")
                for out in outs:
                    if out.finished and out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                if len(results) < n and not self.has_unfinished_requests():
                    raise RuntimeError("engine stopped with requests unfinished (a scheduler bug)")
        except BaseException:
            self.abort_request([r for r in ids if r not in results])
            self._pending_outputs.clear()
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[r] for r in ids]

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
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in convs:
            text = self._tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                 chat_template=chat_template, **(chat_template_kwargs or {}))
            prompts.append({"prompt": text, "prompt_token_ids": self._tok.hf.encode(text, add_special_tokens=False).ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    # ---- step-level API -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                    priority: int = 0, arrival_time: Optional[float] = None) -> list[int]:
        """Validate, tokenize and queue one request (``n`` core sequences); returns the prompt ids.
        ``ValueError`` for bad input (prompt too long, logprobs over ``max_logprobs``, duplicate id)."""
        proc, params = self._prepare(prompt, params or self.get_default_sampling_params())
        self._add_prepared(request_id, proc, params, priority,
                           arrival_time if arrival_time is not None else time.monotonic())
        return proc.token_ids

    def _prepare(self, prompt: PromptType, params: SamplingParams):
        """Thread-safe validation and tokenization (``RequestPreparer.prepare``)."""
        return self._preparer.prepare(prompt, params)

    def _add_prepared(self, request_id: str, proc, params: SamplingParams, priority: int, arrival: float) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        prompt_np = np.asarray(proc.token_ids, dtype=np.int32)
        req = RequestState(request_id, proc.prompt, prompt_np, params, arrival, priority)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt_np)
        base_seed = params.seed if params.seed is not None else derive_seed(self.config.seed, next(self._ids))
        stop_ids = list(params.stop_token_ids or ())
        mask_ids = stop_ids + ([] if params.ignore_eos else self._eos)
        first: Optional[int] = None
        added: list[int] = []
        items = proc.mm_items
        mm_placeholders = sorted(it.placeholder() for it in items)
        try:
            for i in range(params.n):
                cid = next(self._ids)
                rp = RowParams(
                    temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                    presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                    repetition_penalty=params.repetition_penalty, seed=base_seed + i, min_tokens=params.min_tokens,
                    min_tokens_ids=mask_ids, logprobs=params.logprobs if params.logprobs is not None else -1)
                seq = SeqState(cid, i, req, rp)
                plp = params.prompt_logprobs is not None and i == 0
                self._sched.add_request(
                    cid, prompt_np, max_tokens=max_tokens, min_tokens=params.min_tokens, eos_token_ids=self._eos,
                    stop_token_ids=stop_ids, ignore_eos=params.ignore_eos, priority=priority,
                    cache_salt=proc.cache_salt, prompt_logprobs=plp, after=first, mm_placeholders=mm_placeholders)
                added.append(cid)
                if items:
                    self._mm.add(cid, items)
                if getattr(proc, "grammar", None) is not None:
                    self._grammars.add(cid, proc.grammar)
                self._text.add(cid, proc.token_ids, skip_special_tokens=params.skip_special_tokens,
                               include_stop_str_in_output=params.include_stop_str_in_output,
                               stop=params.stop or [], stream=seq.stream, detokenize=params.detokenize)
                if first is None:
                    first = cid
                req.seqs.append(seq)
                self._seqs[cid] = seq
                if plp:
                    self._plp[cid] = seq
        except BaseException:
            for cid in added:
                self._sched.abort(cid)
                if self._mm is not None:
                    self._mm.remove(cid)
                self._text.remove(cid)
                self._grammars.remove(cid)
                self._seqs.pop(cid, None)
                self._plp.pop(cid, None)
            raise
        self._requests[request_id] = req

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests in any state; their blocks are freed at once. Unknown ids are ignored.
        The next ``step()`` reports them finished with ``finish_reason="abort"``."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        now = time.monotonic()
        aborted = False
        for rid in ids:
            req = self._requests.get(rid)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.finished:
                    self._sched.abort(seq.core_id)
                    self._finish_seq(seq, _FINISH_ABORT, None, now)  # keeps the partial text
            self._pending_outputs.append(req.output())
            aborted = True
        if aborted:  # the gauges (running, waiting, blocks) show the freed blocks at once
            self._core_stats = self._sched.stats()

    def has_unfinished_requests(self) -> bool:
        """Whether ``step()`` still has work or outputs to hand out (drive the loop until False)."""
        return bool(self._requests) or bool(self._pending_outputs)

    def get_num_unfinished_requests(self) -> int:
        """Requests queued or running (a request with ``n > 1`` counts once)."""
        return len(self._requests)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the outputs it produced (per each request's ``output_kind``).

        If the step fails (the executor raised, say), the exception propagates after the requests the
        step ran were aborted and the core completed the step: the engine stays usable, and the next
        ``step()`` returns those requests finished with ``finish_reason="abort"``."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if self.last_failed_request_ids:
            self.last_failed_request_ids = []
        plan = self._sched.schedule()
        self._last_plan_rows = plan.num_rows
        if plan.num_rows == 0:
            self._core_stats = self._sched.stats()
            return outputs
        updated = False
        try:
            now = time.monotonic()
            self._admit(plan, now)
            rows = plan.req_rows[plan.sample_rows]
            batch = self._forward_batch(plan)
            self._grammars.start(plan)  # constrained rows' masks, computed while the forward runs
            logits = self._runner.execute(batch)
            self._grammars.apply(plan, logits)
            so = self._sampler.sample(logits, plan.logits_cross_pos, rows)
            if self._plp:
                self._prompt_logprobs(plan, logits)
            sampled = so.sampled.numpy()
            outcome = self._sched.update(sampled)
            updated = True
            self._grammars.advance(outcome)
            self._grammar_failed += self._grammars.take_failed()
            now = time.monotonic()
            self._after_update(plan, rows, so, outcome, now, outputs)
        except BaseException as e:
            self._fail_step(plan, updated, e, outputs)
            raise
        m = self._metrics
        with m.lock:
            m.counters["num_steps"] += 1
            m.counters["scheduled_tokens"] += int(plan.num_tokens)
            # Rows that ran the cross-decoder: the selection with fast prefill, every token without.
            m.counters["cross_rows"] += int(plan.num_cross if self._fast_prefill else plan.num_tokens)
            m.counters["generation_tokens"] += len(outcome)
            m.hist["iteration_tokens"].observe(int(plan.num_tokens))
        self._core_stats = self._sched.stats()
        return outputs

    # ---- step internals -----------------------------------------------------------------------------
    def _fail_step(self, plan, updated: bool, err: BaseException, outputs: list) -> None:
        """Recover from an exception raised while a plan was in flight (executor, sampler, update, or
        the bookkeeping after it), so the engine stays usable.

        Every request with a row in the plan is aborted (all its completions: their KV may be half
        written, and a partial result would pass for a good one), the plan is completed with a dummy
        ``update`` when it was not yet (the core skips rows whose request is gone, then releases the
        step's copy-source pins), and the aborted requests finish with ``finish_reason="abort"``.
        Their final outputs, with what this step had already produced, come back from the next
        ``step()``; the caller of this one gets the exception, with a note naming the requests.
        Requests outside the plan (waiting, or preempted by it) are untouched."""
        now = time.monotonic()
        failed: dict[str, RequestState] = {}
        for cid in plan.req_ids.tolist():
            seq = self._seqs.get(cid)
            if seq is not None and self._requests.get(seq.req.request_id) is seq.req:
                failed[seq.req.request_id] = seq.req
        for req in failed.values():
            for seq in req.seqs:
                if not seq.finished:
                    self._sched.abort(seq.core_id)
                    self._finish_seq(seq, _FINISH_ABORT, None, now)
        if not updated:
            # Sampled ids are ignored for aborted rows; they only need to be valid token ids.
            self._sched.update(np.zeros(int(plan.num_samples), dtype=np.int32))
        self._pending_outputs = outputs + [req.output() for req in failed.values()] + self._pending_outputs
        self._core_stats = self._sched.stats()
        self.last_failed_request_ids = list(failed)
        names = ", ".join(map(repr, failed)) or "none"
        try:
            err.add_note(f"yoco_rs: this engine step failed; the requests it ran were aborted "
                         f"(finish_reason='abort'): {names}. The engine remains usable.")
        except Exception:
            pass

    def _admit(self, plan, now: float) -> None:
        for cid in plan.preempted_ids.tolist():
            seq = self._seqs.get(cid)
            if seq is not None:
                seq.req.metrics.num_preemptions += 1
                if seq.row >= 0 and self._row_seq[seq.row] is seq:
                    self._row_seq[seq.row] = None
                seq.row = -1
        ids = plan.admitted_ids
        if not len(ids):
            return
        seqs, rows, params, prompts, outs = [], [], [], [], []
        prompt_tokens = 0
        for cid, row, cached in zip(ids.tolist(), plan.admitted_rows.tolist(), plan.admitted_num_cached.tolist()):
            seq = self._seqs[cid]
            seq.row = row
            self._row_seq[row] = seq
            self._row_stream[row] = seq.stream
            req = seq.req
            if not seq.admitted:
                seq.admitted = True
                if req.metrics.first_scheduled_time is None:
                    req.metrics.first_scheduled_time = now
                    prompt_tokens += len(req.prompt_ids)
                req.num_cached_tokens = max(req.num_cached_tokens, cached)
                req.metrics.num_cached_tokens = req.num_cached_tokens
                out = np.zeros(0, dtype=np.int64)
            else:
                out = self._text.token_ids(cid)
                if len(out):
                    self._row_last_time[row] = now
            rows.append(row)
            params.append(seq.row_params)
            prompts.append(req.prompt_ids)
            outs.append(out)
        self._sampler.set_rows(rows, params, prompts, outs)
        if prompt_tokens:
            with self._metrics.lock:
                self._metrics.counters["prompt_tokens"] += prompt_tokens

    def _forward_batch(self, plan) -> ForwardBatch:
        rows = plan.req_rows
        ncols = min(self._tables[0].shape[1], -(-int(plan.max_seq_len) // self.config.block_size) + 1)
        batch = plan_batch(plan, [torch.from_numpy(np.ascontiguousarray(t[rows, :ncols])) for t in self._tables])
        if self._mm is not None:  # image / audio embeddings of this step's chunks (executor/mm_inputs.py)
            batch.mm_overlay = self._mm.overlay(plan.req_ids, plan.query_start_loc, plan.seq_lens, plan.input_ids,
                                                int(plan.num_tokens))
        return batch

    def _prompt_logprobs(self, plan, logits: torch.Tensor) -> None:
        """Logprobs of the prompt positions this step computed, for requests that asked (the core
        selected all their scheduled prompt rows for the cross-decoder)."""
        req_ids = plan.req_ids
        cq, sl = plan.cross_query_start_loc, plan.seq_lens
        for cid, seq in list(self._plp.items()):
            hit = np.nonzero(req_ids == cid)[0]
            if not len(hit):
                continue
            r = int(hit[0])
            x0, x1 = int(cq[r]), int(cq[r + 1])
            plen = len(seq.req.prompt_ids)
            # Cross row x0 + j holds position sl - nx + j and predicts the token at position
            # first_pred + j; keep the predicted prompt positions not seen yet (a preempted request
            # recomputes its prompt).
            first_pred = int(sl[r]) - (x1 - x0) + 1
            lo = max(first_pred, seq.plp_next)
            hi = min(int(sl[r]) + 1, plen)
            if hi > lo:
                xs = torch.arange(x0 + lo - first_pred, x0 + hi - first_pred, device=logits.device)
                lp = torch.log_softmax(logits.index_select(0, xs).float(), dim=-1)
                targets = torch.from_numpy(seq.req.prompt_ids[lo:hi].astype(np.int64)).to(logits.device)
                k = seq.req.params.prompt_logprobs
                ids, vals, tgt, rank = logprobs_topk(lp, targets, k)
                texts = self._decode_texts(np.concatenate([ids.reshape(-1), seq.req.prompt_ids[lo:hi]]))
                pl = seq.req.prompt_logprobs
                for j in range(hi - lo):
                    pl.append(position_logprobs(seq.req.prompt_ids[lo + j], tgt[j], rank[j], ids[j], vals[j], k, texts))
                seq.plp_next = hi
            if seq.plp_next >= plen:
                del self._plp[cid]

    def _decode_texts(self, ids: np.ndarray) -> dict[int, str]:
        uniq = np.unique(ids).tolist()
        return dict(zip(uniq, self._text.decode_each(uniq)))

    def _after_update(self, plan, rows: np.ndarray, so, outcome, now: float, outputs: list) -> None:
        ids = outcome.req_ids
        k = len(ids)
        if k == 0:
            return
        toks, fin = outcome.new_tokens, outcome.finish_reasons
        if k != len(rows) or not np.array_equal(ids, plan.req_ids[plan.sample_rows]):
            raise RuntimeError("scheduler outcome does not match the plan's sampling rows")
        didx, deltas, sidx, swhich = self._text.step(ids, toks, fin)
        fin = fin.copy()
        stop_strings: dict[int, str] = {}
        if self._grammar_failed:
            # A grammar that failed (token rejected, or a mask over llguidance's per-step budget) ends its
            # sequence with finish_reason "abort": the output is a prefix, not a valid document.
            failed = set(self._grammar_failed)
            hit = np.nonzero(np.isin(ids, list(failed)))[0].tolist()
            for kk in hit:
                if fin[kk] == 0:
                    self._sched.finish(int(ids[kk]), _FINISH_ABORT)
                fin[kk] = _FINISH_ABORT
            # Ones not sampled this step are ended when they next are (until then their mask is EOS only).
            left = failed - {int(ids[kk]) for kk in hit}
            self._grammar_failed = [i for i in left if i in self._seqs]
        for kk, w in zip(sidx.tolist(), swhich.tolist()):
            seq = self._seqs[int(ids[kk])]
            if fin[kk] == 0:
                self._sched.finish(seq.core_id, _FINISH_STOP_STRING)
            fin[kk] = _FINISH_STOP_STRING
            stop_strings[kk] = seq.req.params.stop[w]

        # Timings: first tokens (TTFT) and inter-token gaps, vectorized over rows.
        num_out = self._sampler.num_out[rows]
        firsts = np.nonzero(num_out == 1)[0]
        later = np.nonzero(num_out > 1)[0]
        m = self._metrics
        ttfts = []
        for kk in firsts.tolist():
            req = self._seqs[int(ids[kk])].req
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
                ttfts.append(now - req.metrics.arrival_time)
        with m.lock:
            if ttfts:
                m.hist["time_to_first_token"].observe_many(np.asarray(ttfts))
            if len(later):
                m.hist["inter_token_latency"].observe_many(now - self._row_last_time[rows[later]])
        self._row_last_time[rows] = now

        # Logprobs of the sampled tokens.
        if so.lp_idx is not None:
            texts = self._decode_texts(np.concatenate([so.topk_ids.reshape(-1), toks[so.lp_idx]]))
            for j, kk in enumerate(so.lp_idx.tolist()):
                seq = self._seqs[int(ids[kk])]
                kq = seq.req.params.logprobs
                d = position_logprobs(toks[kk], so.sampled_logprobs[j], so.sampled_ranks[j], so.topk_ids[j],
                                      so.topk_logprobs[j], kq, texts)
                seq.logprobs.append(d)
                seq.delta_logprobs.append(d)
                seq.cumulative_logprob += float(so.sampled_logprobs[j])

        # Streaming completions: token ids and text deltas.
        touched: dict[str, list[SeqState]] = {}
        streaming = np.nonzero(self._row_stream[rows])[0]
        if len(streaming):
            delta_of = dict(zip(didx.tolist(), deltas))
            for kk in streaming.tolist():
                seq = self._seqs[int(ids[kk])]
                t = int(toks[kk])
                seq.token_ids.append(t)
                seq.delta_token_ids.append(t)
                d = delta_of.get(kk)
                if d:
                    seq.text += d
                    seq.delta_text += d
                touched.setdefault(seq.req.request_id, []).append(seq)

        # Finished completions.
        for kk in np.nonzero(fin)[0].tolist():
            seq = self._seqs[int(ids[kk])]
            self._finish_seq(seq, int(fin[kk]), stop_strings.get(kk, int(toks[kk]) if fin[kk] == 2 else None), now)
            touched.setdefault(seq.req.request_id, [])
            if seq not in touched[seq.req.request_id]:
                touched[seq.req.request_id].append(seq)

        for rid, seqs in touched.items():
            req = self._requests.get(rid) or seqs[0].req
            if req.params.output_kind == RequestOutputKind.FINAL_ONLY and not req.finished:
                continue
            outputs.append(req.output(seqs))

    def _finish_seq(self, seq: SeqState, code: int, stop_reason, now: float) -> None:
        seq.finished = True
        seq.finish_reason = FINISH_NAMES[code]
        seq.stop_reason = stop_reason
        taken = self._text.take(seq.core_id)
        self._grammars.remove(seq.core_id)
        if taken is not None and not seq.stream:
            seq.text, ids = taken
            seq.token_ids = ids.tolist()
        if seq.row >= 0 and self._row_seq[seq.row] is seq:
            self._row_seq[seq.row] = None
            self._row_stream[seq.row] = False
        self._plp.pop(seq.core_id, None)
        self._seqs.pop(seq.core_id, None)
        if self._mm is not None:
            self._mm.remove(seq.core_id)
        req = seq.req
        req.num_finished += 1
        if req.finished and not req.done:
            req.done = True
            self._requests.pop(req.request_id, None)
            mt = req.metrics
            mt.finished_time = now
            mt.num_generation_tokens = sum(len(s.token_ids) for s in req.seqs)
            if mt.first_token_time is not None:
                mt.last_token_time = now
            m = self._metrics
            with m.lock:
                reason = req.seqs[0].finish_reason
                m.request_success[reason] = m.request_success.get(reason, 0) + 1
                m.hist["e2e_request_latency"].observe(now - mt.arrival_time)
                if mt.queue_time is not None:
                    m.hist["request_queue_time"].observe(mt.queue_time)
                if mt.prefill_time is not None:
                    m.hist["request_prefill_time"].observe(mt.prefill_time)
                if mt.decode_time is not None:
                    m.hist["request_decode_time"].observe(mt.decode_time)
                m.hist["request_prompt_tokens"].observe(mt.num_prompt_tokens)
                m.hist["request_generation_tokens"].observe(mt.num_generation_tokens)

    # ---- tokenizer ----------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The checkpoint's tokenizer, for callers who build prompts themselves."""
        return self._tok

    def get_tokenizer(self) -> Tokenizer:
        """The checkpoint's tokenizer (vLLM's ``LLM.get_tokenizer``)."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Prompt token ids of ``text`` as the engine would tokenize it (``<bos>`` first by default)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, as the engine detokenizes outputs."""
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Messages, **kwargs) -> Union[str, list[int]]:
        """Render a conversation with the checkpoint's chat template (text, or ids with ``tokenize=True``)."""
        return self._tok.apply_chat_template(messages, **kwargs)

    # ---- observability and control --------------------------------------------------------------------
    def get_metrics(self) -> EngineMetrics:
        """A consistent snapshot of counters, gauges and histograms (safe from any thread: the core's
        figures are those of the last step)."""
        return self._metrics.snapshot(self._core_stats)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix; False while requests hold blocks."""
        return self._sched.reset_prefix_cache()

    def take_kv_events(self) -> list:
        """KV cache events since the last call (needs ``enable_kv_events``)."""
        return self._sched.take_kv_events()

    def check_invariants(self) -> None:
        """The core's structural invariants (tests; O(pool)). Raises AssertionError."""
        self._sched.check_invariants()

    def close(self) -> None:
        """Abort everything and release the executor's memory."""
        if self._closed:
            return
        self.abort_request(list(self._requests))
        self._pending_outputs.clear()
        self._closed = True
        self._sched.stop_kv_events()  # flush and close the KV-event sockets (frees their ports now)
        self._runner = None  # captured graphs hold the KV tensors
        self._exec.kv_caches = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Engine"]
