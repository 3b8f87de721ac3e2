"""The sampler: every sampling request of a step at once, on the logits' device, no per-request loop.

Per-request parameters live in host arrays indexed by the core's persistent ``req_rows`` and are
written once per admission (``set_rows``, O(new requests)); each step gathers them for the sampling
rows with one numpy fancy index and ships them in two small tensors. Penalty state (output token
counts, the prompt's token set) lives on the device, ``[max_num_seqs, vocab]``, allocated on first use.

Order, as vLLM V1: raw logprobs (what ``logprobs`` reports) -> min_tokens (mask EOS and stop ids) ->
repetition / frequency / presence penalties -> greedy argmax, or temperature -> min-p -> top-k ->
top-p -> sample (V1 applies min-p in its logits processors, before the top-k/top-p sampler).

Sampling is an argmax of ``log p - log E`` with ``E ~ Exp(1)`` (the Gumbel-max trick in exponential
form). The noise is a counter-based hash of (request seed, output index, vocabulary id), so a seeded
request samples the same tokens whatever else is in the batch, in whichever row, after preemption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from yoco_rs.sampling_params import GREEDY_EPS

_M32 = 0xFFFFFFFF


@dataclass
class RowParams:
    """One core request's sampling parameters (derived from ``SamplingParams`` by the engine)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    min_tokens: int = 0
    min_tokens_ids: Sequence[int] = ()
    """Ids masked while fewer than ``min_tokens`` were generated (EOS unless ignore_eos, stop ids)."""
    logprobs: int = -1
    """Top logprobs to return per sampled token; -1: none."""


@dataclass
class SampleOutput:
    """What one ``Sampler.sample`` call returns: the sampled ids and, for rows that asked, their logprobs
    (numpy, ready for the engine's output objects)."""

    sampled: torch.Tensor
    """[S] int32 on the CPU: one token per sampling request, in ``sample_rows`` order."""
    lp_idx: Optional[np.ndarray] = None
    """[L] positions (into the S) that asked for logprobs; the arrays below are per L."""
    topk_ids: Optional[np.ndarray] = None
    """[L, K] int64 most likely ids (K = max asked; row i uses its first ``logprobs`` entries)."""
    topk_logprobs: Optional[np.ndarray] = None
    sampled_logprobs: Optional[np.ndarray] = None
    """[L] logprob of the sampled token."""
    sampled_ranks: Optional[np.ndarray] = None
    """[L] 1-based rank of the sampled token."""


def _mix32_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) & _M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & _M32
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & _M32
    x ^= x >> np.uint64(16)
    return x


def row_keys(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """32-bit noise key of each (seed, output index) pair (int64 holding a uint32)."""
    s = seeds.astype(np.uint64)
    k = _mix32_np(s & _M32) ^ _mix32_np((s >> np.uint64(32)) ^ np.uint64(0x68E31DA4))
    k = _mix32_np(k ^ _mix32_np(counters.astype(np.uint64) * np.uint64(0x9E3779B9) + np.uint64(0x7F4A7C15)))
    return k.astype(np.int64)


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic on values < 2**32; products wrap mod 2**64 and only the low 32 bits are kept.
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32 in (0, 1): a hash of (row key, vocabulary id); identical on every device."""
    v = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    h = _mix32_t((keys[:, None] ^ ((v * 0x27D4EB2F) & _M32)[None, :]) & _M32)
    h = _mix32_t(h ^ 0x165667B1)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def logprobs_topk(logprobs: torch.Tensor, targets: torch.Tensor, k: int):
    """Top-k ids and logprobs, and each target's logprob and 1-based rank, as numpy arrays."""
    tgt = logprobs.gather(1, targets.view(-1, 1)).squeeze(1)
    rank = (logprobs > tgt[:, None]).sum(1) + 1
    if k > 0:
        vals, ids = logprobs.topk(k, dim=1)
    else:
        vals = logprobs.new_zeros(logprobs.shape[0], 0)
        ids = targets.new_zeros(logprobs.shape[0], 0)
    return ids.cpu().numpy(), vals.cpu().numpy(), tgt.cpu().numpy(), rank.cpu().numpy()


class Sampler:
    """Samples one token per sampling request of a step (see the module doc)."""

    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device | str = "cpu"):
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        n = max_num_seqs
        # Host state, indexed by req_rows.
        self.f32 = np.zeros((7, n), dtype=np.float32)  # temperature, top_p, min_p, presence, frequency, repetition, greedy
        self.f32[0] = 1.0
        self.f32[1] = 1.0
        self.f32[5] = 1.0
        self.top_k = np.zeros(n, dtype=np.int64)
        self.seed = np.zeros(n, dtype=np.int64)
        self.min_tokens = np.zeros(n, dtype=np.int64)
        self.num_out = np.zeros(n, dtype=np.int64)
        self.logprobs = np.full(n, -1, dtype=np.int64)
        self.stop_ids = np.full((n, 1), vocab_size, dtype=np.int64)  # padded with vocab_size
        # Device penalty state, allocated on first use.
        self.counts: Optional[torch.Tensor] = None
        self.prompt_mask: Optional[torch.Tensor] = None

    # ---- per admission -------------------------------------------------------------------------
    def set_rows(self, rows: Sequence[int], params: Sequence[RowParams], prompts: Sequence[np.ndarray],
                 outputs: Sequence[np.ndarray]) -> None:
        """(Re)initialize the rows of newly admitted or resumed requests. ``outputs`` are the tokens a
        resumed request already generated (empty for new ones): they restore its penalty counts and its
        position in its random stream."""
        if not len(rows):
            return
        r = np.asarray(rows, dtype=np.int64)
        self.f32[:, r] = np.array(
            [[p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
              1.0 if p.temperature < GREEDY_EPS else 0.0] for p in params], dtype=np.float32).T
        # Guard rails: top_k beyond the vocabulary is the whole vocabulary (no int64 overflow), seeds
        # are reduced to 63 bits.
        self.top_k[r] = [min(p.top_k, self.vocab_size) if p.top_k > 0 else 0 for p in params]
        self.seed[r] = [p.seed & ((1 << 63) - 1) for p in params]
        self.min_tokens[r] = [p.min_tokens for p in params]
        self.num_out[r] = [len(o) for o in outputs]
        self.logprobs[r] = [p.logprobs for p in params]
        width = max((len(p.min_tokens_ids) for p in params if p.min_tokens > 0), default=0)
        if width > self.stop_ids.shape[1]:
            grown = np.full((self.max_num_seqs, width), self.vocab_size, dtype=np.int64)
            grown[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = grown
        self.stop_ids[r] = self.vocab_size
        for row, p in zip(r.tolist(), params):
            if p.min_tokens > 0 and len(p.min_tokens_ids):
                self.stop_ids[row, : len(p.min_tokens_ids)] = p.min_tokens_ids
        pen = [(i, p) for i, p in enumerate(params)
               if p.presence_penalty != 0 or p.frequency_penalty != 0 or p.repetition_penalty != 1]
        if pen:
            self._ensure_penalty_state()
            for i, p in pen:
                row = int(r[i])
                out = torch.as_tensor(np.asarray(outputs[i], dtype=np.int64), device=self.device)
                self.counts[row] = torch.bincount(out, minlength=self.vocab_size)[: self.vocab_size].to(torch.int32)
                self.prompt_mask[row] = False
                pr = torch.as_tensor(np.asarray(prompts[i], dtype=np.int64), device=self.device)
                self.prompt_mask[row, pr] = True

    def _ensure_penalty_state(self) -> None:
        if self.counts is None:
            self.counts = torch.zeros(self.max_num_seqs, self.vocab_size, dtype=torch.int32, device=self.device)
            self.prompt_mask = torch.zeros(self.max_num_seqs, self.vocab_size, dtype=torch.bool, device=self.device)

    # ---- per step --------------------------------------------------------------------------------
    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, cross_pos: np.ndarray, rows: np.ndarray) -> SampleOutput:
        """``logits`` [X, V] (float32, the executor's cross rows); ``cross_pos`` [S] which of them sample;
        ``rows`` [S] the sampling requests' ``req_rows``."""
        s = len(rows)
        if s == 0:
            return SampleOutput(torch.zeros(0, dtype=torch.int32))
        dev = logits.device
        rows = np.asarray(rows, dtype=np.int64)
        f = self.f32[:, rows]  # [7, S]
        greedy = f[6] > 0
        cross_pos = np.asarray(cross_pos, dtype=np.int64)
        mt = np.nonzero(self.min_tokens[rows] > self.num_out[rows])[0]
        pen = np.nonzero((f[3] != 0) | (f[4] != 0) | (f[5] != 1))[0]
        if logits.shape[0] == s and not len(mt) and not len(pen) and np.array_equal(cross_pos, np.arange(s)):
            lg = logits.float()  # pure decode, nothing edits the logits in place: no copy
        else:
            lg = logits.index_select(0, torch.from_numpy(cross_pos).to(dev, non_blocking=True)).float()
        V = lg.shape[1]
        out = SampleOutput(sampled=None)  # type: ignore[arg-type]

        # Raw logprobs (before any processing), for the rows that asked.
        lp_rows = np.nonzero(self.logprobs[rows] >= 0)[0]
        raw_lp = torch.log_softmax(lg.index_select(0, _t(lp_rows, dev)), dim=-1) if len(lp_rows) else None

        # min_tokens: EOS and stop ids cannot be sampled yet.
        if len(mt):
            ids = _t(self.stop_ids[rows[mt]], dev)
            sub = torch.nn.functional.pad(lg.index_select(0, _t(mt, dev)), (0, 1))
            sub.scatter_(1, ids, float("-inf"))
            lg[_t(mt, dev)] = sub[:, :V]

        # Penalties.
        if len(pen) and self.counts is not None:
            pr = _t(rows[pen], dev)
            pt = _t(pen, dev)
            counts = self.counts.index_select(0, pr)
            seen_out = counts > 0
            sub = lg.index_select(0, pt)
            fp = torch.from_numpy(f[3:6, pen]).to(dev)
            rep = fp[2][:, None]
            seen = seen_out | self.prompt_mask.index_select(0, pr)
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
            sub = sub - fp[1][:, None] * counts.to(sub.dtype) - fp[0][:, None] * seen_out.to(sub.dtype)
            lg[pt] = sub

        sampled = torch.empty(s, dtype=torch.int64, device=dev)
        g = np.nonzero(greedy)[0]
        if len(g) == s:
            sampled = lg.argmax(dim=-1)
        elif len(g):
            gt = _t(g, dev)
            sampled[gt] = lg.index_select(0, gt).argmax(dim=-1)
        rnd = np.nonzero(~greedy)[0]
        if len(rnd):
            rt = _t(rnd, dev)
            fr = torch.from_numpy(f[:3, rnd]).to(dev)
            x = lg.index_select(0, rt) / fr[0][:, None]
            x = min_p_filter(x, fr[2], f[2, rnd])
            top_k = self.top_k[rows[rnd]]
            if (top_k > 0).any() or (f[1, rnd] < 1).any():
                vals, idx = x.sort(dim=-1, descending=True)
                k = torch.from_numpy(np.where(top_k > 0, top_k, V)).to(dev)
                pos = torch.arange(V, device=dev)[None, :]
                vals = vals.masked_fill(pos >= k[:, None], float("-inf"))
                probs = vals.softmax(dim=-1)
                # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
                drop = (probs.cumsum(dim=-1) - probs) > fr[1][:, None]
                vals = vals.masked_fill(drop, float("-inf"))
                x = torch.full_like(x, float("-inf")).scatter_(1, idx, vals)
            keys = torch.from_numpy(row_keys(self.seed[rows[rnd]], self.num_out[rows[rnd]])).to(dev)
            e = -torch.log(uniform_noise(keys, V))
            sampled[rt] = (x - torch.log(e)).argmax(dim=-1)

        if len(pen) and self.counts is not None:
            self.counts.index_put_((_t(rows[pen], dev), sampled.index_select(0, _t(pen, dev))),
                                   torch.ones(len(pen), dtype=torch.int32, device=dev), accumulate=True)
        self.num_out[rows] += 1

        if raw_lp is not None:
            k = int(self.logprobs[rows[lp_rows]].max())
            ids, vals, tgt, rank = logprobs_topk(raw_lp, sampled.index_select(0, _t(lp_rows, dev)), k)
            out.lp_idx, out.topk_ids, out.topk_logprobs = lp_rows, ids, vals
            out.sampled_logprobs, out.sampled_ranks = tgt, rank
        out.sampled = sampled.to(torch.int32).cpu()
        return out


def min_p_filter(x: torch.Tensor, min_p: torch.Tensor, min_p_host: np.ndarray) -> torch.Tensor:
    """Mask the tokens whose probability (softmax of the temperature-scaled ``x``) is below ``min_p``
    times the most likely one's; rows with ``min_p == 0`` are unchanged."""
    if not (min_p_host > 0).any():
        return x
    probs = x.softmax(dim=-1)
    return x.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), float("-inf"))


def _t(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev, non_blocking=True)


def derive_seed(engine_seed: int, counter: int) -> int:
    """A per-request seed from the engine seed and the request's submission counter (splitmix64)."""
    z = (engine_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & ((1 << 62) - 1)


__all__ = ["Sampler", "RowParams", "SampleOutput", "uniform_noise", "row_keys", "logprobs_topk", "derive_seed"]
