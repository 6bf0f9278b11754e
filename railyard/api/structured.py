"""A request's output constraint from whichever spelling it used, checked at the door.

OpenAI's `response_format` (json_object, json_schema), vLLM's `structured_outputs` (json / regex / choice /
grammar / json_object) and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` all
become one StructuredOutputsParams. xgrammar parses it here, so a bad schema, regex or grammar is a 400
before the response starts (the engine compiles it later, off its step loop).
"""

from __future__ import annotations

from typing import Any

import xgrammar  # noqa: F401  (loaded with the app: a first constrained request must not stall the event loop)

from railyard.api.protocol import SamplingRequest
from railyard.engine.structured import StructuredOutputsParams
from railyard.engine.structured.grammar import check
from railyard.errors import InvalidRequestError


def requested_constraints(req: SamplingRequest) -> list[tuple[str, dict[str, Any]]]:
    """(where it came from, StructuredOutputsParams fields) for every constraint the request names."""
    found = []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        found.append(("response_format", {"json_object": True}))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise InvalidRequestError("response_format of type 'json_schema' needs json_schema.schema.")
        found.append(("response_format", {"json": rf.json_schema.schema_}))
    so = req.structured_outputs
    if so is not None:
        kinds = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
                 "json_object": so.json_object or None}
        found += [("structured_outputs", {k: v}) for k, v in kinds.items() if v is not None]
    guided = {"json": req.guided_json, "regex": req.guided_regex, "choice": req.guided_choice,
              "grammar": req.guided_grammar}
    found += [(f"guided_{k}", {k: v}) for k, v in guided.items() if v is not None]
    return found


def structured_outputs(req: SamplingRequest, tool_constraint: StructuredOutputsParams | None = None
                       ) -> StructuredOutputsParams | None:
    """The request's one constraint (tool_choice "required" or a named function gives one too), checked;
    InvalidRequestError (400) for a bad or ambiguous one."""
    if req.guided_decoding_backend not in (None, "auto", "xgrammar"):
        raise InvalidRequestError(f"guided_decoding_backend {req.guided_decoding_backend!r} is not available; "
                                  "railyard constrains outputs with xgrammar.")
    found = requested_constraints(req)
    if tool_constraint is not None:
        found.append(("tool_choice", {"json": tool_constraint.json}))
    if len(found) > 1:
        raise InvalidRequestError("a request can carry one output constraint, but this one has "
                                  f"{', '.join(where for where, _ in found)}; keep one.")
    if not found:
        return None
    so = req.structured_outputs
    spec = StructuredOutputsParams(**found[0][1], disable_any_whitespace=so.disable_any_whitespace if so else None)
    check(spec)
    return spec
