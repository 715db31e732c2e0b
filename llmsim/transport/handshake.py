"""The WebSocket opening handshake as pure functions (RFC 6455 §4.2.1): no socket, no app.

:func:`check_handshake` takes what the upgrade request says (method, path, HTTP version,
headers) and returns the ``Sec-WebSocket-Accept`` value, or raises the :class:`APIError` the
client gets as a plain HTTP answer before any switch (400 bad handshake, 426 wrong version,
400 ``websocket_not_supported`` on a path without a WebSocket mode). :func:`check_capacity`
decides the connection cap (429). ``llmsim.transport.ws.upgrade`` calls both (and the API-key
check between them, so an unauthenticated client is told 401 rather than 429).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Collection, Mapping

from ..errors import E

__all__ = ["check_handshake", "check_capacity", "accept_key", "ws_path"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _has_token(value: str, token: str) -> bool:
    """Whether the comma-separated header ``value`` lists ``token`` (lower-case)."""
    if value.lower() == token:  # (what clients send: the one token alone)
        return True
    return any(t.strip().lower() == token for t in value.split(","))


def ws_path(path: str) -> str:
    """``path`` without a trailing slash (as the registered WebSocket paths are)."""
    return path.rstrip("/") if len(path) > 1 else path


def accept_key(key: str) -> bytes:
    """The ``Sec-WebSocket-Accept`` value for a ``Sec-WebSocket-Key``."""
    # (base64.b64encode without its wrapper)
    return binascii.b2a_base64(hashlib.sha1(key.encode("ascii") + _GUID).digest(),
                               newline=False)


def check_handshake(method: str, path: str, headers: Mapping[str, str],
                    paths: Collection[str], http_version: bytes = b"1.1") -> bytes:
    """Validate an upgrade request; the ``Sec-WebSocket-Accept`` value, or an APIError
    (answered as an HTTP error in the OpenAI envelope). ``headers`` have lower-case names.
    A path not in ``paths`` (those with a WebSocket mode) is ``websocket_not_supported``;
    whether such a path exists at all (404) is the router's business, asked by the caller
    first."""
    path = ws_path(path)
    if path not in paths:
        raise E.websocket_wrong_endpoint.at(method=method, path=path)
    if method != "GET":
        raise E.websocket_not_get.at(method=method)
    if http_version != b"1.1":
        raise E.websocket_not_http11.at()
    if not _has_token(headers.get("connection", ""), "upgrade"):
        raise E.websocket_no_connection_upgrade.at()
    if headers.get("sec-websocket-version", "").strip() != "13":
        raise E.websocket_version.at(headers=[("sec-websocket-version", "13")])
    key = headers.get("sec-websocket-key", "").strip()
    try:
        ok = len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        ok = False
    if not ok:
        raise E.websocket_bad_key.at()
    return accept_key(key)


def check_capacity(open_connections: int, max_connections: int) -> None:
    """Refuse one more connection beyond ``max_connections`` (0 = no limit) with a 429."""
    if max_connections and open_connections >= max_connections:
        raise E.too_many_websockets.at(limit=max_connections,
                                       headers=[("retry-after", "1")])
