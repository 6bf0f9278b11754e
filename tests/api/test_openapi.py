"""The OpenAPI document declares the errors the server really sends (400, 401, 404, 413, 503) with the
error body's model, and no 422 (validation failures are 400 here, as at OpenAI)."""

from __future__ import annotations

import httpx
import jsonschema
import pytest

from tests.api.conftest import serve_in_thread, tiny_engine

KEY = "s3cret"
ROUTES = [("/v1/completions", "post"), ("/v1/chat/completions", "post")]


@pytest.fixture(scope="module")
def guarded(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model), api_key=KEY, max_request_bytes=4096) as running:
        yield running


@pytest.fixture(scope="module")
def document(guarded) -> dict:
    resp = httpx.get(guarded.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200
    return resp.json()


@pytest.mark.parametrize("path,method", ROUTES)
def test_openai_routes_declare_their_error_statuses_with_the_error_model(document, path, method):
    responses = document["paths"][path][method]["responses"]
    for status in ("400", "401", "404", "413", "503"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, status
    assert "422" not in responses


def test_no_route_declares_422(document):
    assert all("422" not in op["responses"] for ops in document["paths"].values() for op in ops.values())
    assert "HTTPValidationError" not in document["components"]["schemas"]


def real_errors(url: str) -> dict[int, httpx.Response]:
    auth = {"Authorization": f"Bearer {KEY}"}
    return {
        400: httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 0}, headers=auth),
        401: httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi"}),
        404: httpx.post(url + "/v1/completions", json={"model": "gpt-9", "prompt": "hi"}, headers=auth),
        413: httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x" * 5000}, headers=auth),
    }


def test_real_error_bodies_match_the_declared_model(guarded, document):
    schema = {"$ref": "#/components/schemas/ErrorResponse", "components": document["components"]}
    for status, resp in real_errors(guarded.url).items():
        assert resp.status_code == status, resp.text
        jsonschema.validate(resp.json(), schema)
