"""``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import APIError
from ..messages import JSONResponse, Request

if TYPE_CHECKING:
    from ..app import App


async def health(req: Request, app: App) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def list_models(req: Request, app: App) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [m.public() for m in app.registry.listed()]})


async def get_model(req: Request, app: App) -> JSONResponse:
    mid = req.params["id"]
    prof = app.registry.get(mid)
    if prof is None:
        raise APIError(404, f"The model '{mid}' does not exist", param="model",
                       code="model_not_found")
    return JSONResponse(prof.public())


def register(app: App) -> None:
    r = app.router
    r.add("GET", "/health", health, "health")
    r.add("GET", "/v1/models", list_models, "models")
    r.add("GET", "/v1/models/{id:path}", get_model, "models")
