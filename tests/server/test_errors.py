"""Every error in OpenAI's shape, with a precise param; none of them reaches the engine."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
JSON_TYPE = {"content-type": "application/json"}


def post(live, path, body=None, content=None, headers=None):
    return httpx.post(f"{live.url}{path}", json=body, content=content, headers=headers)


def expect(response, status, param=None, code=None, words=""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code
    assert words.lower() in error["message"].lower()
    return error


BAD = [
    (CHAT, {"messages": USER, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": USER, "temperature": -1}, "temperature"),
    (CHAT, {"messages": USER, "top_p": 1.5}, "top_p"),
    (CHAT, {"messages": USER, "top_k": -2}, "top_k"),
    (CHAT, {"messages": USER, "max_tokens": 1.5}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": USER, "seed": "7"}, "seed"),
    (CHAT, {"messages": USER, "stream": "yes"}, "stream"),
    (CHAT, {"messages": USER, "top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    (CHAT, {"messages": USER, "presence_penalty": 3}, "presence_penalty"),
    (CHAT, {"messages": USER, "logit_bias": {"x": 1}}, "logit_bias"),
    (CHAT, {"messages": USER, "logit_bias": {"99999": 1}}, "logit_bias"),
    (CHAT, {"messages": USER, "stop_token_ids": [-1]}, "stop_token_ids"),
    (CHAT, {"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
    (CHAT, {"messages": USER, "tool_choice": "required"}, "tool_choice"),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT, {}, "messages"),
    (COMPLETIONS, {"prompt": 5}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 99999]}, "prompt"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "best_of": 2}, "best_of"),
    (COMPLETIONS, {"prompt": "x", "suffix": "y"}, "suffix"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_wrong_types_and_ranges_are_400_naming_the_field(live, engine, path, body, param):
    expect(post(live, path, body), 400, param=param)
    assert engine.started == [] and engine.aborted == []


def test_unknown_fields_are_ignored(live):
    body = {"messages": USER, "max_tokens": 3, "some_future_field": {"x": 1}, "metadata": {}}
    assert post(live, CHAT, body).status_code == 200


def test_n_above_128_is_refused_clearly(live):
    with pytest.raises(openai.BadRequestError) as err:
        live.client().chat.completions.create(model="fake-flash", messages=USER, n=129)
    assert err.value.body["param"] == "n" and "at most 128" in err.value.body["message"]


def test_malformed_json_and_non_object_bodies(live, engine):
    expect(
        post(live, CHAT, content=b'{"messages": [', headers={"content-type": "application/json"}),
        400,
        code="invalid_json",
        words="not valid JSON",
    )
    expect(post(live, CHAT, content=b"\xff\xfe", headers=JSON_TYPE), 400, code="invalid_json")
    expect(post(live, CHAT, body=[1, 2]), 400, words="JSON object")
    assert engine.started == []


def test_prompt_past_the_context(live, engine):
    long = "hello world " * 600
    error = expect(
        post(live, COMPLETIONS, {"prompt": long}),
        400,
        param="prompt",
        code="context_length_exceeded",
        words="maximum context length is 1024",
    )
    assert "1024" in error["message"]
    expect(
        post(live, CHAT, {"messages": USER, "max_tokens": 5000}),
        400,
        param="messages",
        code="context_length_exceeded",
    )
    with pytest.raises(openai.BadRequestError) as err:
        live.client().completions.create(model="fake-flash", prompt=long)
    assert err.value.code == "context_length_exceeded"
    assert engine.started == []


def test_oversized_body_is_413(serve, engine):
    live = serve(engine, max_body_bytes=1000)
    expect(post(live, COMPLETIONS, {"prompt": "x" * 2000}), 413, code="request_too_large")

    def chunks():  # no content-length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    r = httpx.post(f"{live.url}{COMPLETIONS}", content=chunks(), headers=JSON_TYPE)
    expect(r, 413, code="request_too_large")
    assert engine.started == []


def test_unknown_model_and_route(live):
    expect(
        post(live, CHAT, {"model": "gpt-4", "messages": USER}),
        404,
        param="model",
        code="model_not_found",
    )
    r = httpx.get(f"{live.url}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_full_queue_is_429(serve, tokenizer):
    engine = FakeEngine(tokenizer=tokenizer, max_queue=0)
    live = serve(engine)
    with pytest.raises(openai.RateLimitError) as err:
        live.client().completions.create(model="fake-flash", prompt="hello", max_tokens=3)
    assert err.value.code == "queue_full"
    r = post(live, COMPLETIONS, {"prompt": "hello", "stream": True})
    expect(r, 429, code="queue_full")


def test_request_timeout(serve, tokenizer):
    engine = FakeEngine(tokenizer=tokenizer, delay=0.05)
    live = serve(engine, request_timeout=0.3)
    r = post(live, COMPLETIONS, {"prompt": "hello", "max_tokens": 100})
    expect(r, 408, code="request_timeout")
    assert len(engine.aborted) == 1
    with pytest.raises(openai.APIError) as err:
        list(
            live.client().completions.create(
                model="fake-flash", prompt="hello", max_tokens=100, stream=True
            )
        )
    assert "request-timeout" in str(err.value)
    assert len(engine.aborted) == 2


def test_api_key_protects_v1_routes(serve, engine):
    live = serve(engine, api_keys=["secret", "other"])
    with pytest.raises(openai.AuthenticationError):
        live.client(api_key="wrong").models.list()
    assert [m.id for m in live.client(api_key="other").models.list()] == ["fake-flash"]
    r = httpx.post(f"{live.url}{CHAT}", json={"messages": USER})
    expect(r, 401, code="invalid_api_key")
    assert httpx.get(f"{live.url}/health").status_code == 200
    assert engine.started == []


def test_engine_error_reaches_the_client(serve, tokenizer):
    class Failing(FakeEngine):
        async def _run(self, prompt_ids, params, request_id):
            from flashlane.request import FinishReason, RequestOutput

            yield RequestOutput(request_id, prompt_ids, [5], "x", None, 1)
            yield RequestOutput(
                request_id, prompt_ids, [5], "x", FinishReason.ERROR, 1, error="NaN logits"
            )

    live = serve(Failing(tokenizer=tokenizer))
    with pytest.raises(openai.InternalServerError, match="NaN logits"):
        live.client().completions.create(model="fake-flash", prompt="hi", max_tokens=3)
    with pytest.raises(openai.APIError, match="NaN logits"):
        list(live.client().chat.completions.create(model="fake-flash", messages=USER, stream=True))
