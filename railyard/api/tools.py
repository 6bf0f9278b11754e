"""OpenAI tool calling on /v1/chat/completions: what `tools` and `tool_choice` mean for one request.

- The tools go to the checkpoint's chat template (`tools=`), as vLLM and transformers pass them; assistant
  turns' tool calls and "tool" results go back through it too.
- "none": no tool calls are parsed. "auto": the model's Hermes / Qwen `<tool_call>{...}</tool_call>` blocks
  (or gpt-oss's harmony calls, railyard.api.harmony) become tool calls.
  "required" and a named function constrain the output with a JSON schema built from the
  tools (vLLM's: an array of {name, parameters} for "required", the function's parameters for a named one),
  so the calls always parse.
- One parser per choice (railyard.api.output_parsers) turns the generated text into reasoning, content and calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from railyard.api.protocol import ChatCompletionRequest, ChatMessage
from railyard.api.tool_parsers import HermesParser, NamedParser, RequiredParser, ToolCallParser
from railyard.engine.structured import StructuredOutputsParams
from railyard.engine.structured.grammar import check
from railyard.errors import InvalidRequestError

ToolMode = Literal["none", "auto", "required", "named"]


@dataclass
class ToolPlan:
    """How one request uses its tools: the template's tool list, the mode, and the constraint if any."""

    tools: list[dict[str, Any]]
    mode: ToolMode
    name: str | None = None  # the function a named tool_choice forces
    constraint: StructuredOutputsParams | None = None

    def parser(self) -> ToolCallParser | None:
        if self.mode == "auto":
            return HermesParser()
        if self.mode == "required":
            return RequiredParser()
        if self.mode == "named":
            return NamedParser(name=self.name)
        return None


def plan_tools(req: ChatCompletionRequest, harmony: bool = False) -> ToolPlan | None:
    """The request's tool plan (None without tools); a bad tool or tool_choice raises InvalidRequestError.

    harmony: the model writes gpt-oss's harmony format, whose calls a JSON grammar over the whole output cannot
    force (the call's header is special tokens), so "required" and a named function are refused there.
    """
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs 'tools': name the functions the model may call.")
        return None
    tools = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools]
    parameters = {}
    for i, t in enumerate(req.tools):
        fn = t.function
        if fn.name in parameters:
            raise InvalidRequestError(f"tools[{i}]: the function name {fn.name!r} is used twice.")
        parameters[fn.name] = fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}
        _check_parameters(fn.name, i, parameters[fn.name])
    if choice is None or choice in ("auto", "none"):
        return ToolPlan(tools, choice or "auto")
    if harmony:
        raise InvalidRequestError("tool_choice 'required' and a named function are not supported for this model: it "
                                  "writes tool calls in gpt-oss's harmony format, which a JSON constraint cannot "
                                  "force; use tool_choice 'auto'.")
    if choice == "required":
        schema = {"type": "array", "minItems": 1,
                  "items": {"anyOf": [{"type": "object", "properties": {"name": {"enum": [name]}, "parameters": p},
                                       "required": ["name", "parameters"]} for name, p in parameters.items()]}}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return ToolPlan(tools, "required", constraint=_constraint(schema))
    name = choice.function.name
    if name not in parameters:
        raise InvalidRequestError(f"tool_choice names the function {name!r}, which is not in 'tools' "
                                  f"({', '.join(sorted(parameters))}).")
    return ToolPlan(tools, "named", name, _constraint(parameters[name]))


def _check_parameters(name: str, index: int, schema: Any) -> None:
    try:
        check(StructuredOutputsParams(json=schema))
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"tools[{index}] ({name}): its parameters are not a usable JSON schema: {exc}") \
            from None


def _constraint(schema: dict[str, Any]) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=schema)  # checked with the request's other constraints, if any


# Where templates read an assistant turn's earlier reasoning: Qwen3's `reasoning_content`, gpt-oss's `thinking`.
_TEMPLATE_REASONING = ("reasoning_content", "thinking")


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool calls' JSON-text arguments become objects (as in vLLM), and an
    assistant turn's reasoning (sent back as `reasoning_content` or `reasoning`) goes under the names templates
    read it by."""
    out = []
    for m in messages:
        d = m.template_dict()
        calls = d.get("tool_calls")
        if isinstance(calls, list):
            d["tool_calls"] = [_parsed_arguments(c) for c in calls]
        reasoning = next((d[k] for k in ("reasoning_content", "reasoning", "thinking") if isinstance(d.get(k), str)),
                         None)
        if m.role == "assistant" and reasoning:
            d.update({k: d.get(k) if isinstance(d.get(k), str) else reasoning for k in _TEMPLATE_REASONING})
        out.append(d)
    return out


def _parsed_arguments(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            return {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
        except ValueError:
            pass
    return call
