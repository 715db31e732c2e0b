"""API errors and the OpenAI error envelope, decided in one place."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["APIError", "invalid", "missing", "not_found_model", "envelope", "server_error",
           "SERVER_ERROR_MESSAGE"]

_STATUS_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
    529: "server_error",
}


class APIError(Exception):
    """An error returned to the client as ``{"error": {message, type, param, code}}``.

    Before the first byte of a response it becomes a status line plus this envelope; after
    the first byte the transport turns it into the stream's error event instead.
    """

    __slots__ = ("status", "message", "type", "param", "code", "headers", "overloaded")

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: list[tuple[str, str]] | None = None,
                 overloaded: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _STATUS_TYPE.get(status, "invalid_request_error" if status < 500
                                             else "server_error")
        self.param = param
        self.code = code
        self.headers = headers or []
        # the engine refused for capacity (not rendered by OpenAI; Anthropic answers 529)
        self.overloaded = overloaded

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param,
                "code": self.code}

    def body(self) -> bytes:
        return envelope(self.message, self.type, self.param, self.code)

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, code={self.code!r})"


def envelope(message: str, type: str, param: str | None, code: str | None) -> bytes:
    """The OpenAI error body."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param,
                                   "code": code}})


def invalid(param: str | None, message: str, code: str | None = "invalid_value",
            status: int = 400) -> APIError:
    """A 400 invalid_request_error naming ``param``."""
    return APIError(status, message, type="invalid_request_error", param=param, code=code)


def missing(param: str) -> APIError:
    """The real API's wording for a missing required parameter."""
    return APIError(400, f"Missing required parameter: '{param}'.", param=param,
                    code="missing_required_parameter")


def not_found_model(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist or you do not have access to it.",
                    type="invalid_request_error", param="model", code="model_not_found")


SERVER_ERROR_MESSAGE = ("The server had an error while processing your request. Sorry about "
                        "that!")
"""The real API's wording of a 5xx on its side (written once: every 500-ish answer uses it)."""


def server_error(status: int = 500, code: str | None = "server_error",
                 headers: list[tuple[str, str]] | None = None) -> APIError:
    """The real API's 500 for a failure on the server's side (a bug, never the client's
    input): the answer to any exception between dispatch and the last byte; with another
    ``status``/``code``/``headers``, the same wording for an injected 5xx."""
    return APIError(status, SERVER_ERROR_MESSAGE, type="server_error", code=code,
                    headers=headers)
