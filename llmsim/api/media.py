"""What the media endpoints (images, audio, moderations) share: form-field coercion, the
model's work time, scripted turns, upload checks and the store behind image URLs.

The media models are profiles of the registry (:mod:`llmsim.sim.models`) of kind ``image``,
``speech``, ``transcription`` or ``moderation``; ``gen_s`` is their work time (see each
endpoint). Every route is an ordinary API route: auth, rate limits, faults, capacity, stats
and metrics apply as to any, and a non-streamed answer is held for its work time counted as
running (:func:`~llmsim.api.validate.deliver_after`).
"""

from __future__ import annotations

import math
import random
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..errors import E
from ..messages import RawResponse, Request
from ..multipart import Upload
from ..sim.decide import Ask
from ..sim.models import ModelProfile
from ..sim.rng import new_id
from ..sim.script import Turn

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["form_ints", "form_floats", "work_seconds", "script_turn", "upload", "FileStore",
           "files_of", "MAX_STORE_BYTES", "STORE_TTL_S"]

MAX_STORE_BYTES = 256 * 1024 * 1024
STORE_TTL_S = 3600.0  # the real API's image URLs expire after an hour
MAX_STORE_FILES = 4096


def form_ints(body: dict[str, Any], *keys: str) -> None:
    """Multipart fields arrive as text: turn ``keys`` that hold a decimal integer into int
    (anything else is left for the validator, which names the parameter)."""
    for k in keys:
        v = body.get(k)
        if isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v) < 20:
            body[k] = int(v)


def form_floats(body: dict[str, Any], *keys: str) -> None:
    for k in keys:
        v = body.get(k)
        if isinstance(v, str) and len(v) < 32:
            try:
                f = float(v)
            except ValueError:
                continue
            if math.isfinite(f):
                body[k] = f


def work_seconds(app: Services, profile: ModelProfile, seconds: float, rng: random.Random) -> float:
    """``seconds`` of ``profile``'s work, jittered like its TTFT (log-normal); 0 under
    ``--latency instant``."""
    if app.config.latency == "instant" or seconds <= 0:
        return 0.0
    return seconds * math.exp(rng.gauss(0.0, profile.ttft_jitter))


async def script_turn(app: Services, req: Request, endpoint: str, profile: ModelProfile,
                      text: str) -> Turn | None:
    """The scripted turn matching ``text`` on ``endpoint`` (errors and status faults raised,
    a mid-stream fault left for the stream hook), or None."""
    if not app.script.rules:
        return None
    return await app.script_turn(req, endpoint, Ask(profile, 0, user_text=lambda: text))


def upload(value: Any, param: str) -> Upload:
    """A file part, or a 400 naming ``param``."""
    if value is None:
        raise E.missing.at(param)
    if not isinstance(value, Upload):
        raise E.invalid_type.at(param, expected="a file")
    return value


class FileStore:
    """Generated files served at ``GET /llmsim/files/{name}`` (the ``url`` answers): at most
    :data:`MAX_STORE_BYTES` and :data:`MAX_STORE_FILES`, oldest dropped first, each for
    :data:`STORE_TTL_S` on the app's clock."""

    def __init__(self, budget: int = MAX_STORE_BYTES, ttl: float = STORE_TTL_S) -> None:
        self.budget = budget
        self.ttl = ttl
        self.bytes = 0
        self._files: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._files)

    def put(self, now: float, ext: str, content_type: str, data: bytes) -> str:
        self._expire(now)
        files = self._files
        while files and (self.bytes + len(data) > self.budget or len(files) >= MAX_STORE_FILES):
            _, (_, _, old) = files.popitem(last=False)
            self.bytes -= len(old)
        name = f"{new_id('file-')}.{ext}"
        if len(data) <= self.budget:
            files[name] = (now + self.ttl, content_type, data)
            self.bytes += len(data)
        return name

    def get(self, now: float, name: str) -> tuple[str, bytes] | None:
        self._expire(now)
        hit = self._files.get(name)
        return None if hit is None else (hit[1], hit[2])

    def _expire(self, now: float) -> None:
        files = self._files
        while files:
            name, (until, _, data) = next(iter(files.items()))
            if until > now:
                return
            del files[name]
            self.bytes -= len(data)


_STORES: weakref.WeakKeyDictionary[Any, FileStore] = weakref.WeakKeyDictionary()


def files_of(app: Services) -> FileStore:
    store = _STORES.get(app)
    if store is None:
        store = _STORES[app] = FileStore()
    return store


def file_url(req: Request, name: str) -> str:
    host = req.headers.get("host", "127.0.0.1")[:256]
    return f"http://{host}/llmsim/files/{name}"


async def get_file(req: Request, app: Services) -> RawResponse:
    hit = files_of(app).get(app.clock.time(), req.params.get("name", ""))
    if hit is None:
        raise E.file_not_found.at(name=req.params.get("name", ""))
    return RawResponse(hit[1], content_type=hit[0],
                       headers=[("cache-control", "private, max-age=3600")])


def register(app: Host) -> None:
    app.router.add("GET", "/llmsim/files/{name}", get_file, "files", aliases=False)
