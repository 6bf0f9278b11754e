"""vLLM's sleep-mode routes through real uvicorn: off (404, saying which flag) unless the server enables them, then
behind the API key; POST /sleep?level= takes the engine's memory away, GET /is_sleeping says so, a completion sent
meanwhile waits and is answered after POST /wake_up with the tokens the awake engine gives (the control); a bad
level or tag is a 400 with an OpenAI-style body (the engine's refusal to sleep while requests run is
tests/engine/core/test_sleep_mode.py's)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.api.conftest import MODEL_NAME, serve_in_thread, tiny_engine

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": MODEL_NAME, "prompt": [5, 17, 42, 99, 7], "max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model, enable_sleep_mode=True), api_key=KEY, sleep_endpoints=True) as running:
        yield running


def _text(url: str) -> str:
    resp = httpx.post(url + "/v1/completions", json=BODY, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_the_routes_are_off_unless_the_server_enables_them(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model, enable_sleep_mode=True)) as running:
        for method, path in (("post", "/sleep?level=1"), ("post", "/wake_up"), ("get", "/is_sleeping")):
            resp = httpx.request(method, running.url + path)
            assert resp.status_code == 404
            assert "--enable-sleep-endpoints" in resp.json()["error"]["message"]


def test_the_routes_need_the_api_key(server):
    assert httpx.post(server.url + "/sleep?level=1").status_code == 401
    assert httpx.get(server.url + "/is_sleeping").status_code == 401


@pytest.mark.parametrize("level", [1, 2])
def test_a_completion_sent_while_asleep_is_answered_after_wake_up_as_before(server, level):
    control = _text(server.url)
    assert httpx.post(server.url + f"/sleep?level={level}", headers=AUTH, timeout=60).status_code == 200
    assert httpx.get(server.url + "/is_sleeping", headers=AUTH).json() == {"is_sleeping": True}
    answer: list[str] = []
    waiting = threading.Thread(target=lambda: answer.append(_text(server.url)))
    waiting.start()
    waiting.join(1.0)
    assert not answer  # held while the engine sleeps
    assert httpx.post(server.url + "/wake_up", headers=AUTH, timeout=60).status_code == 200
    waiting.join(60)
    assert answer == [control]
    assert httpx.get(server.url + "/is_sleeping", headers=AUTH).json() == {"is_sleeping": False}


@pytest.mark.parametrize("path", ["/sleep?level=3", "/sleep?level=one", "/wake_up?tags=optimizer"])
def test_a_bad_level_or_tag_is_a_400(server, path):
    resp = httpx.post(server.url + path, headers=AUTH)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"]
    assert httpx.get(server.url + "/is_sleeping", headers=AUTH).json() == {"is_sleeping": False}

