"""A chat choice's generated text as OpenAI's message: reasoning, content and tool calls, streamed or not.

Which parsers read it (vLLM's names: EngineConfig's reasoning_parser and tool_call_parser):
- openai_gptoss / openai: gpt-oss's harmony channels (railyard.api.harmony), one parser for both;
- qwen3: `<think>` blocks (railyard.api.reasoning), the rest then going to the tool parser;
- hermes: `<tool_call>` JSON blocks under tool_choice "auto" (railyard.api.tool_parsers);
- auto: harmony where the chat template writes `<|channel|>`, qwen3 where it writes `</think>`, else no
  reasoning parser; hermes tool calls.
One parser per choice; the non-streamed message is its streamed deltas merged, so a stream reassembles to it.
Reasoning goes out as `reasoning_content` (the name the DeepSeek API and older vLLM use) and `reasoning`
(vLLM's current name), so clients of either find it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from railyard.api.harmony import TEMPLATE_MARK, HarmonyParser
from railyard.api.protocol import ChatCompletionRequest
from railyard.api.reasoning import THINK_END, ThinkParser, prompt_opens_thinking
from railyard.api.tool_parsers import DeltaMessage, ToolCallParser
from railyard.api.tools import ToolPlan

REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass(frozen=True)
class ParserNames:
    """The parsers a served model's chat output goes through, resolved from the configured names."""

    reasoning: str | None  # "qwen3", "openai_gptoss", or None: no reasoning parser
    tools: str  # "hermes" or "openai"

    @property
    def harmony(self) -> bool:
        return self.tools == "openai"


def resolve_parsers(reasoning: str = "auto", tools: str = "auto", chat_template: Any = None) -> ParserNames:
    """The configured names with "auto" decided by the chat template (a string, or transformers' dict of named
    templates)."""
    template = chat_template if isinstance(chat_template, str) else str(chat_template or "")
    if reasoning == "openai_gptoss" or tools == "openai" or \
            (reasoning == "auto" and tools == "auto" and TEMPLATE_MARK in template):
        return ParserNames("openai_gptoss", "openai")
    think = reasoning == "qwen3" or (reasoning == "auto" and THINK_END in template)
    return ParserNames("qwen3" if think else None, "hermes")


@dataclass
class ThinkThenTools:
    """Reasoning blocks first (if the model thinks), then the tool parser (if any) over the content."""

    think: ThinkParser | None = None
    tools: ToolCallParser | None = None

    @property
    def num_calls(self) -> int:
        return self.tools.num_calls if self.tools is not None else 0

    def feed(self, text: str) -> DeltaMessage:
        reasoning, content = self.think.feed(text) if self.think is not None else ("", text)
        return self._with_calls(reasoning, content, last=False)

    def finish(self) -> DeltaMessage:
        reasoning, content = self.think.finish() if self.think is not None else ("", "")
        return self._with_calls(reasoning, content, last=True)

    def _with_calls(self, reasoning: str, content: str, last: bool) -> DeltaMessage:
        out = DeltaMessage(reasoning=reasoning)
        if self.tools is None:
            out.content = content
            return out
        text, calls = self.tools.feed(content) if content else ("", [])
        if last:
            tail, more = self.tools.finish()
            text, calls = text + tail, calls + more
        out.content = text
        for call in calls:
            out.add_call(call)
        return out


OutputParser = ThinkThenTools | HarmonyParser


def thinking_enabled(req: ChatCompletionRequest) -> bool:
    """Qwen3's switch: `chat_template_kwargs: {"enable_thinking": false}` turns thinking off (on by default)."""
    return (req.chat_template_kwargs or {}).get("enable_thinking", True) is not False


def choice_parsers(names: ParserNames, req: ChatCompletionRequest, tools: ToolPlan | None, prompt: str | None,
                   json_output: bool = False) -> Callable[[], OutputParser] | None:
    """A maker of one choice's parser for this request (None: the text is all content).

    json_output: a JSON constraint shapes the whole output (response_format, tool_choice "required" or named),
    so it is an answer even where the prompt opened a think block.
    """
    if names.harmony:
        calls = tools is not None and tools.mode == "auto"
        return lambda: HarmonyParser(tools=calls)
    think = names.reasoning == "qwen3" and thinking_enabled(req)
    if not think and (tools is None or tools.mode == "none"):
        return None
    opened = think and not json_output and prompt_opens_thinking(prompt)

    def make() -> ThinkThenTools:
        return ThinkThenTools(ThinkParser.opened() if opened else ThinkParser() if think else None,
                              tools.parser() if tools is not None else None)

    return make


@dataclass
class ParsedMessage:
    """A whole choice: its reasoning (None without), content (None when it only called tools) and tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def fields(self, include_reasoning: bool = True) -> dict[str, Any]:
        """The assistant message's fields besides its role."""
        out: dict[str, Any] = {"content": self.content}
        if include_reasoning and self.reasoning:
            out.update(dict.fromkeys(REASONING_FIELDS, self.reasoning))
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def parse_message(parser: OutputParser, text: str) -> ParsedMessage:
    """A whole choice's text as the non-streamed message: the streamed deltas, merged."""
    merged = parser.feed(text).add(parser.finish())
    calls = [{"id": d.id, "type": "function", "function": {"name": d.name, "arguments": d.arguments}}
             for d in sorted(merged.tool_calls, key=lambda d: d.index)]
    content = merged.content if merged.content or not calls else None
    return ParsedMessage(merged.reasoning or None, content, calls)


def stream_delta(parser: OutputParser, text: str, last: bool, include_reasoning: bool = True) -> dict[str, Any]:
    """A streamed chunk's delta for new text of a choice: its reasoning, content and tool-call pieces."""
    delta = parser.feed(text)
    if last:
        delta.add(parser.finish())
    out: dict[str, Any] = {}
    if include_reasoning and delta.reasoning:
        out.update(dict.fromkeys(REASONING_FIELDS, delta.reasoning))
    if delta.content:
        out["content"] = delta.content
    if delta.tool_calls:
        out["tool_calls"] = [c.to_openai() for c in delta.tool_calls]
    return out


def finish_reason(reason: str | None, parser: OutputParser | None) -> str | None:
    """OpenAI's "tool_calls" for a choice that called a tool and ended normally."""
    return "tool_calls" if reason == "stop" and parser is not None and parser.num_calls else reason
