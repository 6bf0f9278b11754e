"""Tiny checkpoints that speak two chat formats, for the reasoning and tool-call parsers' served tests.

- harmony: the tiny model with gpt-oss's harmony special tokens (special, as gpt-oss's tokenizer has them: a
  default detokenization drops them) and `<|return|>` / `<|call|>` as end-of-sequence tokens, and a chat
  template written here in the shape of gpt-oss's own (system and developer messages, the `functions`
  namespace, earlier calls and results, `<|start|>assistant` as the generation prompt).
- think: the tiny model's ChatML/Hermes template whose generation prompt behaves as Qwen3's: an empty think
  block when `enable_thinking` is false, and (with this test's `think_in_prompt`) an opened one, as the Qwen3
  2507 thinking models' template writes.
A random model writes gibberish, so the tests force the text a real model writes with a regex constraint; a
grammar may pick a special token or the bytes of its text, and either decodes to the same text.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from railyard.engine.startup.tiny_model import CHAT_TEMPLATE, write_tiny_checkpoint

HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
_TINY_VOCAB = 259  # 256 bytes and the tiny model's three special tokens
HARMONY_IDS = {t: _TINY_VOCAB + i for i, t in enumerate(HARMONY_TOKENS)}

HARMONY_TEMPLATE = (
    "<|start|>system<|message|>You are a tiny test model.\nReasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "{%- if tools %}\nCalls to these tools must go to the commentary channel: 'functions'.{%- endif %}<|end|>"
    "{%- set first = messages[0] if messages else none %}"
    "{%- if tools or (first and first.role in ['system', 'developer']) %}<|start|>developer<|message|>"
    "{%- if first and first.role in ['system', 'developer'] %}# Instructions\n\n{{ first.content }}\n\n{%- endif %}"
    "{%- if tools %}# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "{%- for tool in tools %}// {{ tool.function.description }}\ntype {{ tool.function.name }} = "
    "(_: {{ tool.function.parameters | tojson }}) => any;\n\n{% endfor %}} // namespace functions{%- endif %}<|end|>"
    "{%- endif %}"
    "{%- set last = namespace(name=none) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}<|start|>user<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- if message.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>"
    "{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>"
    "{{ call.arguments | tojson }}<|call|>{%- set last.name = call.name %}"
    "{%- elif message.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'tool' %}<|start|>functions.{{ last.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ message.content | tojson }}<|end|>"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)

_CHATML_PROMPT = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
THINK_TEMPLATE = CHAT_TEMPLATE.replace(_CHATML_PROMPT, (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
    "{%- elif think_in_prompt is defined and think_in_prompt %}{{- '<think>\n' }}{%- endif %}"
    "{%- endif %}"))
assert THINK_TEMPLATE != CHAT_TEMPLATE, "the tiny model's generation prompt changed: update THINK_TEMPLATE"


def _set_template(path: Path, template: str, **config) -> None:
    tokenizer_config = path / "tokenizer_config.json"
    data = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**data, "chat_template": template, **config}, indent=1))


def write_harmony_checkpoint(path: Path) -> Path:
    """The tiny model, its vocabulary grown by harmony's special tokens, `<|return|>` and `<|call|>` ending it."""
    eos = [HARMONY_IDS["<|return|>"], HARMONY_IDS["<|call|>"], 256]
    write_tiny_checkpoint(path, vocab_size=_TINY_VOCAB + len(HARMONY_TOKENS), max_position_embeddings=4096,
                          eos_token_id=eos)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_special_tokens(HARMONY_TOKENS)
    assert [tokenizer.token_to_id(t) for t in HARMONY_TOKENS] == list(HARMONY_IDS.values())
    tokenizer.save(str(path / "tokenizer.json"))
    _set_template(path, HARMONY_TEMPLATE, eos_token="<|return|>")
    return path


def write_think_checkpoint(path: Path) -> Path:
    """The tiny model with a Qwen3-style thinking switch in its generation prompt."""
    write_tiny_checkpoint(path, max_position_embeddings=4096)
    _set_template(path, THINK_TEMPLATE)
    return path


def assert_stream_reassembles_to(whole, chunks) -> None:
    """A streamed chat completion's deltas (reasoning, content, tool calls, finish reason), merged as OpenAI clients
    merge them, equal the unstreamed choice `whole` of the same request."""
    from tests.api.test_tools import reassemble

    content, calls, finish = reassemble(chunks)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert (reasoning, content, finish) == (whole.message.reasoning_content, whole.message.content or "",
                                            whole.finish_reason)
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
