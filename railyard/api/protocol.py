"""The OpenAI request bodies railyard accepts (pydantic, the HTTP edge only).

Strict like OpenAI: wrong types are not coerced and unknown fields are refused, except the
sampling extensions vLLM also accepts (top_k, min_p, repetition_penalty, ...), which the
official client sends through `extra_body`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Bounds that keep every value representable in the engine's int64 / float32 tensors.
_INT64 = 2**63 - 1
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Seed = Annotated[int, Field(ge=-_INT64 - 1, le=_INT64 - 128)]  # seed + choice index stays a valid generator seed


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(StrictModel):
    include_usage: bool = False


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
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
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
    # Extensions (vLLM's names).
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=1e6)
    min_tokens: int = Field(default=0, ge=0, le=_INT64)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = Field(default=0, ge=-_INT64, le=_INT64)
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(default=16, ge=1, le=_INT64)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=128)
    suffix: str | None = None


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; extra keys (tool_calls, name, ...) pass through to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

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
    add_generation_prompt: bool = True
