"""The OpenAI request bodies railyard accepts (pydantic, the HTTP edge only).

Strict like OpenAI: wrong types are not coerced and unknown fields are refused. Every field of
vLLM's OpenAI request models is known too (the official client sends them through `extra_body`):
each is honoured with vLLM's meaning, or refused with a message naming it where railyard cannot
honour the value given; tests/api/test_vllm_fields.py holds the table.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# Bounds that keep every value representable in the engine's int64 / float32 tensors.
_INT64 = 2**63 - 1
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Seed = Annotated[int, Field(ge=-_INT64 - 1, le=_INT64 - 128)]  # seed + choice index stays a valid generator seed

# The validation error type of railyard's own rules: its message is final, its ctx names the param
# (relative to where it was raised); api/errors.py turns it into the OpenAI-style body.
REQUEST_RULE = "railyard_request_rule"

_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse(param: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error for a value railyard cannot take; `message` may hold {ctx} fields."""
    return PydanticCustomError(REQUEST_RULE, message, {"param": param, **ctx})


def unsupported(param: str, why: str) -> PydanticCustomError:
    return refuse(param, "{param} is not supported by railyard: {why}.", why=why)


def _lone_surrogate(text: str) -> str | None:
    """The first UTF-16 surrogate code point in `text` (never valid Unicode text), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return _SURROGATE.search(text).group()


def find_invalid_unicode(value: Any, path: tuple = ()) -> tuple[tuple, str] | None:
    """(where, code point) of the first string or key in a parsed JSON value that holds a lone surrogate.

    JSON escapes (`"\\ud800"`) and CESU-8 bytes (ED A0 80, which json.loads lets through) both produce them;
    no tokenizer, template or UTF-8 encoder takes them, so they are refused at the door.
    """
    kind = type(value)
    if kind is str:
        bad = _lone_surrogate(value)
        return (path, bad) if bad else None
    if kind is dict:
        for key, item in value.items():
            if type(key) is str and (bad := _lone_surrogate(key)):
                return (*path, key), bad
            if (found := find_invalid_unicode(item, (*path, key))) is not None:
                return found
    elif kind is list and not set(map(type, value)) <= {int, float, bool}:  # token ids: nothing to look at
        for i, item in enumerate(value):
            if (found := find_invalid_unicode(item, (*path, i))) is not None:
                return found
    return None


def format_path(loc: tuple | list) -> str:
    """A location as the user wrote it: messages[0].content."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(StrictModel):
    """OpenAI's include_usage, and vLLM's continuous_usage_stats (usage in every chunk)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool = False

    @property
    def usage_at_end(self) -> bool:
        """A last chunk with the whole usage: OpenAI's include_usage; as in vLLM, continuous stats imply it."""
        return self.include_usage if self.include_usage is not None else self.continuous_usage_stats

    @property
    def usage_in_every_chunk(self) -> bool:
        """vLLM's meaning: the usage so far in every chunk, while usage is included at all."""
        return self.continuous_usage_stats and self.usage_at_end


class JsonSchemaFormat(StrictModel):
    """response_format's json_schema: OpenAI's {name, description, schema, strict}."""

    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not (as in vLLM)


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(StrictModel):
    """vLLM's `structured_outputs` extension: one of json / regex / choice / grammar / json_object."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None


class SamplingRequest(StrictModel):
    """Fields shared by /v1/completions and /v1/chat/completions: OpenAI's, then vLLM's."""

    model: str | None = None  # as in vLLM, leaving it out means the served model (where there is one)
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=1e6)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=_INT64)
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)
    # vLLM's sampling parameters.
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=1e6)
    min_tokens: int = Field(default=0, ge=0, le=_INT64)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    length_penalty: float = 1.0  # vLLM reads it only for beam search
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, le=_INT64)
    allowed_token_ids: list[TokenId] | None = None
    prompt_logprobs: int | None = None
    # vLLM's extra parameters.
    priority: int = Field(default=0, ge=-_INT64, le=_INT64)
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    request_id: str | None = None
    guided_whitespace_pattern: str | None = None  # vLLM's (outlines-era) whitespace regex for guided JSON
    logits_processors: list[str | dict[str, Any]] | None = None
    return_tokens_as_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        found = find_invalid_unicode(data)
        if found is not None:
            where, char = found
            # The location may itself be a key holding the surrogate: show it escaped.
            shown = format_path(where).encode("utf-8", "backslashreplace").decode("utf-8")
            param = str(where[0]) if where and not _lone_surrogate(str(where[0])) else ""
            raise refuse(param, "{where} holds the lone UTF-16 surrogate U+{code}, which is not valid Unicode text; "
                         "send UTF-8 text (surrogates only as pairs).", where=shown or "the body",
                         code=f"{ord(char):04X}")
        return data

    @model_validator(mode="after")
    def _refuse_what_railyard_cannot_honour(self) -> "SamplingRequest":
        # Only values that ask for something: vLLM's own defaults (use_beam_search false, ...) pass.
        refusals = (
            ("logit_bias", self.logit_bias, "the sampler has no per-token bias"),
            ("best_of", self.best_of not in (None, self.n), "candidates are not ranked; leave it out or set it to n"),
            ("use_beam_search", self.use_beam_search, "there is no beam search; sample with n instead"),
            ("allowed_token_ids", self.allowed_token_ids, "the sampler has no token allow-list"),
            ("prompt_logprobs", self.prompt_logprobs is not None, "logprobs come for sampled tokens only"),
            ("guided_whitespace_pattern", self.guided_whitespace_pattern is not None,
             "xgrammar takes no whitespace regex; use structured_outputs.disable_any_whitespace for compact JSON"),
            ("logits_processors", self.logits_processors, "the server loads no request-named logits processors"),
            ("cache_salt", self.cache_salt is not None,
             "the prefix cache is shared by all requests; run one server per tenant instead"),
            ("kv_transfer_params", self.kv_transfer_params is not None, "there is no disaggregated prefill"),
            ("vllm_xargs", self.vllm_xargs, "the server has no request extensions to pass them to"),
            ("spaces_between_special_tokens", not self.spaces_between_special_tokens and not self.skip_special_tokens,
             "special tokens are joined as the tokenizer's decoder joins them (false is accepted with "
             "skip_special_tokens, where there is nothing to join)"),
        )
        for param, asked, why in refusals:
            if asked:
                raise unsupported(param, why)
        return self


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] | None = None
    prompt_embeds: str | list[str] | None = None
    max_tokens: int | None = Field(default=16, ge=1, le=_INT64)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM: the tokenizer adds its special tokens (BOS, ...)

    @model_validator(mode="after")
    def _completion_options(self) -> "CompletionRequest":
        if self.prompt_embeds is not None:
            raise unsupported("prompt_embeds", "the engine takes text or token ids, not embeddings")
        if self.prompt is None:
            raise refuse("prompt", "Missing required parameter: 'prompt'.")
        if self.echo:
            raise unsupported("echo", "the completion does not repeat the prompt")
        if self.suffix:
            raise unsupported("suffix", "there is no fill-in-the-middle")
        return self


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; extra keys (tool_calls, name, ...) pass through to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _content_required(self) -> "ChatMessage":
        # OpenAI's rule: only an assistant message that calls tools may leave its content out.
        extra = self.model_extra or {}
        if self.content is None and not (self.role == "assistant" and (extra.get("tool_calls") or
                                                                        extra.get("function_call"))):
            unless = " unless it carries tool_calls" if self.role == "assistant" else ""
            raise refuse("content", "Missing required parameter: a {role} message needs content{unless}.",
                         role=self.role, unless=unless)
        return self

    def template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        return {**self.model_dump(exclude={"content"}, exclude_none=True), "content": content or ""}


class FunctionDefinition(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ChatCompletionTool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


@functools.cache
def _template_parameters() -> frozenset[str]:
    """apply_chat_template's own parameters (this transformers' version): chat_template_kwargs may not set them."""
    from transformers import PreTrainedTokenizerBase

    names = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    return frozenset(names) - {"self", "kwargs"} | {"messages"}


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_INT64)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ChatCompletionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None  # to the template, which may read it
    include_reasoning: bool = True  # false: no reasoning_content in the reply (where a reasoning parser found some)
    # vLLM's extra parameters.
    bad_words: list[str] | None = None
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # vLLM: special tokens on top of what the template writes
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    structural_tag: str | None = None

    @model_validator(mode="after")
    def _chat_options(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:  # vLLM's rule: top_logprobs 0 passes
            raise refuse("top_logprobs", "top_logprobs requires logprobs to be true.")
        if self.bad_words:
            raise unsupported("bad_words", "the sampler has no banned-sequence filter")
        if self.echo:
            raise unsupported("echo", "the reply does not repeat the last message")
        if self.chat_template is not None:
            raise unsupported("chat_template", "the checkpoint's own template is used (vLLM also refuses a "
                                               "request's template unless the server trusts it)")
        if self.mm_processor_kwargs:
            raise unsupported("mm_processor_kwargs", "the served models take text only")
        if self.structural_tag is not None:
            raise unsupported("structural_tag", "structural tags are not supported; use response_format or "
                                                "structured_outputs")
        if self.continue_final_message and self.add_generation_prompt:
            raise refuse("continue_final_message", "Cannot set both `continue_final_message` and "
                                                   "`add_generation_prompt` to True.")
        reserved = sorted(_template_parameters() & set(self.chat_template_kwargs)) if self.chat_template_kwargs else []
        if reserved:
            raise refuse("chat_template_kwargs", "chat_template_kwargs may not set {names}: the request's own fields "
                                                 "carry them.", names=", ".join(reserved))
        return self

    def template_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for tokenizer.apply_chat_template besides the messages (vLLM's meaning of each)."""
        extra: dict[str, Any] = dict(self.chat_template_kwargs or {})
        if self.documents is not None:
            extra["documents"] = self.documents
        if self.reasoning_effort is not None:
            extra["reasoning_effort"] = self.reasoning_effort
        return {**extra, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message}
