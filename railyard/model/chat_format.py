"""Names of the chat endpoint's output parsers (vLLM's --reasoning-parser and --tool-call-parser), shared by the
engine's options and a stack's: which format a model writes its reasoning and tool calls in is the model's."""

from __future__ import annotations

from typing import Literal

# "auto": by the checkpoint's chat template (railyard/api/output_parsers.py); "none": no reasoning parser.
ReasoningParserName = Literal["auto", "none", "qwen3", "openai_gptoss"]
ToolCallParserName = Literal["auto", "hermes", "openai"]
