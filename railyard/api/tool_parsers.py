"""Turning a choice's generated text into OpenAI tool calls, streamed or not.

One `ToolCallParser` per choice takes the text as it grows and returns content and tool-call deltas; the
non-streamed message is those deltas merged (railyard.api.output_parsers), so a stream always reassembles to it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from railyard.api.reasoning import partial_tail

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCallDelta:
    """A piece of one tool call, as OpenAI streams it: the first piece carries its id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
        fn: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            fn["name"] = self.name
        out["function"] = fn
        return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class DeltaMessage:
    """What one chunk of a choice adds: reasoning, content and tool-call pieces (at most one per call)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, other: "DeltaMessage") -> "DeltaMessage":
        self.reasoning += other.reasoning
        self.content += other.content
        for d in other.tool_calls:
            self.add_call(d)
        return self

    def add_call(self, d: ToolCallDelta) -> None:
        """One piece per call index: a later piece of the same call extends the earlier one."""
        for mine in self.tool_calls:
            if mine.index == d.index:
                mine.arguments += d.arguments
                return
        self.tool_calls.append(ToolCallDelta(d.index, d.id, d.name, d.arguments))


@dataclass
class ToolCallParser:
    """Splits a choice's text, fed as it grows, into content and tool-call deltas."""

    num_calls: int = 0

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """What is still held back, once the text is complete."""
        return "", []

    def _call(self, name: str, arguments: str) -> ToolCallDelta:
        self.num_calls += 1
        return ToolCallDelta(self.num_calls - 1, new_call_id(), name, arguments)


@dataclass
class HermesParser(ToolCallParser):
    """tool_choice "auto": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks are calls; text
    before the first block is content (text after it is dropped, as vLLM's hermes parser does). A block
    whose JSON does not parse stays content."""

    _buf: str = ""
    _in_call: bool = False
    _content_open: bool = True

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content, calls = "", []
        while True:
            if not self._in_call:
                pos = self._buf.find(TOOL_CALL_START)
                if pos < 0:  # hold back a tail that may still become "<tool_call>"
                    keep = partial_tail(self._buf, (TOOL_CALL_START,))
                    content += self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return content, calls
                content += self._content(self._buf[:pos])
                self._buf, self._in_call, self._content_open = self._buf[pos + len(TOOL_CALL_START):], True, False
            else:
                pos = self._buf.find(TOOL_CALL_END)
                if pos < 0:
                    return content, calls
                body, self._buf, self._in_call = self._buf[:pos], self._buf[pos + len(TOOL_CALL_END):], False
                call = self._parse(body)
                if call is None:
                    content += TOOL_CALL_START + body + TOOL_CALL_END
                else:
                    calls.append(call)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        body, self._buf = self._buf, ""
        if not self._in_call:
            return self._content(body), []
        self._in_call = False
        call = self._parse(body)  # a last block the model ended without "</tool_call>"
        return ("", [call]) if call is not None else (TOOL_CALL_START + body, [])

    def _content(self, text: str) -> str:
        return text if self._content_open else ""

    def _parse(self, body: str) -> ToolCallDelta | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        return self._call(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


@dataclass
class RequiredParser(ToolCallParser):
    """tool_choice "required": the text is a JSON array of {"name", "parameters"}; each item is a call as soon
    as it closes. If no item closed (the output was cut), the text is content."""

    _text: str = ""
    _pos: int = 0
    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False
    _item_start: int = -1

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._text += text
        calls = []
        for i in range(self._pos, len(self._text)):
            ch = self._text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "[{":
                self._depth += 1
                if self._depth == 2:
                    self._item_start = i
            elif ch in "]}":
                self._depth -= 1
                if self._depth == 1 and self._item_start >= 0:
                    call = self._parse(self._text[self._item_start:i + 1])
                    if call is not None:
                        calls.append(call)
                    self._item_start = -1
        self._pos = len(self._text)
        return "", calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return ("", []) if self.num_calls else (self._text, [])

    def _parse(self, item: str) -> ToolCallDelta | None:
        try:  # the grammar made it {"name": ..., "parameters": {...}}; stay safe if it did not
            obj = json.loads(item)
            return self._call(obj["name"], json.dumps(obj["parameters"], ensure_ascii=False))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class NamedParser(ToolCallParser):
    """A named tool_choice: the whole text is the forced function's arguments, streamed as they come."""

    name: str = ""

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if not text:
            return "", []
        if self.num_calls == 0:
            return "", [self._call(self.name, text)]
        return "", [ToolCallDelta(0, arguments=text)]

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return ("", []) if self.num_calls else ("", [self._call(self.name, "")])
