"""The llmsim pytest plugin (entry point ``pytest11: llmsim``): an ``llmsim`` fixture.

``llmsim`` (session-scoped) is an in-process llmsim server on a free loopback port, instant
and seeded by default, with the request journal on. While it is active the SDKs' environment
points at it (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, ``LLMSIM_URL``, and test keys in
``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``), so client code under test needs no wiring.
Before each test that uses it, the server forgets the previous test's script, fault rules,
journal and client verdicts. Helpers: :meth:`LLMSim.script`, :meth:`LLMSim.fault`,
:meth:`LLMSim.journal`, :meth:`LLMSim.verdict`, :meth:`LLMSim.reset`.

Settings (any llmsim configuration key, dotted for sections: ``faults.p_429``):

- the ini option ``llmsim_settings`` (lines of ``key = value``) for the whole session;
- ``@pytest.mark.llmsim(latency="realistic", **{"faults.p_429": 0.1})`` for one test (the
  server is restarted with them, on a new port, and the environment follows).

This module imports pytest; llmsim itself never imports this module (pytest loads it).
"""

from __future__ import annotations

import json
import os
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from ..config import Config, load_config
from ..transport.server import ServerThread

__all__ = ["LLMSim", "ClientVerdict", "DEFAULTS"]

DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1", "port": 0, "latency": "instant", "seed": 0, "quiet": True,
    "journal": 1000,
    # SDKs sleep retry-after before retrying an injected 429/503: keep a test's retries short
    "faults.retry_after_ms": 50,
}
"""The fixture's settings before ``llmsim_settings`` and the marker."""

TEST_KEY = "sk-llmsim-test"
ENV_KEYS = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "LLMSIM_URL", "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("llmsim_settings", "llmsim settings for the llmsim fixture, one "
                  "'key = value' a line (config keys, dotted for sections: faults.p_429)",
                  type="linelist", default=[])
    parser.addini("llmsim_env", "set OPENAI_BASE_URL, ANTHROPIC_BASE_URL, LLMSIM_URL and test "
                  "API keys while the llmsim fixture is active (default true)", type="bool",
                  default=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "llmsim(settings=None, **settings): llmsim settings for this test's server "
        "(config keys, dotted for sections; the server restarts with them)")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in ("models",) and not key.endswith(".models"):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _ini_settings(lines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq:
            raise pytest.UsageError(f"llmsim_settings: expected 'key = value', got {line!r}")
        out[key.strip()] = value.strip().strip("\"'")
    return out


def make_config(settings: Mapping[str, Any]) -> Config:
    """The fixture's Config: :data:`DEFAULTS` < ``settings`` (dotted keys). Environment
    variables do not apply (the fixture sets some itself)."""
    merged = {**DEFAULTS, **_flatten(settings)}
    try:
        return load_config(env={}, overrides=merged)
    except ValueError as exc:
        raise pytest.UsageError(f"llmsim settings: {exc}") from None


@dataclass(frozen=True)
class ClientVerdict:
    """How one API key's client behaved against failed answers (``GET /llmsim/clients/KEY``).
    The judgements are None when there was nothing to judge (e.g. no retry-after sent)."""

    api_key: str
    requests: int
    failures: int
    retries: int
    retry_after_sent: int
    retry_after_honoured: int
    retry_after_early: int
    honoured_retry_after: bool | None
    non_retryable_retries: int
    retried_non_retryable: bool
    backoff_grew: bool | None
    gaps_ms: list[float]
    streams_interrupted: int
    streams_resumed: int
    streams_abandoned: int
    unretried_failures: int

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ClientVerdict:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


class LLMSim:
    """The handle the ``llmsim`` fixture gives a test."""

    def __init__(self, settings: Mapping[str, Any], set_env: bool = True) -> None:
        self.settings = dict(settings)
        self.set_env = set_env
        self.api_key = TEST_KEY
        self._thread: ServerThread | None = None
        self._active: dict[str, Any] = {}
        self._saved_env: dict[str, str | None] = {}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, extra: Mapping[str, Any] | None = None) -> None:
        wanted = {**self.settings, **_flatten(extra or {})}
        if self._thread is not None and wanted == self._active:
            return
        cfg = make_config(wanted)
        self.stop_server()
        self._thread = ServerThread(cfg).start()
        self._active = wanted
        if self.set_env:
            self._export()

    def stop_server(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def close(self) -> None:
        self.stop_server()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env.clear()

    def _export(self) -> None:
        for k in ENV_KEYS:
            self._saved_env.setdefault(k, os.environ.get(k))
        os.environ.update(self.env())

    def env(self) -> dict[str, str]:
        """The variables the fixture sets: what a subprocess under test needs too."""
        return {"OPENAI_BASE_URL": self.base_url, "ANTHROPIC_BASE_URL": self.url,
                "LLMSIM_URL": self.url, "OPENAI_API_KEY": self.api_key,
                "ANTHROPIC_API_KEY": self.api_key}

    # -- where ----------------------------------------------------------------------------
    @property
    def server(self) -> ServerThread:
        assert self._thread is not None, "the llmsim server is not running"
        return self._thread

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return self.server.url

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's ``base_url`` (``.../v1``)."""
        return self.url + "/v1"

    @property
    def config(self) -> Config:
        return self.server.config

    # -- admin calls (the server's own HTTP API) --------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise AssertionError(f"llmsim {method} {path}: {exc.code} {detail}") from None

    def script(self, script: Mapping[str, Any] | list[Any] | str | os.PathLike[str]) -> Any:
        """Install a script of replies (a dict, a list of rules, or a JSON/TOML file path);
        replaces the one running, cursors start over."""
        if isinstance(script, (str, os.PathLike)):
            p = Path(script)
            text = p.read_bytes()
            script = tomllib.loads(text.decode()) if p.suffix == ".toml" else json.loads(text)
        if isinstance(script, list):
            script = {"rules": script}
        return self._call("POST", "/llmsim/scripts", script)

    def fault(self, fault: str, **rule: Any) -> dict[str, Any]:
        """Add a fault rule (``fault("429", count=2)``, ``fault("disconnect-after:3",
        model="gpt-4o")``): the fields of ``POST /llmsim/faults``."""
        return self._call("POST", "/llmsim/faults", {"fault": fault, **rule})  # type: ignore[no-any-return]

    def journal(self, path: str | None = None) -> list[dict[str, Any]]:
        """What the clients sent since the last reset, oldest first: ``method``, ``path``,
        ``headers`` (credentials removed), ``body`` (parsed JSON), ``status``, ``stream``,
        ``end`` (how a stream ended). ``path``: only requests to it."""
        rows: list[dict[str, Any]] = self._call("GET", "/llmsim/journal")["data"]
        if path is not None:
            rows = [r for r in rows if r["path"].removeprefix("/openai") == path]
        return rows

    def verdict(self, key: str | None = None) -> ClientVerdict:
        """How the client using ``key`` (default: the fixture's test key) behaved."""
        k = urllib.parse.quote(key or self.api_key, safe="")
        return ClientVerdict.of(self._call("GET", f"/llmsim/clients/{k}"))

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/llmsim/stats")  # type: ignore[no-any-return]

    def reset(self) -> None:
        """Forget the script, the fault rules, the journal and the verdicts."""
        for path in ("/llmsim/scripts", "/llmsim/faults", "/llmsim/journal",
                     "/llmsim/clients"):
            self._call("DELETE", path)


@pytest.fixture(scope="session")
def llmsim(pytestconfig: pytest.Config) -> Iterator[LLMSim]:
    """An in-process llmsim server for the session (see :mod:`llmsim.ops.pytest_plugin`)."""
    sim = LLMSim(_ini_settings(pytestconfig.getini("llmsim_settings")),
                 bool(pytestconfig.getini("llmsim_env")))
    sim.start()
    try:
        yield sim
    finally:
        sim.close()


def _marker_settings(item: pytest.Item) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in reversed(list(item.iter_markers("llmsim"))):  # the closest marker wins
        for a in m.args:
            if not isinstance(a, Mapping):
                raise pytest.UsageError("@pytest.mark.llmsim takes a dict of settings and/or "
                                        "keyword settings")
            out.update(_flatten(a))
        out.update(_flatten(m.kwargs))
    return out


@pytest.fixture(autouse=True)
def _llmsim_per_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test that uses ``llmsim`` gets its marker's settings and a clean server."""
    if "llmsim" not in request.fixturenames:
        yield
        return
    sim = request.getfixturevalue("llmsim")
    if not isinstance(sim, LLMSim):  # the project defines an `llmsim` fixture of its own
        yield
        return
    sim.start(_marker_settings(request.node))
    sim.reset()
    yield
