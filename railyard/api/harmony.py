"""gpt-oss's harmony format, parsed back from the generated text into reasoning, content and tool calls.

The checkpoint's own chat template renders the conversation into harmony (gpt-oss ships one that writes the
system and developer messages, the `functions` namespace of tools, earlier tool calls and their results); the
prompt ends with `<|start|>assistant`, and the model writes messages such as

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}
    <|start|>assistant<|channel|>final<|message|>It is sunny.

ending with `<|call|>` or `<|return|>` (end-of-sequence tokens: they add no text). The parser reads the text with
the special tokens left in (the chat endpoint asks the detokenizer for them). Per message, by its header:
- a recipient `functions.NAME` (in the header before or after the channel): a tool call, its body the arguments;
- the analysis channel (and calls to built-in tools such as `browser.search`): reasoning;
- final, and commentary without a recipient (a preamble to tool calls): content.
A call streams as OpenAI streams one: a first delta with its id, name and the arguments so far, then deltas of
the same index with more arguments; one delta per call per chunk, so clients never see a call split in two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from railyard.api.reasoning import partial_tail
from railyard.api.tool_parsers import DeltaMessage, ToolCallDelta, new_call_id

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
_BODY_ENDS = (END, CALL, RETURN)
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
FUNCTIONS = "functions."
# Where a chat template writes harmony: how `auto` recognises a gpt-oss-style checkpoint.
TEMPLATE_MARK = CHANNEL


@dataclass
class _Header:
    kind: str  # "reasoning", "content" or "call"
    name: str | None = None  # the function a call is to


def parse_header(header: str, tools: bool) -> _Header:
    """What a message is, from the text between its start and `<|message|>`."""
    recipient = _RECIPIENT.search(header)
    channel = _CHANNEL.search(header)
    channel_name = channel.group(1) if channel else None
    if recipient is not None:
        to = recipient.group(1)
        if to.startswith(FUNCTIONS) and tools:
            return _Header("call", to[len(FUNCTIONS):])
        return _Header("content" if to.startswith(FUNCTIONS) else "reasoning")  # built-in tools run in the CoT
    return _Header("reasoning" if channel_name == "analysis" else "content")


@dataclass
class HarmonyParser:
    """Splits a choice's harmony text, fed as it grows, into reasoning, content and tool-call deltas.

    tools: whether calls to `functions.*` become tool calls (False with no tools or tool_choice "none": such a
    message's body is then content, as the text of a call no parser reads is elsewhere).
    """

    tools: bool = True
    num_calls: int = 0
    _buf: str = ""
    _header: _Header | None = None  # None: reading a header
    _call_sent: bool = False

    def feed(self, text: str) -> DeltaMessage:
        self._buf += text
        out = DeltaMessage()
        while True:
            if self._header is None:
                pos = self._buf.find(MESSAGE)
                if pos < 0:
                    return out
                self._header = parse_header(self._buf[:pos], self.tools)
                self._buf, self._call_sent = self._buf[pos + len(MESSAGE):], False
                if self._header.kind == "call":  # the call opens with its id and name, arguments following
                    self._emit(out, "")
                continue
            ends = [(p, m) for m in _BODY_ENDS if (p := self._buf.find(m)) >= 0]
            if not ends:
                keep = partial_tail(self._buf, _BODY_ENDS)
                body, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                self._emit(out, body)
                return out
            pos, marker = min(ends)
            self._emit(out, self._buf[:pos])
            self._buf, self._header = self._buf[pos + len(marker):], None

    def finish(self) -> DeltaMessage:
        """What is held back, once the text is complete (it ends before `<|call|>` / `<|return|>`, which stop it)."""
        out = DeltaMessage()
        rest, self._buf = self._buf, ""
        if self._header is not None:
            self._emit(out, rest)
            self._header = None
        elif rest and "<|" not in rest and "to=" not in rest:
            out.content += rest  # no harmony at all: the model wrote plain text
        return out  # else a header the output was cut in: nothing of it is text

    def _emit(self, out: DeltaMessage, body: str) -> None:
        header = self._header
        if header.kind == "call":
            if not self._call_sent:
                self._call_sent = True
                self.num_calls += 1
                out.add_call(ToolCallDelta(self.num_calls - 1, new_call_id(), header.name, body))
            elif body:
                out.add_call(ToolCallDelta(self.num_calls - 1, arguments=body))
        elif header.kind == "reasoning":
            out.reasoning += body
        else:
            out.content += body
