"""Streamed tool calls: a reply's text deltas turned into OpenAI ``tool_calls`` deltas as they arrive.

As vLLM streams them: a call's first delta carries ``index``, ``id``, ``type`` and ``function.name``
(``arguments: ""``), later deltas carry fragments of ``function.arguments`` whose concatenation is the
call's arguments JSON (the same JSON value the non-streamed reply parses from the whole text). Text
that is not a call is streamed as ``content``.

Per mode (``serve/tools.py`` has the formats):
- named: every text delta is an arguments fragment of the one call (the output *is* its arguments);
- required: ``[{"name": ..., "parameters": {...}}, ...]`` is scanned incrementally: a call starts when
  its ``name`` string is complete, and its ``parameters`` value streams verbatim as it is generated;
- auto, ``json`` parser: content outside ``<tool_call>...</tool_call>``; inside, the same scan of
  ``{"name": ..., "arguments": {...}}`` (a marker split across deltas is held back until it resolves);
- auto, ``pythonic`` parser: a reply starting with ``[`` is held as a possible call list; a call starts
  at ``name(`` (a tool's name), each keyword argument is one fragment once its value is complete
  (``{"city": "Paris"``, then ``, "unit": "c"}``: the text ``json.dumps`` writes). A reply
  that turns out not to be a call list is sent as content when it ends (if nothing was sent as a call).

Pure Python over the text deltas (what the server streams anyway); no per-token calls into the engine.
"""

from __future__ import annotations

import ast
import json
import uuid
from typing import Optional

from yoco_rs.serve.tools import ToolPlan


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _JsonCallScanner:
    """Incremental scan of JSON call objects ``{"name": ..., ARGS: <value>}`` found at ``depth`` (1: the
    text is one object; 2: a list of them). Emits through ``out`` as the text grows."""

    def __init__(self, depth: int, arg_keys: tuple[str, ...], out: "_Calls"):
        self.depth, self.arg_keys, self.out = depth, arg_keys, out
        self.text = ""
        self.pos = 0
        self.stack: list[str] = []
        self.in_str = self.esc = False
        self.str_start = -1
        self.expect_key = False
        self.key: Optional[str] = None
        self.val_start = -1  # where the current value of interest began (name or arguments)
        self.args_sent = -1  # for the arguments value: how much of it has been sent
        self.call: Optional[dict] = None

    def feed(self, delta: str) -> None:
        self.text += delta
        t, d = self.text, self.depth
        while self.pos < len(t):
            i, c = self.pos, t[self.pos]
            self.pos += 1
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
                    if len(self.stack) == d and self.stack[-1] == "{":
                        raw = t[self.str_start:i + 1]
                        if self.expect_key:
                            self.key = _loads(raw)
                            self.expect_key = False
                        elif self.key == "name" and self.call is not None and self.val_start >= 0:
                            name = _loads(raw)
                            if isinstance(name, str):
                                self.out.start(self.call, name)
                            self.val_start = -1
                continue
            if c == '"':
                self.in_str, self.str_start = True, i
                if (len(self.stack) == d and self.stack[-1] == "{" and not self.expect_key
                        and self.key == "name" and self.call is not None):
                    self.val_start = i
                continue
            at_call = len(self.stack) == d and self.stack and self.stack[-1] == "{"
            if at_call and c in ",}":
                self._end_value(i)
                if c == ",":
                    self.expect_key, self.key = True, None
            if c in "[{":
                self.stack.append(c)
                if len(self.stack) == d and c == "{":
                    self.call = self.out.new_call()
                    self.expect_key, self.key = True, None
            elif c in "]}":
                if self.stack:
                    self.stack.pop()
                if at_call and c == "}" and self.call is not None:
                    self.out.finish(self.call)
                    self.call = None
            elif c == ":" and at_call and self.key in self.arg_keys and self.call is not None:
                self.args_sent = self.pos  # the value starts after the colon (leading blanks included)
        self._send_args(len(t))

    def _end_value(self, end: int) -> None:
        if self.args_sent >= 0:
            self._send_args(end)
            self.call["args_done"] = True
            self.args_sent = -1

    def _send_args(self, upto: int) -> None:
        if self.args_sent < 0 or self.call is None:
            return
        if upto > self.args_sent:
            frag = self.text[self.args_sent:upto]
            if frag:
                self.out.args(self.call, frag.lstrip() if not self.call["args"] else frag)
            self.args_sent = upto


def _loads(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return None


class _Calls:
    """The calls of one reply and the deltas waiting to be sent."""

    def __init__(self):
        self.calls: list[dict] = []
        self.pending: list[dict] = []

    def new_call(self) -> dict:
        c = {"index": None, "id": None, "name": None, "args": "", "held": "", "args_done": False}
        return c

    def start(self, call: dict, name: str) -> None:
        if call["index"] is not None:
            return
        call.update(index=len(self.calls), id=_new_id(), name=name)
        self.calls.append(call)
        self.pending.append({"index": call["index"], "id": call["id"], "type": "function",
                             "function": {"name": name, "arguments": ""}})
        if call["held"]:
            held, call["held"] = call["held"], ""
            self.args(call, held)

    def args(self, call: dict, frag: str) -> None:
        if not frag:
            return
        if call["index"] is None:  # arguments before the name: held until the call can start
            call["held"] += frag
            return
        call["args"] += frag
        self.pending.append({"index": call["index"], "function": {"arguments": frag}})

    def finish(self, call: dict) -> None:
        if call["index"] is not None and not call["args"]:
            self.args(call, "{}")

    def take(self) -> list[dict]:
        p, self.pending = self.pending, []
        return p


class ToolCallStream:
    """One choice's streamed reply under a tool plan: ``feed(delta_text)`` and ``end()`` return what to
    send as ``(content, tool_call_deltas)``; ``calls`` is what was sent as calls (for the finish
    reason)."""

    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self._c = _Calls()
        self._text = ""
        self._sent = 0  # json parser: text consumed (content sent or fed to a call scanner)
        self._scanner: Optional[_JsonCallScanner] = None
        self._py = _PythonicCalls(self._c, {f["name"] for f in plan.tools}) if plan.parser == "pythonic" else None
        self._py_content: Optional[bool] = None  # pythonic: None undecided, True content, False call list
        if plan.mode == "named":
            self._named = self._c.new_call()
            self._c.start(self._named, plan.name)
            self._c.take()  # sent with the first text, so an empty reply sends nothing
            self._named_started = False
        if plan.mode == "required":
            self._scanner = _JsonCallScanner(2, ("parameters",), self._c)

    @property
    def calls(self) -> list[dict]:
        return self._c.calls

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        p, content = self.plan, ""
        if not delta:
            return "", []
        if p.mode == "named":
            out = []
            if not self._named_started:
                self._named_started = True
                n = self._named
                out.append({"index": 0, "id": n["id"], "type": "function", "function": {"name": n["name"],
                                                                                         "arguments": ""}})
            self._named["args"] += delta
            out.append({"index": 0, "function": {"arguments": delta}})
            return "", merge_deltas(out)
        if p.mode == "required":
            self._scanner.feed(delta)
            return "", merge_deltas(self._c.take())
        if p.mode == "auto" and p.parser == "json":
            content = self._feed_json(delta)
            return content, merge_deltas(self._c.take())
        if p.mode == "auto" and p.parser == "pythonic":
            self._text += delta
            if self._py_content is None:
                s = self._text.lstrip()
                if not s:
                    return "", []
                self._py_content = not s.startswith("[")
                if self._py_content:
                    return self._text, []
                self._py.feed(self._text)
                return "", merge_deltas(self._c.take())
            if self._py_content:
                return delta, []
            self._py.feed(delta)
            return "", merge_deltas(self._c.take())
        return delta, []

    def end(self) -> tuple[str, list[dict]]:
        """What is left to send when the reply ends."""
        p = self.plan
        if p.mode == "auto" and p.parser == "json":
            rest = self._text[self._sent:]
            if self._scanner is not None:  # an unterminated block: what was not a call is content
                self._scanner.feed("")
                rest = "" if self._c.calls else rest
            self._sent = len(self._text)
            return rest, merge_deltas(self._c.take())
        if p.mode == "auto" and p.parser == "pythonic" and self._py_content is False and not self._c.calls:
            return self._text, []  # held as a possible call list, which it was not
        return "", merge_deltas(self._c.take())

    def _feed_json(self, delta: str) -> str:
        self._text += delta
        out = []
        while True:
            rest = self._text[self._sent:]
            if self._scanner is None:
                k = rest.find(self._OPEN)
                if k < 0:
                    keep = _partial_suffix(rest, self._OPEN)
                    out.append(rest[:len(rest) - keep])
                    self._sent += len(rest) - keep
                    break
                out.append(rest[:k])
                self._sent += k + len(self._OPEN)
                self._scanner = _JsonCallScanner(1, ("arguments", "parameters"), self._c)
                continue
            k = rest.find(self._CLOSE)
            if k < 0:
                keep = _partial_suffix(rest, self._CLOSE)
                self._scanner.feed(rest[:len(rest) - keep])
                self._sent += len(rest) - keep
                break
            self._scanner.feed(rest[:k])
            self._sent += k + len(self._CLOSE)
            self._scanner = None
        return "".join(out)


def merge_deltas(deltas: list[dict]) -> list[dict]:
    """One entry per call index (a call's header and its first fragments sent together, as vLLM does)."""
    out: list[dict] = []
    for d in deltas:
        if out and out[-1]["index"] == d["index"]:
            f = out[-1]["function"]
            f["arguments"] = f.get("arguments", "") + d["function"].get("arguments", "")
        else:
            out.append({**d, "function": dict(d["function"])})
    return out


def _partial_suffix(s: str, marker: str) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of ``marker``."""
    for n in range(min(len(s), len(marker) - 1), 0, -1):
        if s.endswith(marker[:n]):
            return n
    return 0


class _PythonicCalls:
    """Incremental scan of ``[name(k=v, ...), ...]``: Python strings, brackets and top-level commas
    tracked; a keyword argument is parsed (``ast.literal_eval``) once the comma or parenthesis after it
    arrives."""

    def __init__(self, out: _Calls, names: set):
        self.out, self.names = out, names
        self.text = ""
        self.pos = 0
        self.depth = 0
        self.quote: Optional[str] = None
        self.esc = False
        self.call: Optional[dict] = None
        self.seg_start = -1
        self.name_start = -1

    def feed(self, delta: str) -> None:
        self.text += delta
        t = self.text
        while self.pos < len(t):
            i, c = self.pos, t[self.pos]
            self.pos += 1
            if self.quote:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == self.quote:
                    self.quote = None
                continue
            if c in "'\"":
                self.quote = c
            elif c in "([{":
                self.depth += 1
                if c == "(" and self.depth == 2:
                    name = t[self.name_start:i].strip() if self.name_start >= 0 else ""
                    if name.isidentifier() and name in self.names:
                        self.call = self.out.new_call()
                        self.out.start(self.call, name)
                    self.seg_start = self.pos
                if c == "[" and self.depth == 1:
                    self.name_start = self.pos
            elif c in ")]}":
                if c == ")" and self.depth == 2:
                    self._kwarg(t[self.seg_start:i], last=True)
                    self.call = None
                self.depth -= 1
            elif c == "," and self.depth == 2:
                self._kwarg(t[self.seg_start:i], last=False)
                self.seg_start = self.pos
            elif c == "," and self.depth == 1:
                self.name_start = self.pos

    def _kwarg(self, seg: str, last: bool) -> None:
        call = self.call
        if call is None:
            return
        seg = seg.strip()
        frag = ""
        if seg:
            try:
                kw = ast.parse(f"f({seg})", mode="eval").body.keywords
                (k,) = kw
                v = ast.literal_eval(k.value)
                frag = ("{" if not call["args"] else ", ") + json.dumps(k.arg, ensure_ascii=False) + ": " + \
                    json.dumps(v, ensure_ascii=False)
            except (SyntaxError, ValueError, TypeError):
                frag = ""
        if last:
            frag += "}" if (call["args"] or frag) else "{}"
        self.out.args(call, frag)


__all__ = ["ToolCallStream", "merge_deltas"]
