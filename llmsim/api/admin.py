"""Observability endpoints: ``GET /llmsim/stats`` (JSON), ``POST /llmsim/stats/reset``,
``GET /metrics`` (Prometheus text 0.0.4, ``llmsim_*`` and vLLM-compatible ``vllm:*`` names)
``GET /llmsim/dashboard`` (a self-contained live HTML page polling ``/llmsim/stats``) and
``GET /llmsim/loop`` (the event loop's stalls, :mod:`llmsim.api.loopwatch`).

Multi-process servers plug in through ``app.stats_collect`` (an async ``f(app) -> raw
snapshot``, e.g. :func:`~llmsim.state.stats.merge` of every worker's
:meth:`~llmsim.state.stats.Stats.raw`) and ``app.stats_reset`` (an async ``f(app)``).
These monitoring endpoints are not counted in the request statistics they report.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from ..errors import E
from ..messages import JSONResponse, RawResponse, Request
from ..sim.script import MAX_SCRIPT_BYTES, ScriptError, parse_script
from ..state.prom import CONTENT_TYPE, prometheus_text
from ..state.stats import render
from . import loopwatch

if TYPE_CHECKING:
    from .services import Host

__all__ = ["register", "collect"]

async def collect(app: Host) -> dict[str, Any]:
    """The raw snapshot to report: every worker's when a collector is installed."""
    fn = app.stats_collect
    if fn is not None:
        return await fn(app)
    return app.stats.raw()


async def stats(req: Request, app: Host) -> JSONResponse:
    raw = await collect(app)
    if req.query_one("raw") in ("1", "true"):
        return JSONResponse(raw)
    out = render(raw)
    # this process's settings and store (the counters above add up every worker's)
    src = app.length_source
    out["length_source"] = app.config.max_tokens_mode if src != "natural" else \
        "natural" if app.config.output_tokens_mean is None else "lognormal"
    out["prompt_cache"]["store"] = app.prompt_cache.snapshot()
    return JSONResponse(out)


async def reset(req: Request, app: Host) -> JSONResponse:
    fn = app.stats_reset
    if fn is not None:
        await fn(app)
    else:
        app.stats.reset()
    return JSONResponse({"reset": True})


async def metrics(req: Request, app: Host) -> RawResponse:
    raw = await collect(app)
    return RawResponse(prometheus_text(raw).encode(), content_type=CONTENT_TYPE)


_PAGE: list[bytes] = []


def dashboard_html() -> bytes:
    """The dashboard page (package data ``llmsim/static/dashboard.html``), read once."""
    if not _PAGE:
        _PAGE.append(resources.files("llmsim").joinpath("static/dashboard.html").read_bytes())
    return _PAGE[0]


async def dashboard(req: Request, app: Host) -> RawResponse:
    return RawResponse(dashboard_html(), content_type="text/html; charset=utf-8",
                       headers=[("cache-control", "no-cache")])


async def scripts_get(req: Request, app: Host) -> JSONResponse:
    return JSONResponse(app.script.view())


async def scripts_put(req: Request, app: Host) -> JSONResponse:
    """Install a script (replacing the one running; cursors start over)."""
    if len(req.body) > MAX_SCRIPT_BYTES:
        raise E.script_too_large.at(limit=MAX_SCRIPT_BYTES)
    try:
        rules = parse_script(req.json())
    except ScriptError as exc:
        raise E.script_invalid.at(exc.where, reason=exc) from None
    app.script.install(rules)
    if app.script_cursors is not None:  # --state: the shared cursors start over too
        await app.script_cursors.restart(app.script)
    return JSONResponse(app.script.view())


async def scripts_delete(req: Request, app: Host) -> JSONResponse:
    app.script.install([])
    return JSONResponse({"object": "llmsim.script", "deleted": True})


def register(app: Host) -> None:
    r = app.router
    r.add("GET", "/llmsim/stats", stats, "llmsim.stats")
    loopwatch.register(app)  # GET /llmsim/loop
    r.add("POST", "/llmsim/stats/reset", reset, "llmsim.stats.reset")
    r.add("GET", "/metrics", metrics, "metrics")
    r.add("GET", "/llmsim/dashboard", dashboard, "llmsim.dashboard")
    r.add("GET", "/llmsim/scripts", scripts_get, "llmsim.scripts")
    r.add("POST", "/llmsim/scripts", scripts_put, "llmsim.scripts")
    r.add("DELETE", "/llmsim/scripts", scripts_delete, "llmsim.scripts")

