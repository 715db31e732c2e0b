"""--state: only a Redis URL is accepted; unset keeps the embedded stores."""

from __future__ import annotations

import pytest

from llmsim.app import App
from llmsim.config import Config, ConfigError
from llmsim.state.redisconn import unavailable


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379", "memory"])
def test_state_must_be_a_redis_url(url: str) -> None:
    with pytest.raises(ConfigError, match="state"):
        Config(state=url)


def test_state_unset_is_embedded() -> None:
    assert App(Config()).shared_state is None


def test_state_redis_url_is_lazy() -> None:
    # no connection is made until a request needs shared state
    app = App(Config(state="redis://127.0.0.1:1/0"))
    assert app.shared_state is not None
    assert app.shared_state.key("resp", "x") == "llmsim:resp:x"


def test_unavailable_is_a_503_naming_shared_state() -> None:
    e = unavailable("ConnectionError")
    assert e.status == 503 and e.code == "shared_state_unavailable"
    assert "Shared state" in e.message and ("retry-after", "1") in e.headers
