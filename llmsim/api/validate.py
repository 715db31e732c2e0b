"""Request-field validation shared by the API families, with the real API's error wording."""

from __future__ import annotations

import asyncio
import builtins
import re
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import APIError, E, quoted
from ..messages import Key

if TYPE_CHECKING:
    from ..messages import Request, StreamResponse
    from ..sim.decide import Usage
    from .services import Services

__all__ = ["V", "got", "BodyMemo"]

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "an array", dict: "an object"}
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# The API's integers are 64-bit (seed: -2^63 .. 2^63-1). A float such as 1e30 is an integer by
# value but not in range: without this bound it reached the response encoder (which writes at
# most 64-bit integers), failed after dispatch and left the connection hanging.
INT_MIN = -(1 << 63)
INT_MAX = (1 << 63) - 1


def got(v: Any) -> str:
    """The JSON type of `v` as the API's "but got ... instead" wording names it."""
    return "null" if v is None else _TYPE_NAMES.get(type(v), "an object")


def _bad_type(param: str, expected: str) -> APIError:
    return E.invalid_type.at(param, expected=expected)


class V:
    """Typed getters over a request body; each raises a 400 naming the parameter."""

    def __init__(self, body: builtins.dict[builtins.str, Any], prefix: builtins.str = "") -> None:
        self.body = body
        self.prefix = prefix

    def name(self, key: builtins.str) -> builtins.str:
        return f"{self.prefix}{key}"

    def required(self, key: builtins.str) -> Any:
        v = self.body.get(key)
        if v is None:
            raise E.missing.at(self.name(key))
        return v

    def bool(self, key: builtins.str, default: bool | None = None) -> bool | None:
        v = self.body.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise _bad_type(self.name(key), "a boolean")
        return v

    def int(self, key: builtins.str, default: builtins.int | None = None, *, lo: builtins.int | None = None,
            hi: builtins.int | None = None) -> builtins.int | None:
        """An integer in ``lo``..``hi`` (default: the 64-bit range, for every integer)."""
        v = self.body.get(key)
        if v is None:
            return default
        shown = v
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise _bad_type(self.name(key), "an integer")
        self._range(key, v, INT_MIN if lo is None else lo, INT_MAX if hi is None else hi,
                    "integer", shown)
        return v

    def num(self, key: builtins.str, default: float | None = None, *, lo: float | None = None,
            hi: float | None = None) -> float | None:
        v = self.body.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad_type(self.name(key), "a number")
        self._range(key, v, lo, hi, "decimal")
        return float(v)

    def _range(self, key: builtins.str, v: float, lo: float | None, hi: float | None,
               kind: builtins.str, shown: float | None = None) -> None:
        # The wording and code follow the parameter's declared type ("integer" for n,
        # "decimal" for temperature), not how the number happened to be spelled in the JSON;
        # the value is shown as sent (``shown``: 1e+30, not its 31-digit integer).
        if shown is None:
            shown = v
        integer = kind == "integer"
        if lo is not None and v < lo:
            below = E.integer_below_min if integer else E.decimal_below_min
            raise below.at(self.name(key), lo=lo, value=shown)
        if hi is not None and v > hi:
            above = E.integer_above_max if integer else E.decimal_above_max
            raise above.at(self.name(key), hi=hi, value=shown)

    def str(self, key: builtins.str, default: builtins.str | None = None, *,
            choices: tuple[str, ...] | None = None, max_len: builtins.int | None = None) -> builtins.str | None:
        v = self.body.get(key)
        if v is None:
            return default
        if not isinstance(v, str):
            raise _bad_type(self.name(key), "a string")
        if choices is not None and v not in choices:
            raise E.invalid_value.at(self.name(key), value=v, allowed=quoted(choices))
        if max_len is not None and len(v) > max_len:
            raise E.string_too_long.at(self.name(key), max_len=max_len, length=len(v))
        return v

    def list(self, key: builtins.str, default: list[Any] | None = None, *,
             max_len: builtins.int | None = None, min_len: builtins.int | None = None) -> list[Any] | None:
        v = self.body.get(key)
        if v is None:
            return default
        if not isinstance(v, list):
            raise _bad_type(self.name(key), "an array")
        if min_len is not None and len(v) < min_len:
            if not v:
                raise E.empty_array.at(self.name(key), min_len=min_len)
            raise E.array_too_short.at(self.name(key))
        if max_len is not None and len(v) > max_len:
            raise E.array_too_long.at(self.name(key), max_len=max_len, length=len(v))
        return v

    def dict(self, key: builtins.str, default: builtins.dict[builtins.str, Any] | None = None) -> builtins.dict[builtins.str, Any] | None:
        v = self.body.get(key)
        if v is None:
            return default
        if not isinstance(v, dict):
            raise _bad_type(self.name(key), "an object")
        return v

    def metadata(self, key: builtins.str = "metadata") -> builtins.dict[builtins.str, builtins.str] | None:
        """The real limits: at most 16 pairs, keys ≤ 64 chars, values strings ≤ 512 chars."""
        md = self.dict(key)
        if md is None:
            return None
        p = self.name(key)
        if len(md) > 16:
            raise E.too_many_properties.at(p, max=16, count=len(md))
        for k, v in md.items():
            if len(k) > 64:
                raise E.metadata_key_too_long.at(p, key=k[:70])
            if not isinstance(v, str):
                raise E.invalid_type.at(f"{p}.{k}", expected="a string")
            if len(v) > 512:
                raise E.string_too_long.at(f"{p}.{k}", max_len=512, length=len(v))
        return md


def unsupported(param: builtins.str, model: builtins.str, hint: builtins.str = "") -> APIError:
    return E.unsupported_parameter.at(param, hint=f" {hint}" if hint else "")


# Bound on the simulation work of one request: choices × tokens × (1 + top_logprobs). The whole
# answer is decided before the first byte, so without a bound one request (n=128,
# max_tokens=16384, top_logprobs=20) would hold the event loop for a minute and take gigabytes.
MAX_REQUEST_WORK = 1 << 19


def check_request_work(n: builtins.int, tokens: builtins.int, top_logprobs: builtins.int, *, param: builtins.str) -> None:
    """400 ``request_too_large`` when one request asks for more simulation than the bound."""
    work = n * tokens * (1 + top_logprobs)
    if work > MAX_REQUEST_WORK:
        raise E.request_work_too_large.at(
            param, n=n, tokens=tokens, bound=MAX_REQUEST_WORK,
            each=f" with {top_logprobs} top_logprobs each" if top_logprobs else "")


# A stepwise computation (token counting: :func:`llmsim.sim.tokens.count_tokens_steps` and the
# prompt counters built on it, whose steps yield the characters they tokenized) runs on the
# event loop in slices of about PACE_SLICE_S. Counting stops at what can fit the context
# window, but that can still be a lot of text (1M tokens for gpt-4.1; the tokenizer takes
# 20-800 ns a character depending on the text's shape), and a request must never hold other
# clients, /health included, for more than a slice (a step tokenizes at most CHUNK_CHARS
# characters: ~13 ms at the tokenizer's slowest). The clock is read only every PACE_CHARS
# characters, so a small prompt costs no clock reads at all.
PACE_SLICE_S = 0.005
PACE_CHARS = 4096

T = TypeVar("T")


async def paced(steps: Generator[int, None, T]) -> T:
    """Run ``steps`` to its result, giving the event loop a turn every ``PACE_SLICE_S``."""
    clock = time.perf_counter
    deadline = 0.0
    work = 0
    while True:
        try:
            work += next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if work >= PACE_CHARS:
            work = 0
            now = clock()
            if not deadline:
                deadline = now + PACE_SLICE_S
            elif now >= deadline:
                await asyncio.sleep(0)
                deadline = clock() + PACE_SLICE_S


class BodyMemo:
    """Validated request bodies by their exact bytes: a bounded memo of a handler's pure work.

    Validating a body (parse, field checks, prompt token count, the decision's view of it) is
    a function of the body's bytes and the app's config alone, and load generators send the
    same body again and again (``wrk``, a benchmark's fixed prompt, a retried request). A
    handler looks the bytes up first and, on a miss, stores what it derived once validation
    passed (a refused body is never stored: it is checked again each time). The values are
    shared by every request with those bytes, so they must be treated as read-only.

    Bounded: bodies over ``max_body`` bytes are not kept; the kept bodies total at most
    ``budget`` bytes in at most ``max_entries`` entries, the oldest dropped first. What is
    kept for a body is its parsed form: about 10× its bytes for ordinary messages, ~30× at
    worst (a body of tiny objects), so the memo holds a few MB at most. It empties itself
    when the app's config object changes (a test swapping ``app.config``)."""

    MAX_BODY = 16 * 1024
    BUDGET = 256 * 1024
    MAX_ENTRIES = 256

    __slots__ = ("_entries", "_bytes", "_config", "max_body", "budget", "max_entries")

    def __init__(self, max_body: builtins.int = MAX_BODY, budget: builtins.int = BUDGET,
                 max_entries: builtins.int = MAX_ENTRIES) -> None:
        self._entries: dict[bytes, Any] = {}
        self._bytes = 0
        self._config: Any = None
        self.max_body = max_body
        self.budget = budget
        self.max_entries = max_entries

    def __len__(self) -> builtins.int:
        return len(self._entries)

    @property
    def bytes(self) -> builtins.int:
        """The kept bodies' total size."""
        return self._bytes

    def get(self, body: builtins.bytes, config: Any) -> Any:
        """What was stored for ``body`` under ``config``, else None."""
        if config is not self._config:
            self.clear()
            self._config = config
            return None
        if len(body) > self.max_body:
            return None
        return self._entries.get(body)

    def put(self, body: builtins.bytes, config: Any, value: Any) -> None:
        size = len(body)
        if size > self.max_body or config is not self._config:
            return
        key = builtins.bytes(body)  # (a bytes subclass or a bytearray: a plain, hashable copy)
        entries = self._entries
        if key in entries:
            return
        while entries and (self._bytes + size > self.budget
                           or len(entries) >= self.max_entries):
            old = next(iter(entries))  # the oldest (dicts keep insertion order)
            del entries[old]
            self._bytes -= len(old)
        entries[key] = value
        self._bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


class EngineWait(Protocol):
    """The serving engines (``--engine``, api/serving.py) as a held answer waits for them,
    and as a stream with no client is paced by them (``pipeline.run_detached``)."""

    async def wait(self, model: str, usage: Usage, req: Request | None,
                   seconds: float = 0.0) -> bool: ...

    def pace(self, req: Request, res: StreamResponse) -> None: ...


# the engines in App.features (set by api/serving.py: --engine, or capacity on hosted models)
SERVING: Key[EngineWait] = Key("serving")


async def deliver_after(app: Services, model: str, seconds: float, usage: Usage | None = None,
                        req: Request | None = None) -> None:
    """Hold a non-streamed answer until its generation would have finished, counted as a
    running request of ``model`` meanwhile (``vllm:num_requests_running``): ``seconds``, or,
    when an engine serves ``model`` and the answer's ``usage`` is given, until the engine has
    generated it (a hosted model's engine given ``seconds`` as the answer's own time)."""
    serving = app.feature(SERVING)
    if serving is not None and usage is not None:
        key = app.stats.running_open(model)
        try:
            if await serving.wait(model, usage, req, seconds):
                return
        finally:
            app.stats.running_close(key)
    if seconds <= 0:
        return
    key = app.stats.running_open(model)
    try:
        await app.clock.sleep(seconds)
    finally:
        app.stats.running_close(key)


def stream_flags(v: V) -> tuple[bool, bool]:
    """``(stream, stream_options.include_usage)``; ``stream_options`` without ``stream`` is
    the real API's 400 (chat and legacy completions)."""
    stream = bool(v.bool("stream", False))
    so = v.dict("stream_options")
    if so is None:
        return stream, False
    if not stream:
        raise E.stream_options_without_stream.at("stream_options")
    return stream, bool(V(so, "stream_options.").bool("include_usage", False))
