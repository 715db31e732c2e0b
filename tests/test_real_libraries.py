"""Client libraries nobody here wrote, against the simulated model's behaviour (issue 13):
LangChain parses a pydantic model described only in the prompt (json_mode), openai-agents
completes a tool loop under a token limit on the Responses and the Chat Completions models
(both in the ``test`` extra; nothing installs here), and instructor's JSON / MD_JSON prompts
(reproduced byte for byte: instructor pins ``openai`` below the version the WebSocket tests
need, so it cannot share the test environment) parse into the pydantic model."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import openai
import pytest
from pydantic import BaseModel


class User(BaseModel):
    name: str
    age: int
    email: str | None = None
    tags: list[str] = []


class Joke(BaseModel):
    setup: str
    punchline: str


@pytest.fixture
def srv(make_server: Any) -> Any:
    """The product defaults (natural lengths: ``--max-tokens-mode natural``), unlike the shared
    fixture that pins exact lengths for token-counting tests."""
    return make_server(max_tokens_mode="natural")


@pytest.fixture
def sdk(srv: Any) -> Any:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def _instructor_messages(mode: str, text: str) -> list[dict[str, Any]]:
    """The messages instructor 1.17 sends for ``Mode.JSON`` / ``Mode.MD_JSON`` (captured from
    its requests): the model's JSON Schema in a system message; MD_JSON asks for a code block
    and sends no response_format."""
    schema = json.dumps(User.model_json_schema(), indent=2)
    system = ("\n            As a genius expert, your task is to understand the content and "
              "provide\n            the parsed objects in json that match the following "
              f"json_schema:\n\n\n            {schema}\n\n            Make sure to return "
              "an instance of the JSON, not the schema itself\n")
    if mode == "MD_JSON":
        text += "\n\nReturn the correct JSON response within a ```json codeblock. not the " \
                "JSON_SCHEMA"
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def _instructor_parse(content: str) -> User:
    """instructor's own extraction: the ```json block if any, else the text."""
    m = re.search(r"```(?:json)?\s*(.*?)```", content, re.S)
    return User.model_validate_json(m.group(1) if m else content)


@pytest.mark.parametrize("mode", ["JSON", "MD_JSON"])
def test_instructor_json_modes_parse_the_prompt_schema(sdk: Any, mode: str) -> None:
    for i in range(5):
        extra = {"response_format": {"type": "json_object"}} if mode == "JSON" else {}
        r = sdk.chat.completions.create(
            model="gpt-4o", messages=_instructor_messages(mode, f"Jason{i} is 25."), **extra)
        content = r.choices[0].message.content
        assert content.startswith("```json") == (mode == "MD_JSON")
        user = _instructor_parse(content)
        assert isinstance(user.age, int) and user.name


def test_langchain_json_mode_follows_the_keys_the_prompt_names(srv: Any) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=srv.url + "/v1", api_key="sk-test", model="gpt-4o",
                     max_retries=0)
    structured = llm.with_structured_output(Joke, method="json_mode")
    joke = structured.invoke("Tell me a joke about cats, respond in JSON with `setup` and "
                             "`punchline` keys")
    assert isinstance(joke, Joke) and joke.setup and joke.punchline
    # a JSON example object in the prompt: its keys and value types
    raw = llm.with_structured_output(None, method="json_mode").invoke(
        'Answer in JSON shaped like {"city": "Paris", "population": 2100000, "capital": true}')
    assert set(raw) == {"city", "population", "capital"}
    assert isinstance(raw["population"], int) and isinstance(raw["capital"], bool)


def _run_agent(srv: Any, api: str) -> Any:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"Sunny, 21 C in {city}"

    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0)
    model_cls = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="weather", instructions="Answer weather questions with the tool.",
                  tools=[get_weather], model=model_cls(model="gpt-4o", openai_client=client),
                  model_settings=ModelSettings(max_tokens=200))  # (natural answers fit)

    async def go() -> Any:
        try:
            return await Runner.run(agent, "What is the weather in Paris?")
        finally:
            await client.close()

    return asyncio.run(go()), calls


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_tool_loop_under_a_token_limit(srv: Any, api: str) -> None:
    result, calls = _run_agent(srv, api)
    assert len(calls) == 1  # the relevant tool, once; then the answer in text
    assert isinstance(result.final_output, str) and result.final_output
