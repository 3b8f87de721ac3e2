"""Tool calling for ``/v1/chat/completions`` (OpenAI's ``tools`` / ``tool_choice``, vLLM's behaviour).

- ``tool_choice: "none"``: the tools are not shown to the model and nothing is parsed.
- ``"required"``: the output is constrained (llguidance) to a JSON list of calls, ``[{"name": ...,
  "parameters": {...}}, ...]``, each call's ``parameters`` following its tool's JSON Schema, as vLLM
  does; the reply carries them as ``tool_calls`` with ``finish_reason: "tool_calls"``.
- a named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to
  that tool's parameters; the reply is one tool call (``finish_reason: "stop"``, as OpenAI answers a
  forced function).
- ``"auto"`` (the default when tools are given and the server runs with ``--enable-auto-tool-choice``):
  the model decides; ``--tool-call-parser`` says how a call looks in its text. ``pythonic`` (vLLM's
  parser for Gemma 3): the whole reply is ``[name(arg=value, ...), ...]`` with Python literals;
  ``json``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks. Text that does not
  parse as calls is ordinary content.

The conversation may hold assistant messages with ``tool_calls`` and ``tool`` messages (results);
``templates/gemma3n_tools.jinja`` renders them for Gemma 3n (calls in the pythonic form, results as
``<tool_response>`` user turns) whenever tools are in play and no other template was given.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional

from yoco_rs.serve.errors import bad_request
from yoco_rs.structured_outputs import StructuredOutputsParams

PARSERS = ("pythonic", "json")


def tool_template() -> str:
    """The tool-aware Gemma 3n chat template shipped with yoco-serve."""
    return resources.files("yoco_rs.serve").joinpath("templates/gemma3n_tools.jinja").read_text(encoding="utf-8")


@dataclass
class ToolPlan:
    mode: str = "none"
    """none | auto | required | named"""
    tools: list[dict] = field(default_factory=list)
    """The functions (``{"name", "description"?, "parameters"?}``)."""
    name: Optional[str] = None
    """The forced function (mode named)."""
    parser: Optional[str] = None
    parallel: bool = True
    """``parallel_tool_calls`` (OpenAI's default true); false: at most one call (``required``: exactly one)."""

    @property
    def active(self) -> bool:
        return self.mode != "none"


def plan_tools(req, *, auto_enabled: bool, parser: Optional[str]) -> ToolPlan:
    """Validate ``tools`` / ``tool_choice`` (400s naming the field) and decide the mode."""
    tools = req.tools
    choice = req.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools: give at least one tool or omit tool_choice", "tool_choice")
        return ToolPlan()
    fns = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                              f"'parameters': {{...}}}}}}", "tools")
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        fns.append({k: v for k, v in f.items() if k in ("name", "description", "parameters")})
    names = [f["name"] for f in fns]
    if len(set(names)) != len(names):
        raise bad_request(f"tools have duplicate names: {names}", "tools")
    parallel = getattr(req, "parallel_tool_calls", None) is not False
    if choice is None:  # OpenAI and vLLM: tools without tool_choice mean "auto" (never silently ignored)
        choice = "auto"
    if choice == "none":  # the tools still reach the template (vLLM), nothing is parsed or forced
        return ToolPlan("none", fns, None, parser, parallel)
    if choice == "auto":
        if not (auto_enabled and parser):
            raise bad_request('"auto" tool choice requires the server to run with --enable-auto-tool-choice and '
                              '--tool-call-parser', "tool_choice")
        return ToolPlan("auto", fns, None, parser, parallel)
    if choice == "required":
        return ToolPlan("required", fns, None, parser, parallel)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                              "'function': {'name': ...}}", "tool_choice")
        if name not in names:
            raise bad_request(f"tool_choice names function {name!r}, which is not among the tools {names}",
                              "tool_choice")
        return ToolPlan("named", fns, name, parser, parallel)
    raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
                      "tool_choice")


def _params_schema(f: dict) -> dict:
    return f.get("parameters") or {"type": "object", "properties": {}}


def tool_constraint(plan: ToolPlan) -> Optional[StructuredOutputsParams]:
    """The grammar that enforces ``required`` / a named function (vLLM's schemas); None otherwise."""
    if plan.mode == "named":
        f = next(f for f in plan.tools if f["name"] == plan.name)
        return StructuredOutputsParams(json=_params_schema(f))
    if plan.mode == "required":
        one = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                                 "parameters": _params_schema(f)},
                "required": ["name", "parameters"], "additionalProperties": False} for f in plan.tools]
        calls = {"type": "array", "minItems": 1, "items": one[0] if len(one) == 1 else {"anyOf": one}}
        if not plan.parallel:
            calls["maxItems"] = 1
        return StructuredOutputsParams(json=calls)
    return None


def template_messages(messages: list[dict], raw) -> list[dict]:
    """Add what tool conversations carry (assistant ``tool_calls`` with parsed arguments, a tool
    message's ``tool_call_id``) to the template input."""
    for i, (d, m) in enumerate(zip(messages, raw)):
        extra = getattr(m, "model_extra", None) or {}
        calls = extra.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad_request(f"messages[{i}].tool_calls must be a list", "messages")
            out = []
            for j, c in enumerate(calls):
                f = c.get("function") if isinstance(c, dict) else None
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise bad_request(f"messages[{i}].tool_calls[{j}] must have function.name", "messages")
                args = f.get("arguments") or {}
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise bad_request(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON",
                                          "messages") from None
                if not isinstance(args, dict):
                    raise bad_request(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object",
                                      "messages")
                out.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
            d["tool_calls"] = out
        if d.get("role") == "tool" and "tool_call_id" in extra:
            d["tool_call_id"] = extra["tool_call_id"]
    return messages


def _call(name: str, args: Any) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _pythonic(text: str, names: set) -> Optional[list[dict]]:
    s = text.strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    try:
        tree = ast.parse(s, mode="eval")
    except SyntaxError:
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for e in tree.body.elts:
        if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.args) or e.func.id not in names:
            return None
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in e.keywords if k.arg is not None}
        except (ValueError, SyntaxError):
            return None
        calls.append(_call(e.func.id, args))
    return calls


_JSON_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _json_calls(text: str, names: set) -> Optional[tuple[str, list[dict]]]:
    blocks = _JSON_CALL.findall(text)
    if not blocks:
        return None
    calls = []
    for b in blocks:
        try:
            v = json.loads(b)
        except ValueError:
            return None
        if not isinstance(v, dict) or v.get("name") not in names:
            return None
        calls.append(_call(v["name"], v.get("arguments", v.get("parameters", {}))))
    return _JSON_CALL.sub("", text).strip(), calls


def parse_tool_calls(text: str, plan: ToolPlan) -> tuple[Optional[str], list[dict]]:
    """``(content, tool_calls)`` of a finished reply under ``plan``."""
    names = {f["name"] for f in plan.tools}
    if plan.mode == "named":
        try:
            args = json.loads(text)
        except ValueError:
            return text, []
        return None, [_call(plan.name, args)]
    if plan.mode == "required":
        try:
            v = json.loads(text)
        except ValueError:
            return text, []
        return None, [_call(c["name"], c.get("parameters", {})) for c in v if isinstance(c, dict) and "name" in c]
    if plan.mode == "auto":
        if plan.parser == "pythonic":
            calls = _pythonic(text, names)
            return (None, calls) if calls else (text, [])
        if plan.parser == "json":
            r = _json_calls(text, names)
            if r:
                return (r[0] or None), r[1]
    return text, []


def finish_reason(reason: Optional[str], plan: ToolPlan, calls: list) -> Optional[str]:
    """``tool_calls`` when the model ended by calling tools (auto / required), else the engine's reason."""
    if calls and reason == "stop" and plan.mode in ("auto", "required"):
        return "tool_calls"
    return reason


__all__ = ["ToolPlan", "plan_tools", "tool_constraint", "template_messages", "parse_tool_calls",
           "finish_reason", "tool_template", "PARSERS"]
