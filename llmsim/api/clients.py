"""What the clients did: the request journal and the client verdict.

**Journal** (``--journal N``, off by default): the last N API requests (method, path, headers
without credentials, body, answer status, how a stream ended) at ``GET /llmsim/journal``,
held under a byte budget (``--journal-max-bytes``; bodies over :data:`JOURNAL_BODY_BYTES`
are cut). ``DELETE /llmsim/journal`` empties it.

**Verdict** (always on): per API key, how the client behaved after a failed answer (an error
status, a dropped connection, a stream cut short): whether it retried the same request (same
method, path and body bytes), how long it waited against the ``retry-after`` it was sent,
whether it retried an error the SDKs document as final (a 4xx other than 408, 409, 429),
whether its waits grew between attempts, streams it abandoned and streams it re-requested
after they broke (sending it again, or resuming a stored response's events with
``starting_after``). ``GET /llmsim/clients`` lists every key's verdict, ``GET
/llmsim/clients/{key}`` one, ``DELETE /llmsim/clients`` forgets them.

Cost when nothing fails: the accounting calls look at one empty dict and return. The work
(a body hash, a table entry) is per failed answer and per later request of a key that has one
outstanding, within :data:`MAX_KEYS` keys and :data:`MAX_PENDING` failures a key.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import E
from ..messages import JSONResponse, Key, Request
from ..state.accounting import WATCH
from .faults import FAULTS, _mask, is_api_path

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["Journal", "ClientWatch", "register", "CREDENTIAL_HEADERS"]

JOURNAL_BODY_BYTES = 64 * 1024  # a journalled body longer than this is cut (body_truncated)
MAX_KEYS = 1024  # API keys with a verdict (the least recently seen is forgotten)
MAX_PENDING = 64  # failed requests per key awaiting a retry (the oldest is forgotten)
MAX_GAPS = 32  # retry gaps kept per key (the verdict's gaps_ms)
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "cookie",
                                "proxy-authorization", "x-llmsim-admin-key"})
# the SDKs (openai, anthropic) retry these statuses and dropped connections, nothing else
RETRYABLE = frozenset({408, 409, 429})
HONOUR_SLACK = 0.95  # a wait of 95 % of retry-after counts as honouring it (clock rounding)
GROWTH_SLACK = 0.9  # a wait at least 90 % of the previous one counts as not shrinking
ANON = "-"  # the verdict key of requests without an API key


def _retryable(status: int) -> bool:
    return status == 0 or status >= 500 or status in RETRYABLE or status == 499


def _retry_after(headers: list[tuple[str, str]]) -> float | None:
    """Seconds the answer asked the client to wait (``retry-after-ms`` first, as the SDKs)."""
    secs = None
    for k, v in headers:
        lk = k.lower()
        try:
            if lk == "retry-after-ms":
                return float(v) / 1000.0
            if lk == "retry-after":
                secs = float(v)
        except ValueError:
            continue
    return secs


def _identity(req: Request) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{req.method} {req.path.removeprefix('/openai')}\n".encode())
    h.update(req.body)
    return h.digest()


# ------------------------------------------------------------------------------------------
# Journal
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Entry:
    seq: int
    received_at: float
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    body_bytes: int
    key: str
    status: int
    stream: bool
    end: str | None = None
    size: int = 0

    def public(self, mask: bool) -> dict[str, Any]:
        try:
            body: Any = orjson.loads(self.body) if len(self.body) == self.body_bytes else \
                self.body.decode("utf-8", "replace")
        except orjson.JSONDecodeError:
            body = self.body.decode("utf-8", "replace")
        d: dict[str, Any] = {
            "seq": self.seq, "received_at": self.received_at, "method": self.method,
            "path": self.path, "headers": dict(self.headers),
            "api_key": _mask(self.key) if mask and self.key != ANON else self.key,
            "body": body, "body_bytes": self.body_bytes,
            "body_truncated": len(self.body) < self.body_bytes, "status": self.status,
            "stream": self.stream}
        if self.stream:
            d["end"] = self.end
        return d


class Journal:
    """The last ``entries`` API requests within ``max_bytes`` (oldest dropped first)."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self.items: deque[Entry] = deque()
        self.bytes = 0
        self.seq = 0
        self.dropped = 0
        self._open: dict[str, Entry] = {}  # streams not ended yet, by request id

    def add(self, req: Request, key: str, status: int, stream: bool) -> None:
        body = req.body[:JOURNAL_BODY_BYTES]
        headers = [(k, v) for k, v in req.headers.items() if k not in CREDENTIAL_HEADERS]
        size = len(body) + sum(len(k) + len(v) for k, v in headers) + len(req.path) + 128
        self.seq += 1
        e = Entry(self.seq, req.received_at, req.method, req.path, headers, body,
                  len(req.body), key, status, stream, size=size)
        self.items.append(e)
        self.bytes += size
        while self.items and (len(self.items) > self.entries or self.bytes > self.max_bytes):
            old = self.items.popleft()
            self.bytes -= old.size
            self.dropped += 1
        if stream and self.items and self.items[-1] is e:  # (not dropped at once: too big)
            self._open[req.request_id] = e

    def ended(self, req: Request, reason: str) -> None:
        e = self._open.pop(req.request_id, None)
        if e is not None:
            e.end = reason

    def clear(self) -> None:
        self.items.clear()
        self._open.clear()
        self.bytes = 0


# ------------------------------------------------------------------------------------------
# Verdict
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Pending:
    """A failed answer waiting to see whether its client retries it."""

    at: float  # when the failure was answered (or the stream broke)
    status: int  # 0: connection dropped; 499: the client left first
    retry_after: float | None
    stream: bool  # a stream that broke after it started
    attempt: int = 1  # how many times this request has failed in a row
    last_gap: float | None = None  # the wait before this attempt


@dataclass
class Verdict:
    """One key's record. Counts, and the judgements drawn from them (None: no evidence)."""

    requests: int = 0
    failures: int = 0  # answers that failed (error status, dropped, stream cut, client left)
    retries: int = 0  # requests that repeated a failed one
    retry_after_sent: int = 0  # failures that carried retry-after
    retry_after_honoured: int = 0  # retries that waited at least retry-after
    retry_after_early: int = 0  # retries that came sooner
    non_retryable_retries: int = 0  # retries of a 4xx the SDKs treat as final
    backoff_grew: int = 0  # retry waits at least as long as the previous one
    backoff_shrank: int = 0  # retry waits shorter than the previous one
    streams_interrupted: int = 0  # streams the server broke (fault, error)
    streams_resumed: int = 0  # interrupted streams the client requested again
    streams_abandoned: int = 0  # streams the client left before their end
    gaps_ms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_GAPS))
    pending: OrderedDict[bytes, Pending] = field(default_factory=OrderedDict)

    def public(self) -> dict[str, Any]:
        honoured = None
        if self.retry_after_early:
            honoured = False
        elif self.retry_after_honoured:
            honoured = True
        grew = None
        if self.backoff_shrank:
            grew = False
        elif self.backoff_grew:
            grew = True
        return {
            "object": "llmsim.client_verdict", "requests": self.requests,
            "failures": self.failures, "retries": self.retries,
            "retry_after_sent": self.retry_after_sent,
            "retry_after_honoured": self.retry_after_honoured,
            "retry_after_early": self.retry_after_early,
            "honoured_retry_after": honoured,
            "non_retryable_retries": self.non_retryable_retries,
            "retried_non_retryable": self.non_retryable_retries > 0,
            "backoff_grew": grew, "gaps_ms": [round(g, 3) for g in self.gaps_ms],
            "streams_interrupted": self.streams_interrupted,
            "streams_resumed": self.streams_resumed,
            "streams_abandoned": self.streams_abandoned,
            "unretried_failures": len(self.pending)}


class ClientWatch:
    """The verdicts by API key, and the journal when enabled; fed by ``state.accounting``."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self.keys: OrderedDict[str, Verdict] = OrderedDict()
        self.watched = 0  # keys with a pending failure: 0 → the hot path returns at once
        c = app.config
        self.journal = Journal(c.journal, c.journal_max_bytes) if c.journal else None
        self.chains: dict[str, Pending] = {}  # retried streams in flight, by request id

    def _verdict(self, key: str) -> Verdict:
        v = self.keys.get(key)
        if v is None:
            v = self.keys[key] = Verdict()
            if len(self.keys) > MAX_KEYS:
                _, old = self.keys.popitem(last=False)
                if old.pending:
                    self.watched -= 1
        else:
            self.keys.move_to_end(key)
        return v

    # -- fed by accounting ------------------------------------------------------------------
    def answered(self, req: Request, status: int, headers: list[tuple[str, str]],
                 stream: bool = False) -> None:
        """An answer's head went out (``status`` 0: the connection was dropped instead)."""
        if self.journal is not None and is_api_path(req.path):
            self.journal.add(req, req.api_key or ANON, status, stream)
        if not self.watched and 200 <= status < 400:
            return
        if not is_api_path(req.path):
            return
        key = req.api_key or ANON
        v = self._verdict(key)
        v.requests += 1
        if v.pending and req.method == "GET" and "starting_after" in req.query \
                and 200 <= status < 400 and self._resumed(v):
            return  # a stored response's events picked up where the broken stream left off
        ident = _identity(req)
        chain = self._retry(v, ident, req.received_at) if v.pending else None
        if 200 <= status < 400:
            if stream and chain is not None:
                self.chains[req.request_id] = chain
                if len(self.chains) > MAX_KEYS * MAX_PENDING:
                    self.chains.pop(next(iter(self.chains)))
            return
        self._failed(v, ident, Pending(self.app.clock.now(), status, _retry_after(headers),
                                       False), chain)

    def stream_ended(self, req: Request, reason: str) -> None:
        if self.journal is not None:
            self.journal.ended(req, reason)
        if reason == "completed":
            if self.chains:
                self.chains.pop(req.request_id, None)
            return
        if not is_api_path(req.path):
            return
        v = self._verdict(req.api_key or ANON)
        chain = self.chains.pop(req.request_id, None)
        if reason == "cancelled":  # the client closed it
            v.streams_abandoned += 1
            return
        v.streams_interrupted += 1
        self._failed(v, _identity(req), Pending(self.app.clock.now(), 0, None, True), chain)

    def gone(self, req: Request) -> None:
        """The client left before any answer (its own timeout, or it gave up)."""
        if self.journal is not None and is_api_path(req.path):
            self.journal.add(req, req.api_key or ANON, 499, False)
        if not is_api_path(req.path):
            return
        v = self._verdict(req.api_key or ANON)
        v.requests += 1
        ident = _identity(req)
        chain = self._retry(v, ident, req.received_at) if v.pending else None
        self._failed(v, ident, Pending(self.app.clock.now(), 499, None, False), chain)

    # -- the judgement ------------------------------------------------------------------------
    def _retry(self, v: Verdict, ident: bytes, at: float) -> Pending | None:
        p = v.pending.pop(ident, None)
        if p is None:
            return None
        if not v.pending:
            self.watched -= 1
        gap = max(0.0, at - p.at)
        v.retries += 1
        v.gaps_ms.append(gap * 1000.0)
        if not _retryable(p.status):
            v.non_retryable_retries += 1
        if p.retry_after is not None:
            if gap >= p.retry_after * HONOUR_SLACK:
                v.retry_after_honoured += 1
            else:
                v.retry_after_early += 1
        if p.last_gap is not None:
            if gap >= p.last_gap * GROWTH_SLACK:
                v.backoff_grew += 1
            else:
                v.backoff_shrank += 1
        if p.stream:
            v.streams_resumed += 1
        p.last_gap = gap
        return p

    def _resumed(self, v: Verdict) -> bool:
        """``GET /v1/responses/{id}?stream=true&starting_after=N`` after a broken stream:
        the newest broken stream of the key counts as resumed (no longer pending)."""
        for ident in reversed(v.pending):
            if v.pending[ident].stream:
                del v.pending[ident]
                if not v.pending:
                    self.watched -= 1
                v.streams_resumed += 1
                return True
        return False

    def _failed(self, v: Verdict, ident: bytes, p: Pending, chain: Pending | None) -> None:
        v.failures += 1
        if p.retry_after is not None:
            v.retry_after_sent += 1
        if chain is not None:
            p.attempt = chain.attempt + 1
            p.last_gap = chain.last_gap
        if not v.pending:
            self.watched += 1
        v.pending[ident] = p
        v.pending.move_to_end(ident)
        if len(v.pending) > MAX_PENDING:
            v.pending.popitem(last=False)

    def clear(self) -> None:
        self.keys.clear()
        self.chains.clear()
        self.watched = 0
        if self.journal is not None:
            self.journal.clear()


# ------------------------------------------------------------------------------------------
# Routes
# ------------------------------------------------------------------------------------------

def _mask_keys(app: Services) -> bool:
    faults = app.feature(FAULTS)
    return faults is not None and faults.mask_keys


def _watch(app: Services) -> ClientWatch:
    w = app.feature(CLIENTS)
    assert w is not None
    return w


async def clients_list(req: Request, app: Services) -> JSONResponse:
    mask = _mask_keys(app)
    data = [{"api_key": _mask(k) if mask and k != ANON else k, **v.public()}
            for k, v in _watch(app).keys.items()]
    return JSONResponse({"object": "list", "data": data})


async def clients_one(req: Request, app: Services) -> JSONResponse:
    key = req.params["key"]
    v = _watch(app).keys.get(key)
    if v is None:
        v = Verdict()  # never seen failing: an empty record, not a 404 a test must catch
    return JSONResponse({"api_key": _mask(key) if _mask_keys(app) else key, **v.public()})


async def clients_delete(req: Request, app: Services) -> JSONResponse:
    _watch(app).clear()
    return JSONResponse({"object": "llmsim.clients", "deleted": True})


async def journal_get(req: Request, app: Services) -> JSONResponse:
    j = _watch(app).journal
    if j is None:
        raise E.journal_off.at()
    since = req.query_one("since")
    try:
        after = int(since) if since is not None else 0
    except ValueError:
        raise E.journal_since_invalid.at("since") from None
    mask = _mask_keys(app)
    return JSONResponse({"object": "list", "dropped": j.dropped, "bytes": j.bytes,
                         "data": [e.public(mask) for e in j.items if e.seq > after]})


async def journal_delete(req: Request, app: Services) -> JSONResponse:
    j = _watch(app).journal
    if j is not None:
        j.clear()
    return JSONResponse({"object": "llmsim.journal", "deleted": True})


def register(app: Host) -> None:
    app.set_feature(CLIENTS, ClientWatch(app))
    r = app.router
    r.add("GET", "/llmsim/clients", clients_list, "llmsim.clients")
    r.add("DELETE", "/llmsim/clients", clients_delete, "llmsim.clients")
    r.add("GET", "/llmsim/clients/{key:path}", clients_one, "llmsim.clients")
    r.add("GET", "/llmsim/journal", journal_get, "llmsim.journal")
    r.add("DELETE", "/llmsim/journal", journal_delete, "llmsim.journal")


# the watch in App.features: the key accounting reads (every answer is told to it)
CLIENTS: Key[ClientWatch] = WATCH  # type: ignore[assignment]
