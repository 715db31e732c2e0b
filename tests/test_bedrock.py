"""Amazon Bedrock Runtime (issue 32) through boto3's ``bedrock-runtime`` client (a local
``endpoint_url``, dummy credentials), plus raw checks of the event-stream framing (both CRCs),
the error type header and the bounds."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, EventStreamError

from llmsim import Config, ServerThread
from tests import rawhttp

MODEL = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
HI = [{"role": "user", "content": [{"text": "Say hi"}]}]
TOOLS = {"tools": [{"toolSpec": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}}}]}


def _client(url: str, key: str = "AKIDTEST") -> Any:
    return boto3.client("bedrock-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key="secret",
                        config=BotoConfig(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=9, quiet=True)) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: Any) -> Any:
    return _client(srv.url)


def frames(body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """Parse an event stream, checking every length and both CRCs."""
    out = []
    at = 0
    while at < len(body):
        total, hlen, pcrc = struct.unpack(">III", body[at:at + 12])
        assert pcrc == zlib.crc32(body[at:at + 8])
        msg = body[at:at + total]
        assert len(msg) == total and struct.unpack(">I", msg[-4:])[0] == zlib.crc32(msg[:-4])
        headers: dict[str, str] = {}
        h = msg[12:12 + hlen]
        i = 0
        while i < len(h):
            n = h[i]
            name = h[i + 1:i + 1 + n].decode()
            assert h[i + 1 + n] == 7  # string
            vlen = struct.unpack(">H", h[i + 2 + n:i + 4 + n])[0]
            headers[name] = h[i + 4 + n:i + 4 + n + vlen].decode()
            i += 4 + n + vlen
        out.append((headers, msg[12 + hlen:-4]))
        at += total
    return out


def test_converse(client: Any) -> None:
    r = client.converse(modelId=MODEL, messages=HI, inferenceConfig={"maxTokens": 300},
                        system=[{"text": "Be brief."}])
    assert r["output"]["message"]["content"][0]["text"] and r["stopReason"] == "end_turn"
    u = r["usage"]
    assert u["totalTokens"] == u["inputTokens"] + u["outputTokens"] and "latencyMs" in r["metrics"]
    cut = client.converse(modelId=MODEL, inferenceConfig={"maxTokens": 6},
                          messages=[{"role": "user", "content": [{"text": "A long story"}]}])
    assert cut["stopReason"] == "max_tokens" and cut["usage"]["outputTokens"] == 6


def test_converse_stream(client: Any) -> None:
    st = client.converse_stream(modelId=MODEL, messages=HI, inferenceConfig={"maxTokens": 8})
    events = list(st["stream"])
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    assert kinds.count("contentBlockDelta") == 8
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 8


def test_tools_and_thinking(client: Any) -> None:
    ask = [{"role": "user", "content": [{"text": "What is the weather in Paris?"}]}]
    r = client.converse(modelId=MODEL, messages=ask, toolConfig=TOOLS)
    use = r["output"]["message"]["content"][-1]["toolUse"]
    assert r["stopReason"] == "tool_use" and use["name"] == "get_weather"
    assert isinstance(use["input"]["city"], str)
    follow = client.converse(modelId=MODEL, toolConfig=TOOLS, messages=[
        *ask, r["output"]["message"],
        {"role": "user", "content": [{"toolResult": {"toolUseId": use["toolUseId"],
                                                     "content": [{"text": "Sunny"}]}}]}])
    assert follow["stopReason"] == "end_turn"
    st = client.converse_stream(modelId=MODEL, messages=ask, toolConfig=TOOLS)
    events = list(st["stream"])
    start = next(e for e in events if "contentBlockStart" in e)
    pieces = "".join(e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events
                     if "contentBlockDelta" in e and "toolUse" in e["contentBlockDelta"]["delta"])
    assert start["contentBlockStart"]["start"]["toolUse"]["name"] == "get_weather"
    assert isinstance(json.loads(pieces)["city"], str)
    t = client.converse(modelId=MODEL, messages=ask, inferenceConfig={"maxTokens": 4000},
                        additionalModelRequestFields={"thinking": {"type": "enabled",
                                                                   "budget_tokens": 2000}})
    first = t["output"]["message"]["content"][0]
    assert first["reasoningContent"]["reasoningText"]["text"]


def test_invoke_model_anthropic_bodies(client: Any) -> None:
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 20,
            "messages": [{"role": "user", "content": "Say hi"}]}
    r = client.invoke_model(modelId=MODEL, body=json.dumps(body))
    msg = json.loads(r["body"].read())
    assert msg["type"] == "message" and msg["content"][0]["text"]
    headers = r["ResponseMetadata"]["HTTPHeaders"]
    assert int(headers["x-amzn-bedrock-output-token-count"]) == msg["usage"]["output_tokens"]
    s = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(
        {**body, "max_tokens": 5}))
    events = [json.loads(e["chunk"]["bytes"]) for e in s["body"]]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 5
    with pytest.raises(ClientError) as ei:
        client.invoke_model(modelId=MODEL, body=json.dumps({**body, "anthropic_version": "x"}))
    assert ei.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError):
        client.invoke_model(modelId=MODEL, body=json.dumps({**body, "model": "claude"}))


def test_event_stream_framing_raw(srv: Any) -> None:
    r = rawhttp.request(srv.url, "POST", f"/model/{MODEL}/converse-stream",
                        {"messages": HI, "inferenceConfig": {"maxTokens": 3}})
    assert r.headers["content-type"] == "application/vnd.amazon.eventstream"
    got = frames(r.body)
    assert [h[":event-type"] for h, _ in got] == [
        "messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockDelta",
        "contentBlockStop", "messageStop", "metadata"]
    assert all(h[":message-type"] == "event" for h, _ in got)
    assert json.loads(got[1][1])["delta"]["text"]


def test_errors_in_bedrocks_shape(client: Any, srv: Any) -> None:
    url = srv.url + f"/model/{MODEL}/converse"
    for body in ({"messages": []}, {"messages": "x"}, {"messages": HI, "bogus": 1},
                 {"messages": HI, "inferenceConfig": {"maxTokens": 0}},
                 {"messages": HI, "inferenceConfig": {"stopSequences": ["a"] * 50}},
                 {"messages": [{"role": "wizard", "content": [{"text": "x"}]}]},
                 {"messages": [{"role": "user", "content": [{"nope": 1}]}]},
                 {"messages": HI, "toolConfig": {"tools": [{"toolSpec": {"name": "bad name"}}]}}):
        r = httpx.post(url, json=body)
        assert r.status_code == 400, body
        assert r.headers["x-amzn-errortype"].startswith("ValidationException:")
        assert set(r.json()) == {"message"}
    with pytest.raises(ClientError) as ei:
        client.converse(modelId=MODEL, messages=HI, inferenceConfig={"maxTokens": 10 ** 6})
    assert ei.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as ei:
        def fault(request: Any, **kw: Any) -> None:
            request.headers["x-llmsim-fault"] = "429"
        c = _client(srv.url)
        c.meta.events.register("before-sign.bedrock-runtime.Converse", fault)
        c.converse(modelId=MODEL, messages=HI)
    assert ei.value.response["Error"]["Code"] == "ThrottlingException"
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    metrics = httpx.get(srv.url + "/metrics").text  # the model label comes from the path
    assert f'endpoint="bedrock.converse",model="{MODEL}",transport="http",status="429"' in metrics


def test_mid_stream_fault_is_an_exception_frame(srv: Any) -> None:
    r = rawhttp.request(srv.url, "POST", f"/model/{MODEL}/converse-stream",
                        {"messages": HI, "inferenceConfig": {"maxTokens": 8}},
                        headers=[("x-llmsim-fault", "error-after:2")])
    got = frames(r.body)
    assert got[-1][0][":message-type"] == "exception"
    assert got[-1][0][":exception-type"] == "modelStreamErrorException"
    c = _client(srv.url)

    def fault(request: Any, **kw: Any) -> None:
        request.headers["x-llmsim-fault"] = "error-after:2"
    c.meta.events.register("before-sign.bedrock-runtime.ConverseStream", fault)
    st = c.converse_stream(modelId=MODEL, messages=HI, inferenceConfig={"maxTokens": 8})
    with pytest.raises(EventStreamError):
        list(st["stream"])


def test_sigv4_key_checked_and_scripts(make_server: Any) -> None:
    s = make_server(api_key=("AKIDGOOD",))
    assert _client(s.url, "AKIDGOOD").converse(modelId=MODEL, messages=HI)["output"]
    with pytest.raises(ClientError) as ei:
        _client(s.url, "AKIDBAD").converse(modelId=MODEL, messages=HI)
    assert ei.value.response["Error"]["Code"] == "AccessDeniedException"
    rawhttp.request(s.url, "POST", "/llmsim/scripts", {"rules": [
        {"match": {"endpoint": "bedrock.converse"}, "reply": [{"text": "Scripted."}]}]},
        headers=[("authorization", "Bearer AKIDGOOD")])
    r = _client(s.url, "AKIDGOOD").converse(modelId=MODEL, messages=HI)
    assert r["output"]["message"]["content"][0]["text"] == "Scripted."


def test_oversized_bodies_in_each_familys_shape() -> None:
    with ServerThread(Config(port=0, latency="instant", quiet=True, max_body_bytes=1024)) as s:
        big = b'{"x":"' + b"a" * 3000 + b'"}'
        r = httpx.post(s.url + f"/model/{MODEL}/converse", content=big)
        assert r.status_code == 413 and r.headers["x-amzn-errortype"].startswith("Validation")
        r = httpx.post(s.url + "/api/chat", content=big)
        assert r.status_code == 413 and set(r.json()) == {"error"}
        r = httpx.post(s.url + "/v1beta/models/gemini-2.0-flash:generateContent", content=big)
        assert r.status_code == 413 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_sigv4_signatures_verified_with_aws_keys(make_server: Any) -> None:
    s = make_server(aws_keys=("AKIDGOOD:s3cret",))

    def client(key: str, secret: str) -> Any:
        return boto3.client("bedrock-runtime", endpoint_url=s.url, region_name="us-west-2",
                            aws_access_key_id=key, aws_secret_access_key=secret,
                            config=BotoConfig(retries={"max_attempts": 1}))

    good = client("AKIDGOOD", "s3cret")
    assert good.converse(modelId=MODEL, messages=HI)["stopReason"]
    assert list(good.converse_stream(modelId=MODEL, messages=HI)["stream"])[-1]["metadata"]
    for key, secret, code in (("AKIDGOOD", "wrong", "InvalidSignatureException"),
                              ("AKIDBAD", "s3cret", "UnrecognizedClientException")):
        with pytest.raises(ClientError) as ei:
            client(key, secret).converse(modelId=MODEL, messages=HI)
        assert ei.value.response["Error"]["Code"] == code
        assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    tamper = client("AKIDGOOD", "s3cret")

    def swap(request: Any, **kw: Any) -> None:  # the body changed after signing
        request.body = request.body.replace(b"Say hi", b"Say no")
    tamper.meta.events.register("before-send.bedrock-runtime.Converse", swap)
    with pytest.raises(ClientError) as ei:
        tamper.converse(modelId=MODEL, messages=HI)
    assert ei.value.response["Error"]["Code"] == "InvalidSignatureException"
    r = httpx.post(s.url + f"/model/{MODEL}/converse", json={"messages": HI})
    assert r.status_code == 403 and r.json() == {"message": "Missing Authentication Token"}
    assert httpx.post(s.url + "/api/chat", json={  # other families: not SigV4
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "stream": False}).status_code == 200


def test_invoke_model_nova_bodies(client: Any) -> None:
    nova = "us.amazon.nova-lite-v1:0"
    body = {"schemaVersion": "messages-v1", "system": [{"text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"text": "Say hi"}]}],
            "inferenceConfig": {"max_new_tokens": 6, "top_p": 0.9, "top_k": 20}}
    out = json.loads(client.invoke_model(modelId=nova, body=json.dumps(body))["body"].read())
    assert out["output"]["message"]["content"][0]["text"] and out["stopReason"] == "max_tokens"
    assert out["usage"]["outputTokens"] == 6
    s = client.invoke_model_with_response_stream(modelId=nova, body=json.dumps(body))
    events = [json.loads(e["chunk"]["bytes"]) for e in s["body"]]
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    assert kinds.count("contentBlockDelta") == 6
    assert events[-1]["metadata"]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 6
    for bad in ({**body, "inferenceConfig": {"maxTokens": 5}}, {**body, "bogus": 1},
                {**body, "inferenceConfig": {"top_k": 1000}}, {"schemaVersion": "messages-v1"}):
        with pytest.raises(ClientError) as ei:
            client.invoke_model(modelId=nova, body=json.dumps(bad))
        assert ei.value.response["Error"]["Code"] == "ValidationException"
