"""Live counters and gauges. Bounded: label values that come from clients (model ids) are
capped at ``MAX_KEYS`` distinct values, the rest are counted under ``"other"``."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

__all__ = ["Stats"]

MAX_KEYS = 64


class Stats:
    """Counters for requests, streams, connections and tokens. Gauges never leak: every
    ``*_open`` has exactly one ``*_close`` (callers use try/finally or ``on_close``)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.reset()

    def reset(self) -> None:
        self.requests: Counter[tuple[str, str, str, int]] = Counter()  # endpoint,model,tr,status
        self.errors: Counter[str] = Counter()
        self.tokens_in = 0
        self.tokens_out = 0
        self.tokens_reasoning = 0
        self.connections_total = 0
        self.active_connections = getattr(self, "active_connections", 0)
        self.active_requests = getattr(self, "active_requests", 0)
        self.active_streams = getattr(self, "active_streams", 0)
        self.active_websockets = getattr(self, "active_websockets", 0)
        self._models: set[str] = set()

    # -- gauges ----------------------------------------------------------------------------
    def conn_open(self) -> None:
        self.active_connections += 1
        self.connections_total += 1

    def conn_close(self) -> None:
        self.active_connections -= 1

    def request_open(self) -> None:
        self.active_requests += 1

    def request_close(self) -> None:
        self.active_requests -= 1

    def stream_open(self) -> None:
        self.active_streams += 1

    def stream_close(self) -> None:
        self.active_streams -= 1

    # -- counters --------------------------------------------------------------------------
    def model_key(self, model: str | None) -> str:
        if not model:
            return ""
        if model in self._models:
            return model
        if len(self._models) < MAX_KEYS:
            self._models.add(model)
            return model
        return "other"

    def record(self, endpoint: str, model: str | None, transport: str, status: int,
               error: str | None = None) -> None:
        self.requests[(endpoint, self.model_key(model), transport, status)] += 1
        if error:
            self.errors[error] += 1

    def usage(self, tokens_in: int, tokens_out: int, reasoning: int = 0) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.tokens_reasoning += reasoning

    def snapshot(self) -> dict[str, Any]:
        by_status: Counter[str] = Counter()
        by_endpoint: Counter[str] = Counter()
        for (ep, _m, _t, st), n in self.requests.items():
            by_status[str(st)] += n
            by_endpoint[ep] += n
        return {
            "uptime_s": round(time.time() - self.started, 3),
            "active": {"connections": self.active_connections,
                       "requests": self.active_requests, "streams": self.active_streams,
                       "websockets": self.active_websockets},
            "connections_total": self.connections_total,
            "requests_total": sum(self.requests.values()),
            "requests_by_status": dict(by_status),
            "requests_by_endpoint": dict(by_endpoint),
            "tokens": {"input": self.tokens_in, "output": self.tokens_out,
                       "reasoning": self.tokens_reasoning},
            "errors": dict(self.errors),
        }
