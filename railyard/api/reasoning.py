"""Reasoning in `<think>...</think>` blocks (Qwen3, QwQ, DeepSeek-R1 distills), split from the answer as vLLM's
`qwen3` reasoning parser splits it: the block's text is the reasoning, the rest is content.

A block opens only at the very start of the output, or is already open when the prompt ends inside one (templates
that write `<think>` themselves: Qwen3's 2507 thinking models, the R1 distills). With the template's thinking
turned off (`chat_template_kwargs: {"enable_thinking": false}`) nothing is reasoning, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START, THINK_END = "<think>", "</think>"


def prompt_opens_thinking(prompt: str | None) -> bool:
    """Whether the prompt ends inside a think block, so that the output starts as reasoning."""
    return prompt is not None and prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def partial_tail(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper beginning of one of `markers` (held back in a stream,
    since the next chunk may complete the marker)."""
    longest = max(len(m) for m in markers) - 1
    for k in range(min(len(text), longest), 0, -1):
        tail = text[-k:]
        if any(m.startswith(tail) for m in markers):
            return k
    return 0


@dataclass
class ThinkParser:
    """Splits a choice's text, fed as it grows, into (reasoning, content)."""

    _state: str = "start"  # start: a block may still open; think: inside it; content: after it (or none came)
    _buf: str = ""

    @classmethod
    def opened(cls) -> "ThinkParser":
        """A parser for an output that starts inside a think block (the prompt opened it)."""
        return cls(_state="think")

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        if self._state == "start":
            if self._buf.startswith(THINK_START):
                self._buf, self._state = self._buf[len(THINK_START):], "think"
            elif THINK_START.startswith(self._buf):
                return "", ""  # still may become "<think>"
            else:
                self._state = "content"
        if self._state == "think":
            pos = self._buf.find(THINK_END)
            if pos < 0:
                keep = partial_tail(self._buf, (THINK_END,))
                reasoning, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                return reasoning, ""
            reasoning, self._buf, self._state = self._buf[:pos], self._buf[pos + len(THINK_END):], "content"
        content, self._buf = self._buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held back, once the text is complete: an unclosed block's tail is reasoning (the output was
        cut while thinking), a lone beginning of "<think>" is content."""
        rest, self._buf = self._buf, ""
        return (rest, "") if self._state == "think" else ("", rest)
