"""With an API key, everything but /health and /metrics needs it: the API and its docs (/docs, /redoc,
/openapi.json) alike. Probes and scrapers stay open."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import serve_in_thread, tiny_engine

KEY = "s3cret"
DOCS = ["/docs", "/redoc", "/openapi.json"]


@pytest.fixture(scope="module")
def guarded(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model), api_key=KEY) as running:
        yield running


@pytest.mark.parametrize("path", DOCS + ["/v1/models"])
def test_docs_and_api_need_the_key(guarded, path):
    refused = httpx.get(guarded.url + path)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(guarded.url + path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(guarded.url + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_probes_and_metrics_stay_open(guarded, path):
    assert httpx.get(guarded.url + path).status_code == 200


@pytest.mark.parametrize("path", DOCS)
def test_docs_are_open_on_a_server_without_a_key(server, path):
    assert httpx.get(server.url + path).status_code == 200
