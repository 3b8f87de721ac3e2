"""``Tokenizer``: a checkpoint's ``tokenizer.json`` + ``tokenizer_config.json`` (special tokens, chat
template) without transformers. Encoding and whole-sequence decoding go through the ``tokenizers``
library; the engine's per-step incremental detokenization and stop strings run in Rust
(``yoco_rs._core.Detokenizer``) over the same ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from typing import Any, Optional, Sequence


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_str(v) -> Optional[str]:
    """tokenizer_config special tokens are strings or AddedToken dicts."""
    if v is None:
        return None
    if isinstance(v, dict):
        return v.get("content")
    return str(v)


class Tokenizer:
    """Encode, decode and apply the chat template of one checkpoint directory."""

    def __init__(self, path: str, *, model_config: Optional[dict] = None):
        from tokenizers import Tokenizer as HfTokenizer

        self.path = os.fspath(path)
        tok_file = os.path.join(self.path, "tokenizer.json")
        if not os.path.exists(tok_file):
            raise ValueError(f"no tokenizer.json in {self.path!r} (the tokenizer directory must hold one)")
        self.hf = HfTokenizer.from_file(tok_file)
        self.tokenizer_file = tok_file
        cfg = _read_json(os.path.join(self.path, "tokenizer_config.json"))
        gen = _read_json(os.path.join(self.path, "generation_config.json"))
        model_config = model_config if model_config is not None else _read_json(os.path.join(self.path, "config.json"))
        self.config = cfg
        self.chat_template: Optional[str] = cfg.get("chat_template")
        if self.chat_template is None and os.path.exists(os.path.join(self.path, "chat_template.jinja")):
            with open(os.path.join(self.path, "chat_template.jinja"), encoding="utf-8") as f:
                self.chat_template = f.read()
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        self.pad_token = _token_str(cfg.get("pad_token"))
        self.bos_token_id = self._id_or_none(self.bos_token)
        self.eos_token_id = self._id_or_none(self.eos_token)
        self.pad_token_id = self._id_or_none(self.pad_token)
        self.add_bos_token: bool = bool(cfg.get("add_bos_token", self.bos_token is not None))
        # EOS ids that stop generation: generation_config (Gemma: <eos> and <end_of_turn>), then the
        # model config, then the tokenizer's eos token.
        eos: list[int] = []
        for src in (gen.get("eos_token_id"), model_config.get("eos_token_id"), self.eos_token_id):
            if src is None:
                continue
            for t in src if isinstance(src, list) else [src]:
                if int(t) not in eos:
                    eos.append(int(t))
        self.eos_token_ids: list[int] = eos

    def _id_or_none(self, tok: Optional[str]) -> Optional[int]:
        return None if tok is None else self.hf.token_to_id(tok)

    # ---- vocabulary ------------------------------------------------------------------------------
    @cached_property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (may be below the model's vocabulary)."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @cached_property
    def all_special_ids(self) -> list[int]:
        """Ids of the special tokens (``<bos>``, ``<eos>``, turn markers...), which ``skip_special_tokens`` drops."""
        return sorted(i for i, t in self.hf.get_added_tokens_decoder().items() if t.special)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[Optional[str]]:
        """The vocabulary strings of ids (None for an id the tokenizer lacks), for ``/tokenize``'s ``token_strs``."""
        return [self.hf.id_to_token(int(i)) for i in ids]

    # ---- encode / decode ---------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` prepends ``<bos>`` (as HF does for Gemma).
        A text that already starts with the bos token (a rendered chat template) does not get a second one."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` over many texts in one call into the Rust tokenizer."""
        encs = self.hf.encode_batch(list(texts), add_special_tokens=False)
        out = []
        for e in encs:
            ids = e.ids
            if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
                if not ids or ids[0] != self.bos_token_id:
                    ids = [self.bos_token_id] + ids
            out.append(ids)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids in one piece (streaming text goes through the engine's incremental detokenizer instead)."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- chat --------------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        chat_template: Optional[str] = None,
        budget: Optional["TemplateBudget"] = None,
        chat_template_content_format: str = "auto",
        **kwargs,
    ) -> str | list[int]:
        """Render a conversation with the checkpoint's (or the given) Jinja chat template, as HF does:
        ``messages`` is a list of ``{"role", "content"}``; extra keyword arguments reach the template.
        ``budget`` bounds the rendering's time and size (``TemplateBudgetExceeded``, a ValueError).
        ``chat_template_content_format`` (vLLM's, and ``yoco-serve``'s flag): how a content given as a list
        of text parts reaches the template: "openai" as the list, "string" joined with newlines, "auto"
        as the template reads it (:func:`content_format`), the same rule as the Rust server's."""
        from yoco_rs.template_budget import render

        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(f"the tokenizer in {self.path!r} has no chat_template; pass chat_template=...")
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if "role" not in m:
                raise ValueError(f"messages[{i}] has no 'role'")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError("chat_template_content_format must be auto, string or openai, got "
                             f"{chat_template_content_format!r}")
        fmt = (content_format(template, budget) if chat_template_content_format == "auto"
               else chat_template_content_format)
        text = render(
            _compile(template), budget,
            messages=_with_content_format(messages, fmt),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            **kwargs,
        )
        if tokenize:
            # The template already wrote <bos>: encode without adding another.
            return self.hf.encode(text, add_special_tokens=False).ids
        return text


_PROBE = "yoco content format probe 7f3a"


def content_format(template: str, budget: Optional["TemplateBudget"] = None) -> str:
    """"openai" if ``template`` reads a list of text parts itself, else "string" (vLLM's
    ``--chat-template-content-format auto``). Decided as ``crates/yoco-server/src/content_format.rs``
    decides it: one user message rendered with its content as a string and as a one-part list; the same
    output, holding the text, means the template loops over the parts. The probe renders under
    ``budget`` (a template that runs past it reads "string", and is probed again next time); the answer
    is kept with the compiled template."""
    from yoco_rs.template_budget import TemplateBudgetExceeded, render

    t = _compile(template)
    fmt = getattr(t, "yoco_content_format", None)
    if fmt is not None:
        return fmt
    over = False

    def probe(content):
        nonlocal over
        try:
            return render(t, budget, messages=[{"role": "user", "content": content}], add_generation_prompt=True,
                          bos_token="", eos_token="", pad_token="", unk_token="", tools=None, documents=None)
        except TemplateBudgetExceeded:
            over = True
            return None
        except Exception:  # noqa: BLE001 - a template that fails on either form reads strings
            return None

    a = probe(_PROBE)
    b = None if over else probe([{"type": "text", "text": _PROBE}])
    fmt = "openai" if a is not None and a == b and _PROBE in a else "string"
    if not over:
        t.yoco_content_format = fmt
    return fmt


def _with_content_format(messages, fmt: str) -> list:
    """With "string", each content that is a list of text parts becomes them joined with newlines (lists
    holding images or audio keep their shape: the multimodal templates read parts)."""
    out = list(messages)
    if fmt == "string":
        for i, m in enumerate(out):
            c = m.get("content")
            if isinstance(c, (list, tuple)) and all(isinstance(p, dict) and p.get("type") == "text" for p in c):
                out[i] = {**m, "content": "\n".join(str(p.get("text", "")) for p in c)}
    return out


_TEMPLATES: dict[str, Any] = {}
_MAX_TEMPLATES = 32  # compiled templates kept (request-supplied ones would otherwise grow it forever)


def _compile(template: str):
    t = _TEMPLATES.get(template)
    if t is None:
        from yoco_rs.template_budget import BudgetedSandbox

        def raise_exception(msg):
            raise ValueError(f"chat template error: {msg}")

        env = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
        t = env.from_string(template)
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.pop(next(iter(_TEMPLATES)))
        _TEMPLATES[template] = t
    return t


__all__ = ["Tokenizer"]
