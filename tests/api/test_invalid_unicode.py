"""Text that is not valid Unicode (lone UTF-16 surrogates, bytes that are not UTF-8) is a 400 naming where
it is, never a 5xx; the next request on the same connection is served."""

from __future__ import annotations

import json

import httpx
import pytest

from railyard.api.errors import error_response


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


# Raw bodies: httpx's json= would refuse to encode a lone surrogate, which is the point.
CASES = {
    "prompt": ("/v1/completions", b'{"model":"tiny","prompt":"\\ud800abc","max_tokens":2}', "prompt"),
    "prompt list": ("/v1/completions", b'{"model":"tiny","prompt":["ok","\\udfffx"],"max_tokens":2}', "prompt"),
    "chat content": ("/v1/chat/completions",
                     b'{"model":"tiny","messages":[{"role":"user","content":"\\ud800"}],"max_tokens":2}', "messages"),
    "text content part": ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":'
                          b'[{"type":"text","text":"a\\udc00"}]}],"max_tokens":2}', "messages"),
    "extra message key": ("/v1/chat/completions",
                          b'{"model":"tiny","messages":[{"role":"user","content":"a","name":"\\ud83d"}]}', "messages"),
    "CESU-8 bytes": ("/v1/completions", b'{"model":"tiny","prompt":"\xed\xa0\x80","max_tokens":2}', "prompt"),
    "model": ("/v1/completions", b'{"model":"\\ud800","prompt":"a","max_tokens":2}', "model"),
    "stop": ("/v1/completions", b'{"model":"tiny","prompt":"a","stop":["\\ud800"],"max_tokens":2}', "stop"),
    "unknown key": ("/v1/completions", b'{"model":"tiny","prompt":"a","\\ud800":1}', None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lone_surrogate_is_a_400_naming_the_field(http, case):
    path, body, param = CASES[case]
    resp = post_raw(http, path, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "lone UTF-16 surrogate" in error["message"]
    ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1})  # same connection
    assert ok.status_code == 200


@pytest.mark.parametrize("bad", [b"\xff", b"\xc0\xaf", b"\xe2\x82"], ids=["ff", "overlong", "truncated"])
def test_bytes_that_are_not_utf8_are_a_400_saying_so(http, bad):
    resp = post_raw(http, "/v1/completions", b'{"model":"tiny","prompt":"' + bad + b'","max_tokens":2}')
    assert resp.status_code == 400, resp.text
    assert "not valid UTF-8" in resp.json()["error"]["message"]


def test_surrogate_pair_written_as_escapes_is_valid_text(http):
    # "\ud83d\ude00" is one character (U+1F600) in JSON: no lone surrogate, so it is served.
    resp = post_raw(http, "/v1/completions", b'{"model":"tiny","prompt":"\\ud83d\\ude00","max_tokens":2}')
    assert resp.status_code == 200, resp.text


def test_an_error_body_renders_even_with_text_utf8_cannot_carry():
    # Whatever a future message quotes, the error itself must not become a 500.
    resp = error_response(400, "bad \ud800 value")
    assert json.loads(resp.body)["error"]["message"] == "bad \ud800 value"
    resp.body.decode("ascii")
