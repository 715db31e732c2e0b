"""The JSON a prompt describes (llmsim.sim.described) and the answers built from it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import orjson

from llmsim.sim.described import (
    MAX_CANDIDATES,
    described_schema,
    json_hint,
    requested_json,
)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"},
                                           "nick": {"type": "string"}},
          "required": ["name", "age"]}


def test_a_schema_in_the_prompt_wins_over_examples() -> None:
    text = ("Data: {\"id\": 1}. Answer with JSON matching this schema:\n```json\n"
            + json.dumps(SCHEMA, indent=2) + "\n```")
    assert described_schema([text]) == SCHEMA


def test_an_example_object_gives_its_keys_and_types() -> None:
    s = described_schema(['Reply like {"city": "Oslo", "n": 3, "ok": true, "tags": ["a"]}'])
    assert s is not None and s["required"] == ["city", "n", "ok", "tags"]
    assert s["properties"]["n"] == {"type": "integer"}
    assert s["properties"]["tags"]["type"] == "array"


def test_named_keys_and_strings_with_braces() -> None:
    s = described_schema(["Tell a joke, respond in JSON with `setup` and `punchline` keys"])
    assert s is not None and s["required"] == ["setup", "punchline"]
    # braces inside strings do not break the span; a non-JSON span is skipped
    s = described_schema(['{not json} then {"a": "}{", "b": 1}'])
    assert s is not None and set(s["properties"]) == {"a", "b"}
    assert described_schema(["no json here"]) is None


def test_work_is_bounded() -> None:
    """A prompt of a million small objects: only MAX_CANDIDATES are parsed, and the scan
    stops at MAX_SCAN_CHARS (no timed assert: the count of parses is the bound)."""
    text = "{} " * 1_000_000 + json.dumps(SCHEMA)
    assert described_schema([text]) is None  # the schema lies beyond the scanned prefix
    many = " ".join(f'{{"k{i}": 1}}' for i in range(MAX_CANDIDATES * 3))
    s = described_schema([many])
    assert s is not None and set(s["properties"]) == {"k0"}


def test_requested_json_needs_an_explicit_ask() -> None:
    assert requested_json(["Summarise " + json.dumps(SCHEMA)]) is None
    got = requested_json(["Return the correct JSON response within a ```json codeblock.",
                          json.dumps(SCHEMA)])
    assert got == (SCHEMA, True)
    assert json_hint(b'{"content": "as JSON"}') and not json_hint(b'{"content": "hi"}')


def test_chat_json_object_follows_the_prompt_schema(client: Any) -> None:
    for seed in range(10):
        r = client.chat.completions.create(
            model="gpt-4o", seed=seed, response_format={"type": "json_object"},
            messages=[{"role": "system", "content": "Reply in json matching "
                       + json.dumps(SCHEMA)},
                      {"role": "user", "content": "Ann is 31"}])
        value = orjson.loads(r.choices[0].message.content)
        jsonschema.validate(value, SCHEMA)


def test_responses_plain_text_answer_to_a_json_request(client: Any) -> None:
    r = client.responses.create(model="gpt-4o", instructions="Respond in JSON format like "
                                '{"answer": "yes", "confidence": 0.5}', input="Is it?")
    value = orjson.loads(r.output_text)
    assert set(value) == {"answer", "confidence"} and isinstance(value["confidence"], float)
