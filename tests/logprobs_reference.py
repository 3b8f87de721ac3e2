"""The reference formatting of logprobs for the serving tests (the retired Python server's
``serve/logprobs.py``): an independent implementation of what the Rust front end answers. Logprobs in
the two OpenAI shapes: completions (``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``) and chat (``content: [{token, logprob, bytes, top_logprobs}]``), plus vLLM's
``prompt_logprobs`` (per prompt position: null or ``{token_id: {logprob, rank, decoded_token}}``)."""

from __future__ import annotations

import math
from typing import Optional, Sequence


class TokenText:
    """Token id -> display string (the engine's ``decoded_token``, else the tokenizer's decode)."""

    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        self._cache: dict[int, str] = {}

    def __call__(self, tid: int, lp=None) -> str:
        if self.as_ids:
            return f"token_id:{tid}"
        if lp is not None and getattr(lp, "decoded_token", None) is not None:
            return lp.decoded_token
        s = self._cache.get(tid)
        if s is None:
            s = self._cache[tid] = self.tokenizer.decode([tid], skip_special_tokens=False)
        return s


def _f(x: float) -> float:
    """JSON has no -inf: clamp like vLLM (-9999.0)."""
    return x if math.isfinite(x) else -9999.0


def _ranked(pos: dict) -> list:
    return sorted(pos.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30, -kv[1].logprob))


class CompletionLogprobs:
    """Accumulates the completions form for one choice (streaming sends each delta on its own)."""

    def __init__(self, text: TokenText):
        self.text = text
        self.offset = 0

    def block(self, token_ids: Sequence[int], logprobs: Optional[Sequence[Optional[dict]]],
              first_is_prompt_start: bool = False) -> dict:
        """The completions-form logprobs of ``token_ids`` (with each position's top tokens), continuing the
        choice's text offsets."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for j, tid in enumerate(token_ids):
            pos = logprobs[j] if logprobs is not None and j < len(logprobs) else None
            lp = pos.get(tid) if pos else None
            s = self.text(tid, lp)
            tokens.append(s)
            token_lps.append(_f(lp.logprob) if lp is not None else None)
            tops.append({self.text(t, l): _f(l.logprob) for t, l in _ranked(pos)} if pos else None)
            offsets.append(self.offset)
            self.offset += len(s)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def merge_blocks(a: dict, b: dict) -> dict:
    """One completions-form logprobs object from two (echoed prompt, then generated text)."""
    return {k: a[k] + b[k] for k in a}


def chat_logprobs(token_ids: Sequence[int], logprobs: Optional[Sequence[dict]], top_n: int,
                  text: TokenText) -> dict:
    """The chat-form logprobs (``content`` entries with bytes and the ``top_n`` alternatives) of ``token_ids``."""
    content = []
    for j, tid in enumerate(token_ids):
        pos = logprobs[j] if logprobs is not None and j < len(logprobs) else {}
        lp = pos.get(tid)
        s = text(tid, lp)
        top = []
        for t, l in _ranked(pos)[:top_n]:
            ts = text(t, l)
            top.append({"token": ts, "logprob": _f(l.logprob), "bytes": list(ts.encode("utf-8"))})
        content.append({"token": s, "logprob": _f(lp.logprob) if lp is not None else -9999.0,
                        "bytes": list(s.encode("utf-8")), "top_logprobs": top})
    return {"content": content}


def prompt_logprobs_json(plp) -> Optional[list]:
    """vLLM's ``prompt_logprobs`` JSON: per prompt position null (the first) or ``{token_id: {logprob,
    rank, decoded_token}}``."""
    if plp is None:
        return None
    out = []
    for pos in plp:
        if pos is None:
            out.append(None)
        else:
            out.append({str(t): {"logprob": _f(l.logprob), "rank": l.rank, "decoded_token": l.decoded_token}
                        for t, l in pos.items()})
    return out


__all__ = ["TokenText", "CompletionLogprobs", "merge_blocks", "chat_logprobs", "prompt_logprobs_json"]
