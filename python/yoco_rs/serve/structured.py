"""The structured-output request surface of ``yoco-serve`` (OpenAI's and vLLM 0.33's spellings).

One request may constrain its output with exactly one of:

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (any JSON
  object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``;
- vLLM's ``structured_outputs`` object: ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``;
- the older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields;
- (chat) ``tool_choice`` ``"required"`` or a named function, which ``serve/tools.py`` turns into a JSON
  Schema over the tools' parameters.

The result is a ``StructuredOutputsParams`` on the request's ``SamplingParams``; the engine compiles it
(llguidance, in Rust, off the event loop and under a time budget), so a bad schema, regex or grammar
comes back as a 400 naming the problem.
"""

from __future__ import annotations

from typing import Any, Optional

from yoco_rs.serve.errors import bad_request
from yoco_rs.structured_outputs import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _from_response_format(rf: Any) -> Optional[StructuredOutputsParams]:
    if not isinstance(rf, dict):
        raise bad_request(f"response_format must be an object with a 'type', got {type(rf).__name__}",
                          "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request("response_format of type 'json_schema' needs a 'json_schema' object "
                              "({'name': ..., 'schema': {...}})", "response_format")
        schema = js.get("schema", js.get("json_schema"))
        if schema is None:
            raise bad_request("response_format.json_schema.schema is required (the JSON Schema the output follows)",
                              "response_format")
        if not isinstance(schema, (dict, bool)):
            raise bad_request(f"response_format.json_schema.schema must be a JSON Schema object, got "
                              f"{type(schema).__name__}", "response_format")
        return StructuredOutputsParams(json=schema)
    raise bad_request(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                      "response_format")


def structured_outputs_of(req: Any, tool_constraint: Optional[StructuredOutputsParams] = None
                          ) -> Optional[StructuredOutputsParams]:
    """The request's constraint (None for none); a 400 naming the field when it is malformed or when
    more than one field asks for one (``tool_constraint``: what ``tool_choice`` required/named asks)."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    if tool_constraint is not None:
        found.append(("tool_choice", tool_constraint))
    rf = getattr(req, "response_format", None)
    if rf is not None:
        so = _from_response_format(rf)
        if so is not None:
            found.append(("response_format", so))
    so_field = getattr(req, "structured_outputs", None)
    if so_field is not None:
        try:
            found.append(("structured_outputs", StructuredOutputsParams.from_any(so_field)))
        except (ValueError, TypeError) as e:
            raise bad_request(str(e), "structured_outputs") from None
    for name, key in _GUIDED.items():
        v = getattr(req, name, None)
        if v is None:
            continue
        try:
            found.append((name, StructuredOutputsParams(**{key: v})))
        except (ValueError, TypeError) as e:
            raise bad_request(f"{name}: {e}", name) from None
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise bad_request(f"only one structured output constraint per request, got {names}", found[1][0])
    return found[0][1] if found else None


__all__ = ["structured_outputs_of"]
