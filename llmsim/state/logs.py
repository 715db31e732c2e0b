"""Logging set-up and the access log (one line per request, plain or JSON).

The access log is the ``llmsim.access`` logger at level INFO. Transports check
``ACCESS.isEnabledFor(INFO)`` (a cached level check) before building a line, so with the
default ``--log-level warning`` the hot path pays one attribute lookup and one call per
request, and never formats anything.

Fields the client chose (method, path, model) are escaped in plain lines (:func:`escape`): a
control character, quote, backslash or space is written as a backslash escape, so a model
named ``"x\n127.0.0.1 \"GET /admin\" 200"`` cannot forge a second line or a field. JSON
lines are escaped by the encoder.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import orjson

__all__ = ["ACCESS", "INFO", "access", "escape", "setup_logging", "JSONFormatter"]

ACCESS = logging.getLogger("llmsim.access")
INFO = logging.INFO
_MARK = "_llmsim_handler"


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` and, for access lines,
    the request's fields (``method``, ``path``, ``model``, ``status``, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                               "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields is not None:
            out.update(fields)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def setup_logging(level: str = "warning", fmt: str = "plain",
                  stream: IO[str] | None = None) -> logging.Handler:
    """Send the ``llmsim`` loggers to ``stream`` (stderr) at ``level``, plain or JSON.
    Idempotent: a previous handler installed by this function is replaced."""
    logger = logging.getLogger("llmsim")
    for h in list(logger.handlers):
        if getattr(h, _MARK, False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _MARK, True)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler


_ESCAPES = {"\\": "\\\\", '"': '\\"', " ": "\\x20", "\n": "\\n", "\r": "\\r",
            "\t": "\\t"}


def escape(value: str) -> str:
    """``value`` for one space-separated field of a plain log line: printable characters
    as they are (non-ASCII letters too), everything else backslash-escaped (repr style)."""
    if value.isprintable() and " " not in value and '"' not in value and "\\" not in value:
        return value  # the common case: nothing to do
    out = []
    for ch in value:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch.isprintable():
            out.append(ch)
        else:
            n = ord(ch)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000
                       else f"\\U{n:08x}")
    return "".join(out)


def access(method: str, path: str, model: str | None, status: int, tokens_in: int,
           tokens_out: int, ttft: float | None, duration: float, transport: str,
           request_id: str, client: str, end: str | None = None) -> None:
    """Emit one access line (call only after ``ACCESS.isEnabledFor(INFO)``). Times in s;
    ``end`` is how a stream ended (completed, stopped, disconnect, cancelled, error,
    write_stall)."""
    fields = {"method": method, "path": path, "model": model, "status": status,
              "tokens_in": tokens_in, "tokens_out": tokens_out,
              "ttft_ms": None if ttft is None else round(ttft * 1000, 3),
              "duration_ms": round(duration * 1000, 3), "transport": transport,
              "request_id": request_id, "client": client}
    if end is not None:
        fields["end"] = end
    ttft_txt = "-" if ttft is None else f"{ttft * 1000:.1f}ms"
    ACCESS.info('%s "%s %s" %d model=%s tokens=%d/%d ttft=%s duration=%.1fms %s%s %s',
                client or "-", escape(method), escape(path), status,
                escape(model) if model else "-", tokens_in, tokens_out,
                ttft_txt, duration * 1000, transport, "" if end is None else f" end={end}",
                request_id, extra={"fields": fields})

