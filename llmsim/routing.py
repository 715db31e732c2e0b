"""(method, path) → handler. Every API path is served under ``/v1/...`` and
``/openai/v1/...``; unknown paths are 404 and known paths with the wrong method 405, both in
the OpenAI error envelope."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from .errors import APIError, E

__all__ = ["Router", "Route", "WSMode", "WSFactory"]

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: str  # as registered, e.g. "/v1/responses/{id}"
    handler: Handler
    name: str  # endpoint name for stats, e.g. "chat.completions"
    stream_capable: bool = False
    # the family's error answer (None: the OpenAI envelope, llmsim.app.error_result)
    errors: Callable[[APIError], Any] | None = None
    # a path that always (True) or never (False) streams; None: the body's "stream" says
    streaming: bool | None = None
    stream_default: bool = False  # the body's "stream" when absent (Ollama streams by default)


class WSMode:
    """What a WebSocket path means (subclassed by each mode; one instance per connection)."""

    conn: Any  # the transport's WebSocket connection (llmsim.transport.ws.WSConnection)

    def attach(self, conn: Any) -> None:
        """Called once, right after the 101."""
        self.conn = conn

    def message(self, text: str) -> None:
        """One complete text message from the client."""
        raise NotImplementedError

    def error_event(self, err: APIError, **extra: Any) -> dict[str, Any]:
        """``err`` as this mode's error event."""
        raise NotImplementedError

    def resume(self) -> None:
        """The client drained our writes: resume paused streams."""

    def stop(self, reason: str) -> None:
        """The connection is closing or gone: end every running and queued piece of work
        with ``reason`` and release what it holds (called again if work started since)."""

    def gone(self) -> None:
        """The connection is gone (after :meth:`stop`): drop per-connection state."""

    @property
    def busy(self) -> bool:
        """Stop reading client messages (the mode's queue is full)."""
        return False

    @property
    def idle(self) -> bool:
        """Nothing runs or waits (a graceful shutdown may close now)."""
        return True


# makes the mode of one new connection from the app and the upgrade request
WSFactory = Callable[[Any, Any], WSMode]


class Router:
    """A small router: a dict for static paths, compiled regexes for parameterised ones."""

    def __init__(self) -> None:
        self._static: dict[str, dict[str, Route]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, Route]]] = []
        # WebSocket modes by path (no trailing slash): resolved like routes by the transport
        self.ws_modes: dict[str, WSFactory] = {}

    def add_ws(self, paths: tuple[str, ...], factory: WSFactory) -> None:
        """Serve the WebSocket mode ``factory`` makes (one per connection) at ``paths``."""
        for p in paths:
            self.ws_modes[p.rstrip("/") if len(p) > 1 else p] = factory

    def add(self, method: str, pattern: str, handler: Handler, name: str,
            *, aliases: bool = True, stream_capable: bool = False,
            errors: Callable[[APIError], Any] | None = None,
            streaming: bool | None = None, stream_default: bool = False) -> None:
        """Register ``pattern``; ``/v1/...`` patterns also get ``/openai/v1/...``."""
        route = Route(method.upper(), pattern, handler, name, stream_capable, errors, streaming,
                      stream_default)
        paths = [pattern]
        if aliases and pattern.startswith("/v1/"):
            paths.append("/openai" + pattern)
        for p in paths:
            if "{" not in p:
                self._static.setdefault(p, {})[route.method] = route
                continue
            # "{name}" matches one segment, "{name:path}" the rest (model ids like "org/model")
            rx = re.compile("^" + re.sub(r"\{(\w+):path\}", r"(?P<\1>.+)",
                                         re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", p)) + "$")
            for existing, methods in self._dynamic:
                if existing.pattern == rx.pattern:
                    methods[route.method] = route
                    break
            else:
                self._dynamic.append((rx, {route.method: route}))

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route and path parameters, or an APIError (404/405)."""
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        methods = self._static.get(path)
        params: dict[str, str] = {}
        if methods is None:
            # the first pattern that matches with this method (another family may share the
            # prefix: GET /v1/models/{id} and Gemini's POST /v1/models/{model}:generateContent);
            # else the first that matches at all (its 405)
            for rx, ms in self._dynamic:
                m = rx.match(path)
                if m:
                    if methods is None or method in ms and method not in methods:
                        methods, params = ms, m.groupdict()
                    if method in methods:
                        break
            # the SDKs percent-encode path parameters ("org/m x" → "org%2Fm%20x"); match on
            # the raw path (an encoded "/" stays in its segment), then decode
            for k, val in params.items():
                if "%" in val:
                    params[k] = unquote(val)
        if methods is None:
            raise E.invalid_url.at(method=method, path=path)
        route = methods.get(method)
        if route is None and method == "HEAD":
            route = methods.get("GET")
        if route is None:
            allow = ", ".join(sorted(methods))
            raise E.method_not_allowed.at(method=method, path=path, allow=allow,
                                          headers=[("allow", allow)])
        return route, params

    def routes(self) -> list[Route]:
        seen: dict[int, Route] = {}
        for ms in self._static.values():
            for r in ms.values():
                seen[id(r)] = r
        for _, ms in self._dynamic:
            for r in ms.values():
                seen[id(r)] = r
        return list(seen.values())
