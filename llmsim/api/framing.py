"""The recorder's framers for the streams that are not SSE: they cut an upstream's body into
the frames a cassette stores one by one (each with its time), incrementally, and check each
frame before it is passed on (docs/record-replay.md):

- :class:`NDJSONFramer`: Ollama's NDJSON, one JSON line a frame;
- :class:`ArrayFramer`: Gemini's ``streamGenerateContent`` without ``alt=sse``, one JSON
  array whose elements arrive as the answer grows: a frame is the text up to the end of one
  element (``[{...}``, then ``,\\r\\n{...}``), and the closing ``]``;
- :class:`EventStreamFramer`: the AWS event stream (``application/vnd.amazon.eventstream``,
  Bedrock's ``ConverseStream`` and ``InvokeModelWithResponseStream``): each message's
  prelude (total and headers lengths, their CRC32), headers, payload and message CRC32;
  :func:`decode_message` gives its string headers and payload.

A frame that breaks its format is a :class:`FrameError` naming what is wrong; nothing after
it is framed. Each framer holds at most the bytes of one unfinished frame.
"""

from __future__ import annotations

import re
import struct
import zlib

import orjson

__all__ = ["FrameError", "NDJSONFramer", "ArrayFramer", "EventStreamFramer", "decode_message",
           "ndjson_line", "array_piece", "MAX_EVENT_HEADERS"]

MAX_EVENT_HEADERS = 64  # headers of one event-stream message (Bedrock's have three or four)
_WS = b" \t\r\n"


class FrameError(ValueError):
    """A frame that breaks its stream's format."""


def _compact(buf: bytearray, start: int) -> int:
    """Drop what was framed when it is most of the buffer (each byte moved at most once
    more); the new start."""
    if start > 65536 and start * 2 > len(buf):
        del buf[:start]
        return 0
    return start


# ------------------------------------------------------------------------------------------
# NDJSON
# ------------------------------------------------------------------------------------------

def ndjson_line(raw: bytes) -> str:
    """``raw`` as a cassette frame: UTF-8 text with exactly one non-blank line, a JSON
    value."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise FrameError("an NDJSON line that is not UTF-8") from None
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if len(lines) != 1:
        raise FrameError(f"{len(lines)} JSON lines in one NDJSON frame (one is expected)")
    try:
        orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        raise FrameError("an NDJSON line that is not JSON") from None
    return text


class NDJSONFramer:
    """Lines cut at ``\\n``; blank lines go with the next line."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0  # where the frame being collected begins
        self._scan = 0  # where the line being read begins (each byte looked at once)

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out = []
        while True:
            i = buf.find(b"\n", self._scan)
            if i < 0:
                break
            blank = not buf[self._scan:i].strip(_WS)
            self._scan = i + 1
            if not blank:
                out.append(bytes(buf[self._start:i + 1]))
                self._start = i + 1
        start = _compact(buf, self._start)
        self._scan -= self._start - start
        self._start = start
        return out

    def flush(self) -> list[bytes]:
        """The last line when it did not end in ``\\n``."""
        rest = bytes(self._buf[self._start:])
        self._buf = bytearray()
        self._start = self._scan = 0
        return [rest] if rest.strip(_WS) else []


# ------------------------------------------------------------------------------------------
# The JSON array
# ------------------------------------------------------------------------------------------

_OUTSIDE = re.compile(rb'[\[\]{}",]')
_INSIDE = re.compile(rb'["\\]')


def array_piece(raw: bytes) -> str:
    """``raw`` as a cassette frame: ``[`` or ``,`` and one element (a JSON value), or the
    closing ``]`` (``[]``: an empty array)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise FrameError("a JSON array element that is not UTF-8") from None
    t = text.strip()
    if t in ("]", "[]"):
        return text
    if not t or t[0] not in "[,":
        raise FrameError("a JSON array frame that starts with neither '[' nor ','")
    try:
        orjson.loads(t[1:])
    except orjson.JSONDecodeError:
        raise FrameError("a JSON array element that is not JSON") from None
    return text


class ArrayFramer:
    """One top-level JSON array cut after each element and at its ``]``; the scan jumps
    between the bytes that matter (brackets, quotes, commas) with a regular expression."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0  # where the frame being collected begins
        self._scan = 0
        self._mark = 0  # after the last bracket, comma or element at the top level
        self._depth = 0
        self._string = False
        self._escape = False
        self.opened = False
        self.closed = False

    def _cut(self, end: int, out: list[bytes]) -> None:
        out.append(bytes(self._buf[self._start:end]))
        self._start = self._mark = end

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        if self.closed:
            if data.strip(_WS):
                raise FrameError("bytes after the end of the JSON array")
            return []
        buf += data
        out: list[bytes] = []
        i = self._scan
        n = len(buf)
        while i < n:
            if self._escape:
                self._escape = False
                i += 1
                continue
            if self._string:
                m = _INSIDE.search(buf, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                if buf[i] == 0x5C:  # backslash
                    self._escape = True
                else:
                    self._string = False
                    if self._depth == 1:  # a string element ended
                        self._cut(i + 1, out)
                i += 1
                continue
            if not self.opened:
                lead = buf[i:].lstrip(_WS)
                if not lead:
                    i = n
                    break
                if lead[:1] != b"[":
                    raise FrameError("a stream that is not a JSON array")
                i = self._mark = n - len(lead) + 1
                self.opened = True
                self._depth = 1
                continue
            m = _OUTSIDE.search(buf, i)
            if m is None:
                i = n
                break
            i = m.start()
            c = buf[i]
            if c == 0x22:  # a quote
                self._string = True
            elif c in b"[{":
                self._depth += 1
            elif c in b"]}":
                if self._depth == 1 and c == 0x5D:
                    self._scalar(i, out)
                    self._depth = 0
                    self.closed = True
                    self._cut(i + 1, out)
                    if buf[i + 1:].strip(_WS):
                        raise FrameError("bytes after the end of the JSON array")
                    i = n
                    break
                if self._depth == 1:
                    raise FrameError("a '}' that closes no object in the JSON array")
                self._depth -= 1
                if self._depth == 1:  # an object or array element ended
                    self._cut(i + 1, out)
            elif self._depth == 1:  # a comma between elements
                self._scalar(i, out)
                self._mark = i + 1
            i += 1
        self._scan = i
        start = _compact(buf, self._start)
        shift = self._start - start
        self._scan -= shift
        self._mark -= shift
        self._start = start
        return out

    def _scalar(self, i: int, out: list[bytes]) -> None:
        """A number or literal element ends at the comma or bracket after it (the bytes
        since the last mark: each looked at once)."""
        if self._buf[self._mark:i].strip(_WS):
            self._cut(i, out)

    def flush(self) -> list[bytes]:
        if not self.closed:
            raise FrameError("the stream ended inside its JSON array" if self.opened
                             else "an empty stream (a JSON array was expected)")
        return []


# ------------------------------------------------------------------------------------------
# The AWS event stream
# ------------------------------------------------------------------------------------------

def decode_message(msg: bytes) -> tuple[dict[str, str], bytes]:
    """One whole event-stream message (its CRCs already checked by the framer, or checked
    here): its headers (strings only: type 7) and payload."""
    total, hlen = struct.unpack_from(">II", msg)
    if total != len(msg) or hlen > total - 16:
        raise FrameError("an event-stream message whose lengths do not add up")
    if struct.unpack_from(">I", msg, 8)[0] != zlib.crc32(msg[:8]):
        raise FrameError("an event-stream message whose prelude CRC does not match")
    if struct.unpack_from(">I", msg, total - 4)[0] != zlib.crc32(msg[:total - 4]):
        raise FrameError("an event-stream message whose CRC does not match")
    headers: dict[str, str] = {}
    i, end = 12, 12 + hlen
    try:
        while i < end:
            nlen = msg[i]
            name = msg[i + 1:i + 1 + nlen].decode()
            i += 1 + nlen
            kind = msg[i]
            if kind != 7:
                raise FrameError(f"an event-stream header {name[:64]!r} of type {kind} (only "
                                 "string headers are recorded)")
            vlen = struct.unpack_from(">H", msg, i + 1)[0]
            value = msg[i + 3:i + 3 + vlen].decode()
            i += 3 + vlen
            if i > end or not name or name in headers or len(headers) >= MAX_EVENT_HEADERS:
                raise FrameError("an event-stream message with malformed headers")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        raise FrameError("an event-stream message with malformed headers") from None
    return headers, msg[end:total - 4]


class EventStreamFramer:
    """Whole messages, each checked (lengths, both CRCs) as soon as its bytes are in; a
    prelude is checked before its message is waited for, so a broken length is refused
    at once, and a message longer than ``max_bytes`` is never buffered."""

    def __init__(self, max_bytes: int) -> None:
        self._buf = bytearray()
        self._start = 0
        self.max_bytes = max_bytes

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out = []
        while len(buf) - self._start >= 12:
            s = self._start
            total, hlen = struct.unpack_from(">II", buf, s)
            if struct.unpack_from(">I", buf, s + 8)[0] != zlib.crc32(buf[s:s + 8]):
                raise FrameError("an event-stream message whose prelude CRC does not match")
            if total < 16 or hlen > total - 16 or total > self.max_bytes:
                raise FrameError(f"an event-stream message of {total} bytes with "
                                 f"{hlen} bytes of headers")
            if len(buf) - s < total:
                break
            msg = bytes(buf[s:s + total])
            decode_message(msg)
            out.append(msg)
            self._start = s + total
        self._start = _compact(buf, self._start)
        return out

    def flush(self) -> list[bytes]:
        if len(self._buf) > self._start:
            raise FrameError(f"the stream ended inside an event-stream message "
                             f"({len(self._buf) - self._start} bytes)")
        return []
