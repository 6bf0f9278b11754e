"""Requests written for vLLM's OpenAI server work here with vLLM's meaning: every field of vLLM's request
models (vllm/entrypoints/openai/protocol.py, CompletionRequest and ChatCompletionRequest, at commit
0052bed36509c7a5a2d8e48265334e40cf2f5a0e) is honoured, accepted where it has no effect in vLLM either, or
refused with a 400 that names it. The table below is the reference; the tests hold the server to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, processors

from railyard.api.protocol import ChatCompletionRequest, CompletionRequest
from railyard.engine.startup.tiny_model import CHAT_TEMPLATE, write_tiny_checkpoint
from railyard.engine.tokenizer import load_tokenizer
from tests.api.conftest import serve_in_thread, tiny_engine

# vLLM's fields, as its protocol module declares them (StreamOptions' two appear as stream_options.*).
VLLM_COMPLETION_FIELDS = {
    "model", "prompt", "prompt_embeds", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
    "n", "presence_penalty", "seed", "stop", "stream", "stream_options.include_usage",
    "stream_options.continuous_usage_stats", "suffix", "temperature", "top_p", "user", "use_beam_search", "top_k",
    "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
    "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "allowed_token_ids", "prompt_logprobs", "add_special_tokens", "response_format", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs"}
VLLM_CHAT_FIELDS = {
    "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
    "stream_options.include_usage", "stream_options.continuous_usage_stats", "temperature", "top_p", "tools",
    "tool_choice", "reasoning_effort", "include_reasoning", "parallel_tool_calls", "user", "best_of", "use_beam_search",
    "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "prompt_logprobs", "allowed_token_ids", "bad_words", "echo", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "documents", "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "guided_decoding_backend",
    "guided_whitespace_pattern", "priority", "request_id", "logits_processors", "return_tokens_as_token_ids",
    "cache_salt", "kv_transfer_params", "vllm_xargs"}

REPO_ROOT = Path(__file__).resolve().parents[2]
HONOURED, NO_EFFECT, REFUSED = "honoured", "accepted, no effect (none in vLLM either)", "refused, 400 naming it"


@dataclass(frozen=True)
class Row:
    """One vLLM field: what railyard does with it, and a request fragment that asks for the feature."""

    name: str
    does: str
    asks: dict[str, Any]
    why: str = ""
    endpoints: tuple[str, ...] = ("completions", "chat")
    # Where the table's own served check cannot run it, the test file that serves it instead.
    served_by: str | None = None


TABLE = [
    # --- OpenAI's own fields
    Row("model", HONOURED, {"model": "tiny"}, "left out, the served model answers (vLLM's rule)"),
    Row("prompt", HONOURED, {"prompt": [1, 2, 3]}, "text, texts, token ids or lists of them",
        endpoints=("completions",)),
    Row("messages", HONOURED, {"messages": [{"role": "user", "content": "hi"}]}, "through the checkpoint's template",
        endpoints=("chat",)),
    Row("best_of", HONOURED, {"n": 2, "best_of": 2}, "equal to n; larger values are refused (nothing ranks)"),
    Row("echo", REFUSED, {"echo": True}, "the output never repeats the prompt / last message"),
    Row("frequency_penalty", HONOURED, {"frequency_penalty": 0.5}),
    Row("logit_bias", REFUSED, {"logit_bias": {"5": 10.0}}, "the sampler has no per-token bias"),
    Row("logprobs", HONOURED, {"logprobs": 2}, endpoints=("completions",)),
    Row("logprobs", HONOURED, {"logprobs": True}, endpoints=("chat",)),
    Row("top_logprobs", HONOURED, {"logprobs": True, "top_logprobs": 2}, endpoints=("chat",)),
    Row("max_tokens", HONOURED, {"max_tokens": 3}),
    Row("max_completion_tokens", HONOURED, {"max_completion_tokens": 3}, endpoints=("chat",)),
    Row("n", HONOURED, {"n": 2}),
    Row("presence_penalty", HONOURED, {"presence_penalty": 0.5}),
    Row("seed", HONOURED, {"seed": 7, "temperature": 1.0}),
    Row("stop", HONOURED, {"stop": ["\n"]}),
    Row("stream", HONOURED, {"stream": True}),
    Row("stream_options.include_usage", HONOURED, {"stream": True, "stream_options": {"include_usage": True}}),
    Row("stream_options.continuous_usage_stats", HONOURED,
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        "implies include_usage as in vLLM; the usage in every chunk comes with the streaming rewrite (issue 12)"),
    Row("suffix", REFUSED, {"suffix": "end"}, "no fill-in-the-middle (vLLM refuses it too)", endpoints=("completions",)),
    Row("temperature", HONOURED, {"temperature": 0.0}),
    Row("top_p", HONOURED, {"top_p": 0.9}),
    Row("user", NO_EFFECT, {"user": "someone"}, "an end-user id for the caller's records"),
    Row("response_format", HONOURED, {"response_format": {"type": "text"}}, "no constraint"),
    Row("response_format", HONOURED, {"response_format": {"type": "json_object"}}, "constrained by xgrammar"),
    Row("tools", HONOURED, {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "rendered by the template; 'auto' parses Hermes/Qwen <tool_call> output (gpt-oss: harmony calls)",
        endpoints=("chat",),
        served_by="tests/api/test_tools.py"),  # the template's tools preamble outgrows this server's 256 tokens
    Row("tool_choice", HONOURED, {"tool_choice": "none"}, "'none' and 'auto' (no tools: no calls)",
        endpoints=("chat",)),
    Row("tool_choice", REFUSED, {"tool_choice": "required"}, "'required' without tools", endpoints=("chat",)),
    Row("parallel_tool_calls", NO_EFFECT, {"parallel_tool_calls": True}, "no tools", endpoints=("chat",)),
    Row("reasoning_effort", HONOURED, {"reasoning_effort": "low"}, "handed to the chat template (gpt-oss's reads it)",
        endpoints=("chat",)),
    Row("include_reasoning", HONOURED, {"include_reasoning": False}, "false leaves reasoning_content out (where a "
        "reasoning parser found some)", endpoints=("chat",), served_by="tests/api/test_think_served.py"),
    # --- vLLM's sampling parameters
    Row("use_beam_search", REFUSED, {"use_beam_search": True}, "no beam search"),
    Row("top_k", HONOURED, {"top_k": 5}),
    Row("min_p", HONOURED, {"min_p": 0.1}),
    Row("repetition_penalty", HONOURED, {"repetition_penalty": 1.2}),
    Row("length_penalty", NO_EFFECT, {"length_penalty": 0.5}, "vLLM reads it only for beam search"),
    Row("stop_token_ids", HONOURED, {"stop_token_ids": [5]}),
    Row("include_stop_str_in_output", HONOURED, {"include_stop_str_in_output": True, "stop": ["a"]}),
    Row("ignore_eos", HONOURED, {"ignore_eos": True}),
    Row("min_tokens", HONOURED, {"min_tokens": 2}),
    Row("skip_special_tokens", HONOURED, {"skip_special_tokens": False}),
    Row("spaces_between_special_tokens", HONOURED, {"spaces_between_special_tokens": False},
        "with skip_special_tokens (vLLM's fast detokenizer: nothing to join)"),
    Row("spaces_between_special_tokens", REFUSED, {"spaces_between_special_tokens": False,
                                                   "skip_special_tokens": False}, "special tokens join as the "
        "tokenizer's decoder joins them"),
    Row("truncate_prompt_tokens", HONOURED, {"truncate_prompt_tokens": 2}, "keeps the prompt's last tokens"),
    Row("allowed_token_ids", REFUSED, {"allowed_token_ids": [1, 2]}, "no allow-list in the sampler"),
    Row("prompt_logprobs", REFUSED, {"prompt_logprobs": 1}, "logprobs of sampled tokens only"),
    Row("bad_words", REFUSED, {"bad_words": ["x"]}, "no banned-sequence filter", endpoints=("chat",)),
    # --- vLLM's extra parameters
    Row("prompt_embeds", REFUSED, {"prompt_embeds": "AAAA"}, "text or token ids only", endpoints=("completions",)),
    Row("add_generation_prompt", HONOURED, {"add_generation_prompt": False}, endpoints=("chat",)),
    Row("continue_final_message", HONOURED, {"add_generation_prompt": False, "continue_final_message": True,
                                             "messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "It is"}]},
        endpoints=("chat",)),
    Row("add_special_tokens", HONOURED, {"add_special_tokens": False}),
    Row("documents", HONOURED, {"documents": [{"title": "t", "text": "x"}]}, "handed to the chat template",
        endpoints=("chat",)),
    Row("chat_template", REFUSED, {"chat_template": "{{ messages }}"}, "the checkpoint's template is used (vLLM "
        "also refuses an untrusted request template)", endpoints=("chat",)),
    Row("chat_template_kwargs", HONOURED, {"chat_template_kwargs": {"greeting": "hey"}}, endpoints=("chat",)),
    Row("mm_processor_kwargs", REFUSED, {"mm_processor_kwargs": {"size": 1}}, "text models only", endpoints=("chat",)),
    Row("guided_json", HONOURED, {"guided_json": {"type": "object"}}, "vLLM's older spelling, constrained by xgrammar"),
    Row("guided_regex", HONOURED, {"guided_regex": "a+"}, "constrained by xgrammar"),
    Row("guided_choice", HONOURED, {"guided_choice": ["a", "b"]}, "constrained by xgrammar"),
    Row("guided_grammar", HONOURED, {"guided_grammar": 'root ::= "a"'}, "xgrammar EBNF"),
    Row("structural_tag", REFUSED, {"structural_tag": "{}"}, "no structural tags", endpoints=("chat",)),
    Row("guided_decoding_backend", NO_EFFECT, {"guided_decoding_backend": "xgrammar"}, "xgrammar is the one backend"),
    Row("guided_whitespace_pattern", REFUSED, {"guided_whitespace_pattern": " "},
        "no whitespace regex; structured_outputs.disable_any_whitespace instead"),
    Row("priority", REFUSED, {"priority": 1}, "on a first-come-first-served engine, as in vLLM; honoured with "
        "--scheduling-policy priority"),
    Row("request_id", HONOURED, {"request_id": "abc-123"}, "the response's id"),
    Row("logits_processors", REFUSED, {"logits_processors": ["my.Processor"]}, "vLLM's default server refuses "
        "them too"),
    Row("return_tokens_as_token_ids", HONOURED, {"return_tokens_as_token_ids": True, "logprobs": 1},
        endpoints=("completions",)),
    Row("return_tokens_as_token_ids", HONOURED, {"return_tokens_as_token_ids": True, "logprobs": True},
        endpoints=("chat",)),
    Row("cache_salt", REFUSED, {"cache_salt": "tenant-a-0123456789"}, "one prefix cache for all requests"),
    Row("kv_transfer_params", REFUSED, {"kv_transfer_params": {"do_remote_prefill": True}}, "no disaggregated "
        "prefill"),
    Row("vllm_xargs", REFUSED, {"vllm_xargs": {"k": 1}}, "no request extensions"),
]

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
BASE = {"completions": {"model": "tiny", "prompt": "hi", "max_tokens": 2},
        "chat": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}
MODELS = {"completions": CompletionRequest, "chat": ChatCompletionRequest}
# A template that shows what it was given, so each template argument's effect is visible in the prompt.
TEMPLATE = ("{% if reasoning_effort %}effort:{{ reasoning_effort }}\n{% endif %}"
            "{% for d in documents or [] %}doc:{{ d.text }}\n{% endfor %}"
            "{% if greeting %}{{ greeting }}\n{% endif %}" + CHAT_TEMPLATE)
BOS = 256  # <|endoftext|>, which this checkpoint's tokenizer puts before every text it encodes


def rows(endpoint: str, does: str | None = None) -> list[Row]:
    return [r for r in TABLE if endpoint in r.endpoints and (does is None or r.does == does)]


def row_id(row: Row) -> str:
    return f"{row.name}={json.dumps(row.asks[row.name.split('.')[0]]) if row.name.split('.')[0] in row.asks else ''}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """The tiny model with a BOS-adding tokenizer (so add_special_tokens shows) and TEMPLATE."""
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("vllm-fields") / "tiny", "qwen2")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>",
                                                                                                  BOS)])
    tok.save(str(path / "tokenizer.json"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return str(path)


@pytest.fixture(scope="module")
def http(checkpoint) -> httpx.Client:
    with serve_in_thread(tiny_engine(checkpoint)) as running:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            yield client


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return load_tokenizer(checkpoint)


def post(http: httpx.Client, endpoint: str, **fields) -> httpx.Response:
    body = {**BASE[endpoint], **fields}
    if body.get("stream"):
        with http.stream("POST", PATHS[endpoint], json=body) as resp:
            resp.read()
            return resp
    return http.post(PATHS[endpoint], json=body)


# -- the table is complete and the request models know every field -------------------------------------------
@pytest.mark.parametrize("endpoint,listed", [("completions", VLLM_COMPLETION_FIELDS), ("chat", VLLM_CHAT_FIELDS)])
def test_table_covers_every_field_of_vllms_request_model(endpoint, listed):
    assert {r.name for r in rows(endpoint)} == listed


@pytest.mark.parametrize("endpoint,listed", [("completions", VLLM_COMPLETION_FIELDS), ("chat", VLLM_CHAT_FIELDS)])
def test_request_model_knows_every_vllm_field(endpoint, listed):
    known = set(MODELS[endpoint].model_fields) | {"stream_options.include_usage",
                                                  "stream_options.continuous_usage_stats"}
    assert listed <= known


# -- each row, as the table says -------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint,row", [(e, r) for e in PATHS for r in rows(e, REFUSED)],
                         ids=lambda v: v if isinstance(v, str) else row_id(v))
def test_refused_field_is_a_400_naming_it(http, endpoint, row):
    resp = post(http, endpoint, **row.asks)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert row.name in error["message"] and error["param"] in (row.name, None)  # the engine's refusals: no param


@pytest.mark.parametrize("endpoint,row", [(e, r) for e in PATHS for r in rows(e) if r.does != REFUSED],
                         ids=lambda v: v if isinstance(v, str) else row_id(v))
def test_honoured_or_harmless_field_is_served(http, endpoint, row):
    if row.served_by is not None:
        assert (REPO_ROOT / row.served_by).is_file()
        return
    resp = post(http, endpoint, **row.asks)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("endpoint", PATHS)
def test_a_request_spelling_out_vllms_defaults_is_served(http, endpoint):
    defaults = dict(use_beam_search=False, length_penalty=1.0, stop_token_ids=[], include_stop_str_in_output=False,
                    ignore_eos=False, min_tokens=0, skip_special_tokens=True, spaces_between_special_tokens=True,
                    truncate_prompt_tokens=None, allowed_token_ids=None, prompt_logprobs=None, priority=0,
                    guided_json=None, guided_regex=None, guided_choice=None, guided_grammar=None,
                    guided_decoding_backend=None, guided_whitespace_pattern=None, logits_processors=None,
                    return_tokens_as_token_ids=None, cache_salt=None, kv_transfer_params=None, vllm_xargs=None,
                    frequency_penalty=0.0, presence_penalty=0.0, logit_bias=None, n=1, seed=None, stop=[],
                    stream=False, stream_options=None, temperature=None, top_p=None, user=None, top_k=None,
                    min_p=None, repetition_penalty=None, response_format=None, best_of=None)
    if endpoint == "completions":
        defaults.update(prompt_embeds=None, echo=False, logprobs=None, suffix=None, add_special_tokens=True)
    else:
        defaults.update(logprobs=False, top_logprobs=0, max_completion_tokens=None, tools=None, tool_choice="none",
                        reasoning_effort=None, include_reasoning=True, parallel_tool_calls=False, bad_words=[],
                        echo=False, add_generation_prompt=True, continue_final_message=False,
                        add_special_tokens=False, documents=None, chat_template=None, chat_template_kwargs=None,
                        mm_processor_kwargs=None, structural_tag=None)
    assert post(http, endpoint, **defaults).status_code == 200


# -- what the honoured vLLM extensions do ----------------------------------------------------------------------
def token_texts(resp: httpx.Response) -> list[str]:
    logprobs = resp.json()["choices"][0]["logprobs"]
    return logprobs["tokens"] if "tokens" in logprobs else [t["token"] for t in logprobs["content"]]


def ids_of(resp: httpx.Response) -> list[int]:
    """The sampled token ids, from logprobs asked for with return_tokens_as_token_ids."""
    tokens = token_texts(resp)
    assert all(t.startswith("token_id:") for t in tokens)
    return [int(t[len("token_id:"):]) for t in tokens]


GREEDY = dict(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0, return_tokens_as_token_ids=True)


def test_truncate_prompt_tokens_keeps_the_prompt_end_like_the_same_ids_sent_directly(http, tokenizer):
    text = "the quick brown fox jumps over the lazy dog"
    truncated = post(http, "completions", prompt=text, truncate_prompt_tokens=6, **GREEDY)
    assert truncated.json()["usage"]["prompt_tokens"] == 6
    kept = [BOS] + tokenizer.encode(text, add_special_tokens=False)[-5:]  # BOS stays, as in HF and vLLM
    assert ids_of(truncated) == ids_of(post(http, "completions", prompt=kept, **GREEDY))


def test_truncate_prompt_tokens_cuts_token_id_prompts_and_chat_prompts(http):
    ids = post(http, "completions", prompt=list(range(40, 60)), truncate_prompt_tokens=5, **GREEDY)
    assert ids_of(ids) == ids_of(post(http, "completions", prompt=list(range(55, 60)), **GREEDY))
    chat = post(http, "chat", truncate_prompt_tokens=3)
    assert chat.json()["usage"]["prompt_tokens"] == 3


def test_add_special_tokens_is_on_for_completions_and_off_for_chat_by_default(http, tokenizer):
    assert post(http, "completions", prompt="abc").json()["usage"]["prompt_tokens"] == 4  # BOS + 3 bytes
    assert post(http, "completions", prompt="abc", add_special_tokens=False).json()["usage"]["prompt_tokens"] == 3
    rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    n = len(tokenizer.encode(rendered, add_special_tokens=False))
    assert post(http, "chat").json()["usage"]["prompt_tokens"] == n
    assert post(http, "chat", add_special_tokens=True).json()["usage"]["prompt_tokens"] == n + 1


@pytest.mark.parametrize("fields,rendered", [
    ({"chat_template_kwargs": {"greeting": "hey"}}, "hey\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ({"documents": [{"title": "t", "text": "abc"}]},
     "doc:abc\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ({"reasoning_effort": "low"}, "effort:low\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ({"add_generation_prompt": False}, "<|im_start|>user\nhi<|im_end|>\n"),
    ({"add_generation_prompt": False, "continue_final_message": True,
      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "It is"}]},
     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nIt is"),
], ids=["chat_template_kwargs", "documents", "reasoning_effort", "add_generation_prompt", "continue_final_message"])
def test_template_arguments_reach_the_template(http, tokenizer, fields, rendered):
    resp = post(http, "chat", **fields)
    assert resp.json()["usage"]["prompt_tokens"] == len(tokenizer.encode(rendered, add_special_tokens=False))


def test_chat_template_kwargs_may_not_replace_the_templates_own_arguments(http):
    resp = post(http, "chat", chat_template_kwargs={"tokenize": True})
    assert resp.status_code == 400 and "tokenize" in resp.json()["error"]["message"]


@pytest.mark.parametrize("endpoint,prefix", [("completions", "cmpl-"), ("chat", "chatcmpl-")])
def test_request_id_becomes_the_response_id(http, endpoint, prefix):
    assert post(http, endpoint, request_id="my-req-7").json()["id"] == prefix + "my-req-7"


@pytest.mark.parametrize("endpoint", PATHS)
def test_return_tokens_as_token_ids_names_the_tokens_otherwise_shown_as_text(http, tokenizer, endpoint):
    greedy = dict(GREEDY, logprobs=endpoint == "chat" or 0)
    as_ids = ids_of(post(http, endpoint, **greedy))
    as_text = token_texts(post(http, endpoint, **dict(greedy, return_tokens_as_token_ids=False)))
    assert [tokenizer.decode([t]) for t in as_ids] == as_text


def test_leaving_out_model_means_the_served_model(http):
    body = {k: v for k, v in BASE["completions"].items() if k != "model"}
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.json()["model"] == "tiny"


def test_min_tokens_holds_back_stop_tokens(http):
    first = ids_of(post(http, "completions", **GREEDY))[0]
    stop_at_once = dict(GREEDY, ignore_eos=False, stop_token_ids=[first], max_tokens=8)
    assert len(ids_of(post(http, "completions", **stop_at_once))) == 1
    assert len(ids_of(post(http, "completions", **stop_at_once, min_tokens=3))) >= 3


@pytest.mark.parametrize("endpoint", PATHS)
def test_continuous_usage_stats_implies_the_final_usage_chunk(http, endpoint):
    resp = post(http, endpoint, stream=True, stream_options={"continuous_usage_stats": True}, ignore_eos=True)
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("endpoint", PATHS)
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(http, endpoint):
    resp = post(http, endpoint, stream=True, stream_options={"continuous_usage_stats": True}, ignore_eos=True,
                max_tokens=4)
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    assert all(e.get("usage") for e in events)  # the role chunk, every token chunk and the final one
    chunks = [e for e in events if e["choices"]]
    done = [e["usage"]["completion_tokens"] for e in chunks]
    assert done == sorted(done) and done[-1] == 4  # never decreasing, ending at max_tokens
    prompt = events[-1]["usage"]["prompt_tokens"]
    assert all(e["usage"]["prompt_tokens"] == prompt and
               e["usage"]["total_tokens"] == prompt + e["usage"]["completion_tokens"] for e in events)
