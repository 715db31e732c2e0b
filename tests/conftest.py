"""Shared fixtures: servers on port 0 (in-loop and in a thread) and strict SDK clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmsim import Config, ServerThread


def cfg(**kw: Any) -> Config:
    # max_tokens_mode "exact": most tests count tokens against the limit they set (the
    # product default "natural" reads the length from what is asked: test_realism.py)
    base: dict[str, Any] = {"port": 0, "latency": "instant", "seed": 1234, "quiet": True,
                            "max_tokens_mode": "exact"}
    base.update(kw)
    return Config(**base)


@pytest.fixture
def make_server() -> Iterator[Any]:
    """Factory: ``make_server(**config_fields)`` → a started ServerThread (stopped after)."""
    started: list[ServerThread] = []

    def factory(**kw: Any) -> ServerThread:
        st = ServerThread(cfg(**kw)).start()
        started.append(st)
        return st

    yield factory
    for st in started:
        st.stop()


@pytest.fixture
def srv(make_server: Any) -> ServerThread:
    return make_server()


@pytest.fixture
def client(srv: ServerThread) -> Any:
    from openai import OpenAI

    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                _strict_response_validation=True) as c:
        yield c


@pytest.fixture
async def aclient(srv: ServerThread) -> Any:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                           _strict_response_validation=True) as c:
        yield c


# a real redis-server for the --state redis:// tests (fixtures: redis_server, redis_url, own_redis)
from tests.redis_fixture import own_redis, redis_server, redis_url  # noqa: E402,F401
