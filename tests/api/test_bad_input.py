"""Bad requests get OpenAI-style 4xx bodies, never a 500, and the server keeps serving."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.api.conftest import MAX_MODEL_LEN, serve_in_thread, tiny_engine


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["message"] and error["type"]
    return error


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_invalid_json_is_400(http, path):
    resp = http.post(path, content=b'{"model": "tiny", "prompt": ', headers={"content-type": "application/json"})
    assert "parse the JSON" in assert_openai_error(resp, 400)["message"]


@pytest.mark.parametrize("field,value", [("max_tokens", "4"), ("temperature", "hot"), ("n", 1.5), ("stream", 1),
                                         ("stop", 7), ("seed", 2**70), ("top_p", 0.0), ("n", 0)])
def test_wrong_type_or_range_is_400_naming_the_field(http, server, field, value):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": "hi", field: value})
    assert assert_openai_error(resp, 400)["param"] == field


def test_unknown_field_is_400_like_openai(http, server):
    resp = http.post("/v1/chat/completions", json={"model": server.model, "messages": [], "tempurature": 0})
    assert assert_openai_error(resp, 400)["message"] == "Unrecognized request argument supplied: tempurature"


def test_prompt_over_max_model_len_is_400(http, server):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": "a" * MAX_MODEL_LEN, "max_tokens": 1})
    assert "maximum context length" in assert_openai_error(resp, 400)["message"]


def test_prompt_plus_max_tokens_over_max_model_len_is_400(http, server):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": "abc", "max_tokens": MAX_MODEL_LEN})
    assert "maximum context length" in assert_openai_error(resp, 400)["message"]


def test_token_id_outside_the_vocabulary_is_400(http, server):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": [1, 2, 10**6], "max_tokens": 1})
    assert "outside the vocabulary" in assert_openai_error(resp, 400)["message"]


def test_body_without_a_json_content_type_is_400_saying_so(http, server):
    body = b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}'
    resp = http.post("/v1/completions", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert "Content-Type: application/json" in assert_openai_error(resp, 400)["message"]


def test_unknown_model_is_404(http):
    resp = http.post("/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
    assert assert_openai_error(resp, 404)["code"] == "model_not_found"


def test_body_over_the_size_limit_is_413(http, server):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": "x" * (9 * 1024 * 1024)})
    assert_openai_error(resp, 413)


def test_unsupported_options_are_400_not_ignored(http, server):
    for body in ({"prompt": "hi", "echo": True}, {"prompt": "hi", "logit_bias": {"5": 10}}):
        assert_openai_error(http.post("/v1/completions", json={"model": server.model, **body}), 400)


def test_server_still_serves_after_bad_input(http, server):
    resp = http.post("/v1/completions", json={"model": server.model, "prompt": "hi", "max_tokens": 3,
                                              "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
    assert http.get("/health").status_code == 200


@pytest.fixture(scope="module")
def guarded(tiny_model):
    """A server with an API key and room for only one waiting request and one running sequence."""
    with serve_in_thread(tiny_engine(tiny_model, max_num_seqs=1, max_waiting_requests=1), api_key="s3cret") as running:
        yield running


def test_api_key_is_required_on_v1_routes(guarded):
    body = {"model": guarded.model, "prompt": "hi", "max_tokens": 1}
    assert_openai_error(httpx.post(guarded.url + "/v1/completions", json=body), 401)
    wrong = httpx.post(guarded.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert_openai_error(wrong, 401)
    right = httpx.post(guarded.url + "/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 200
    assert httpx.get(guarded.url + "/health").status_code == 200  # probes need no key


def test_full_waiting_queue_answers_503_with_retry_after(guarded):
    async def flood() -> list[httpx.Response]:
        headers = {"Authorization": "Bearer s3cret"}
        body = {"model": guarded.model, "prompt": "hello", "max_tokens": 32, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=guarded.url, headers=headers, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(12)))

    responses = asyncio.run(flood())
    refused = [r for r in responses if r.status_code == 503]
    assert refused and all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert all(r.status_code == 200 for r in responses if r not in refused)  # accepted ones all completed
    assert_openai_error(refused[0], 503)
