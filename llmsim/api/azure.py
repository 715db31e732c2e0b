"""Azure OpenAI's data-plane paths, as the ``openai`` SDK's ``AzureOpenAI`` client calls them:

- ``POST /openai/deployments/{deployment}/chat/completions``, ``/completions``,
  ``/embeddings``;
- ``/openai/responses`` (``POST``; ``GET``/``DELETE`` ``/{id}``, ``/{id}/cancel``,
  ``/{id}/input_items``).

Each is the OpenAI handler of the same ``/v1`` path (looked up at request time, so record and
replay apply too), after three Azure steps: ``api-version`` is required (missing: Azure's
404 ``Resource not found``; not a version: 400 ``API version not supported``); the deployment
names the model (``azure_deployments`` NAME=MODEL, else the deployment's own name), written
into the body as ``model`` so the answer echoes the model as Azure does; and the answer gets
Azure's content-filter annotations (``prompt_filter_results``, per choice
``content_filter_results``; a stream starts with the prompt-filter chunk whose ``choices`` is
empty, as Azure's does). Keys: ``api-key`` or an Entra ID bearer token (any well-formed JWT:
its signature is not checked). The generic hooks see the deployment as the model (Azure's
limits are per deployment). Errors on these paths use Azure's shapes for 401, 404
(``DeploymentNotFound``) and 429, OpenAI's envelope otherwise (as Azure's validation errors).

The OpenAI v1 API (``/openai/v1/...``, no ``api-version``) is the ``/v1`` routes' alias.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..messages import JSONResponse, RawResponse, Request, Result, StreamResponse, error_result

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "azure_error", "is_entra_token"]

_VERSION = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(-preview)?$")
FIRST_VERSION = "2022-12-01"  # the first GA data-plane version
_SAFE = {"filtered": False, "severity": "safe"}
PROMPT_FILTER = {"hate": _SAFE, "jailbreak": {"filtered": False, "detected": False},
                 "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}
CONTENT_FILTER = {"hate": _SAFE, "protected_material_code": {"filtered": False,
                                                             "detected": False},
                  "protected_material_text": {"filtered": False, "detected": False},
                  "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}
_DENIED = ("Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
           "provide a valid key for an active subscription and use a correct regional API "
           "endpoint for your resource.")
_NO_DEPLOYMENT = ("The API deployment for this resource does not exist. If you created the "
                  "deployment within the last 5 minutes, please wait a moment and try again.")


def azure_error(err: APIError) -> RawResponse:
    """Azure's error bodies: its own shapes for 401, a missing deployment, 429 and the
    ``api-version`` errors; OpenAI's envelope for the rest (as Azure answers validation)."""
    if err.code == "model_not_found":
        body: Any = {"error": {"code": "DeploymentNotFound", "message": _NO_DEPLOYMENT}}
        status = 404
    elif err.status == 401:
        body, status = {"error": {"code": "401", "message": _DENIED}}, 401
    elif err.status == 429:
        wait = next((v for k, v in err.headers or () if k.lower() == "retry-after"), "1")
        body = {"error": {"code": "429", "message": "Requests to the Azure OpenAI API have "
                          "exceeded the rate limit of your current pricing tier. Please retry "
                          f"after {wait} seconds. ({err.message})"}}
        status = 429
    elif err.code == "api_version_missing":
        body, status = {"error": {"code": "404", "message": "Resource not found"}}, 404
    elif err.code == "api_version_unsupported":
        body = {"error": {"code": "BadRequest", "message": "API version not supported"}}
        status = 400
    else:
        return error_result(err)
    return RawResponse(orjson.dumps(body), status, "application/json",
                       list(err.headers or ()), error=err)


def is_entra_token(req: Request, key: str) -> bool:
    """An Entra ID bearer token on an Azure path: a JWT's shape (its signature, tenant and
    audience are not checked)."""
    return req.path.startswith("/openai/") and key.startswith("eyJ") and key.count(".") == 2 \
        and req.headers.get("authorization", "")[:7].lower() == "bearer "


def check_version(req: Request) -> None:
    v = req.query_one("api-version")
    if v is None:
        raise E.azure_api_version_missing.at("api-version")
    m = _VERSION.match(v)
    if m is None or v[:10] < FIRST_VERSION or not 1 <= int(m[2]) <= 12 \
            or not 1 <= int(m[3]) <= 31:
        raise E.azure_api_version_unsupported.at("api-version")


def deployment_model(app: Services, deployment: str) -> str:
    for d in app.config.azure_deployments:
        name, _, model = d.partition("=")
        if name == deployment:
            return model
    return deployment


def _set_model(req: Request, model: str) -> None:
    """The body as the OpenAI handler reads it: ``model`` is the deployment's model (new
    bytes, so the handlers' memo of validated bodies keys on the model too)."""
    body = req.json_object()
    if body.get("model") == model:
        return
    body = {**body, "model": model}
    object.__setattr__(req, "body", orjson.dumps(body))
    req.notes.parsed = body


def _annotate(res: Result, choices: bool) -> Result:
    """Azure's content-filter fields, in one place for every generating path."""
    if type(res) is JSONResponse and isinstance(res.data, dict) and choices:
        data = res.data
        data["prompt_filter_results"] = [{"prompt_index": 0,
                                          "content_filter_results": PROMPT_FILTER}]
        for c in data.get("choices") or ():
            if isinstance(c, dict):
                c["content_filter_results"] = CONTENT_FILTER
    elif type(res) is StreamResponse and choices:
        s = res.stream
        head = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                "prompt_filter_results": [{"prompt_index": 0,
                                           "content_filter_results": PROMPT_FILTER}]}
        # the prompt-filter chunk first, due at once (the plan's own delays are relative)
        s._it = itertools.chain([(0.0, "chunk", head)], s._it)
    return res


def _forward(target: str, annotate: bool) -> Any:
    async def handler(req: Request, app: Host) -> Result:
        check_version(req)
        deployment = req.params.get("model")
        if deployment is None and req.method == "POST":  # /openai/responses: the body's
            body_model = req.json_object().get("model")
            deployment = body_model if isinstance(body_model, str) and body_model else None
        if deployment is not None:
            _set_model(req, deployment_model(app, deployment))
        route, params = app.router.resolve(req.method, target)
        object.__setattr__(req, "params", params)
        res = await route.handler(req, app)
        # (a recorded or replayed answer is the upstream's own, annotations included)
        return res if route.name == "cassette" else _annotate(res, annotate)
    return handler


def register(app: Host) -> None:
    r = app.router
    base = "/openai/deployments/{model}"
    for path, name, choices in (("/chat/completions", "chat.completions", True),
                                ("/completions", "completions", True),
                                ("/embeddings", "embeddings", False)):
        r.add("POST", base + path, _forward("/v1" + path, choices), name, aliases=False,
              stream_capable=choices, errors=azure_error)
    r.add("POST", "/openai/responses", _forward("/v1/responses", False), "responses",
          aliases=False, stream_capable=True, errors=azure_error)
    for method, suffix in (("GET", ""), ("DELETE", ""), ("POST", "/cancel"),
                           ("GET", "/input_items")):
        r.add(method, "/openai/responses/{rid}" + suffix,
              _forward_id("/v1/responses/", suffix), "responses", aliases=False,
              errors=azure_error)


def _forward_id(prefix: str, suffix: str) -> Any:
    async def handler(req: Request, app: Host) -> Result:
        check_version(req)
        route, params = app.router.resolve(req.method, prefix + req.params["rid"] + suffix)
        object.__setattr__(req, "params", params)
        return await route.handler(req, app)
    return handler
