"""A bounded schema-driven fuzz of the live server (issue 30): schemathesis reads the server's
own /openapi.json and sends bodies it allows (positive) and bodies that break it (negative:
wrong types, missing fields, values out of range) to every route, against the fake engine. No
answer may be a 5xx, and every error is in OpenAI's shape. Deterministic, so a CI run is
reproducible; at most NUM_EXAMPLES cases per mode and route."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from flashlane.server.api import build_app
from flashlane.server.openapi import openapi_document
from tests.server.conftest import LiveServer
from tests.server.fake_engine import FakeEngine, build_tokenizer

NUM_EXAMPLES = 100

schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    deterministic=True,
    database="none",
)


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[FakeEngine, LiveServer, requests.Session]]:
    # a short context: a reply the fuzzer asks for (up to max_tokens) stays short
    engine = FakeEngine(tokenizer=build_tokenizer(), context_len=96)
    live = LiveServer(build_app(engine))
    with requests.Session() as session:
        yield engine, live, session
    live.stop()


def test_the_published_document_is_the_fuzzed_one(target):
    _, live, _ = target
    assert httpx.get(f"{live.url}/openapi.json").json() == openapi_document()


@schema.parametrize()
@settings(max_examples=NUM_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_for_what_the_schema_allows_or_breaks(target, case):
    engine, live, session = target
    engine.reset()
    response = case.call(base_url=live.url, session=session, timeout=30)
    assert response.status_code < 500, (case.path, case.body, response.text)
    if response.status_code >= 400 and case.path != "/metrics":
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
