"""Responses over WebSocket: wires :mod:`llmsim.websocket` into the app.

``app.ws_handler`` receives every request that carries ``Upgrade: websocket``; the session
turns each ``response.create`` into a ``POST /v1/responses`` request dispatched like HTTP.
A plain (non-upgrade) ``GET /v1/responses`` is answered 426 with a hint, unless another module
registered that route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import APIError, E
from ..messages import Request, Result

if TYPE_CHECKING:
    from ..app import App

__all__ = ["register", "upgrade_required"]


async def upgrade_required(req: Request, app: App) -> Result:
    """``GET /v1/responses`` without ``Upgrade: websocket``."""
    raise E.websocket_upgrade_required.at(
        headers=[("upgrade", "websocket"), ("sec-websocket-version", "13")])


def register(app: App) -> None:
    from .. import websocket

    websocket.state(app)
    app.ws_handler = websocket.upgrade
    try:
        route, _ = app.router.resolve("GET", "/v1/responses")
        taken = route.method == "GET"
    except APIError:
        taken = False
    if not taken:
        app.router.add("GET", "/v1/responses", upgrade_required, "responses.websocket")
