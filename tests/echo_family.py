"""A test-only API family on the request pipeline (issue 30's proof that a family is one
module): ``POST /echo/v1/say`` with ``{"model", "text", "stream", "max_tokens"}`` answers
``{"id", "model", "text", "tokens", "finish"}``, or streams NDJSON lines ``{"token": ...}``
then ``{"done": true, "finish": ...}``. It touches no other file: registering it is one line,
``echo_family.register(app)``."""

from __future__ import annotations

from typing import Any

import orjson

from llmsim.api.pipeline import Family, Meta, Parsed, Plan
from llmsim.api.pipeline import register as serve
from llmsim.api.validate import V
from llmsim.app import App
from llmsim.errors import APIError, E, missing
from llmsim.messages import Request
from llmsim.sim import tokens as tok
from llmsim.sim.decide import Ask, Decision
from llmsim.streaming.dialect import Dialect


def _line(etype: str, data: Any) -> bytes:
    return orjson.dumps(data) + b"\n"


def _error_line(err: APIError, seq: int) -> bytes:
    return orjson.dumps({"error": err.message}) + b"\n"


ECHO = Dialect("echo.say", numbered=False, sse=_line, sse_error=_error_line,
               error_events=lambda err: [("error", {"error": err.message})],
               token_types=frozenset({"token"}), terminals=frozenset({"done"}),
               stream_headers=b"content-type: application/x-ndjson\r\ncache-control: no-cache\r\n")


class Echo(Family):
    endpoint = "echo.say"
    seed_path = "/echo/v1/say"
    dialect = ECHO
    id_prefix = "echo_"

    async def parse(self, req: Request, app: App) -> Parsed:
        body = req.json_object()
        v = V(body)
        profile = app.model(body.get("model"))
        text = v.str("text", None)
        if text is None:
            raise missing("text")
        limit = v.int("max_tokens", None, lo=1, hi=4096)
        prompt = tok.count_tokens(text, profile.encoding)
        ask = Ask(profile, prompt, user_text=lambda: text, limit=limit)
        if limit is None and len(text) > 100_000:
            raise E.invalid_value.at("text", value="(long)", allowed="at most 100000 chars")
        return Parsed(ask, body["model"], bool(v.bool("stream", False)), body)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        c = d.choices[0]
        return {"id": meta.id, "model": p.model, "text": c.text, "tokens": c.tokens,
                "finish": c.finish}

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        c = d.choices[0]
        pieces = c.pieces or []
        gaps = d.timing.gaps(max(0, len(pieces) - 1))
        delay = d.timing.first
        for i, piece in enumerate(pieces):
            yield (delay if i == 0 else next(gaps, 0.0)), "token", {"token": piece}
        yield 0.0 if pieces else delay, "done", {"done": True, "finish": c.finish,
                                                 "tokens": c.tokens}


def register(app: App) -> None:
    serve(app, Echo(), [("POST", "/echo/v1/say")])
