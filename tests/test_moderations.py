"""``POST /v1/moderations`` through the official SDK (strict): every category and score field
the SDK's type has, deterministic from the text, flags from a script rule; bad inputs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmsim.sim.moderation import CATEGORIES, FLAG_THRESHOLD
from llmsim.sim.script import ScriptError, parse_script

from . import faultkit

SCRIPT = {"rules": [{"match": {"endpoint": "moderations", "regex": "(?i)\\b(attack|kill)\\b"},
                     "reply": [{"flag": ["violence", "harassment/threatening"]}]}]}


def test_every_category_and_deterministic_scores(client: Any) -> None:
    r = client.moderations.create(input="What a lovely day.")
    m = r.results[0]
    assert r.model == "omni-moderation-latest" and r.id.startswith("modr-")
    cats = m.categories.model_dump(by_alias=True)
    scores = m.category_scores.model_dump(by_alias=True)
    applied = m.category_applied_input_types.model_dump(by_alias=True)
    assert set(cats) == set(scores) == set(applied) == set(CATEGORIES)
    assert not m.flagged and not any(cats.values())
    assert all(0 < s < FLAG_THRESHOLD for s in scores.values())
    assert all(v == ["text"] for v in applied.values())
    again = client.moderations.create(input="What a lovely day.").results[0]
    assert again.category_scores == m.category_scores
    other = client.moderations.create(input="What a lovely night.").results[0]
    assert other.category_scores != m.category_scores


def test_script_flags_and_lists(make_server: Any) -> None:
    srv = make_server()
    srv.app.script.install(parse_script(SCRIPT))
    from openai import OpenAI
    with OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0,
                _strict_response_validation=True) as c:
        r = c.moderations.create(model="text-moderation-latest",
                                 input=["I will attack you", "Have a nice day"])
    a, b = r.results
    assert a.flagged and a.categories.violence and a.categories.harassment_threatening
    assert a.category_scores.violence > FLAG_THRESHOLD > a.category_scores.hate
    assert not b.flagged
    assert a.categories.illicit is False  # text-moderation models have no illicit scores


def test_multimodal_input(client: Any) -> None:
    r = client.moderations.create(model="omni-moderation-latest", input=[
        {"type": "text", "text": "a picture"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    assert len(r.results) == 1
    applied = r.results[0].category_applied_input_types
    assert applied.violence == ["text", "image"] and applied.hate == ["text"]


@pytest.mark.parametrize("body,param", [
    ({"input": 3}, "input"),
    ({"input": []}, "input"),
    ({"input": ["x"] * 257}, "input"),
    ({"input": [{"type": "audio"}]}, "input[0].type"),
    ({"input": [{"type": "image_url", "image_url": {"url": "a"}}] * 2}, "input"),
    ({"model": "text-moderation-latest", "input": [{"type": "text", "text": "x"}]}, "model"),
    ({"model": "gpt-4o", "input": "x"}, "model"),
    ({}, "input"),
])
def test_bad_requests(srv: Any, body: dict[str, Any], param: str) -> None:
    r = httpx.post(srv.url + "/v1/moderations", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_script_validation() -> None:
    with pytest.raises(ScriptError, match="flag"):
        parse_script({"rules": [{"reply": [{"flag": ["bogus"]}]}]})


async def test_faults() -> None:
    srv = faultkit.server()
    h = [("content-type", "application/json")]
    ex = await faultkit.exchange(srv, {"input": "x"}, path="/v1/moderations",
                                 headers=h + [("x-llmsim-fault", "429")])
    assert ex.status == 429
    srv.app.script.install(parse_script({"rules": [
        {"match": {"endpoint": "moderations"}, "reply": [{"fault": "503"}]}]}))
    ex = await faultkit.exchange(srv, {"input": "x"}, path="/v1/moderations", headers=h)
    assert ex.status == 503
