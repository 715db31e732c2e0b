"""A bounded ``multipart/form-data`` parser (the upload endpoints: image edits and variations,
audio transcriptions and translations).

:func:`parse_form` turns a body into a dict: text parts as ``str``, file parts as
:class:`Upload`; a name sent more than once, or ending in ``[]`` (the SDKs' array form,
``image[]``, ``timestamp_granularities[]``), becomes a list under the name without ``[]``.
Bounded: at most :data:`MAX_PARTS` parts, :data:`MAX_PART_HEADERS` header bytes a part and
:data:`MAX_TEXT_FIELD` bytes a text part; the body itself is bounded by the server's
``--max-body-bytes``. The work is linear in the body (one ``find`` per boundary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import E

__all__ = ["Upload", "parse_form", "is_multipart", "MAX_PARTS", "MAX_PART_HEADERS",
           "MAX_TEXT_FIELD"]

MAX_PARTS = 64
MAX_PART_HEADERS = 8 * 1024
MAX_TEXT_FIELD = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Upload:
    """One uploaded file: its part's filename and content type, and its bytes."""

    filename: str
    content_type: str
    data: bytes

    def __len__(self) -> int:
        return len(self.data)


def is_multipart(content_type: str) -> bool:
    return content_type[:19].lower() == "multipart/form-data"


def _boundary(content_type: str) -> bytes:
    for item in content_type.split(";")[1:]:
        k, _, v = item.strip().partition("=")
        if k.lower() == "boundary":
            v = v.strip().strip('"')
            if 0 < len(v) <= 200:
                return v.encode("latin-1", "replace")
    raise E.multipart_invalid.at(reason="no boundary in the Content-Type header")


def _disposition(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in value.split(";")[1:]:
        k, _, v = item.strip().partition("=")
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] == '"':
            v = v[1:-1].replace('\\"', '"')
        out[k.lower()] = v
    return out


def parse_form(body: bytes, content_type: str) -> dict[str, Any]:
    """The form's fields (see the module doc), or a 400 ``multipart_invalid`` naming what
    is wrong."""
    delim = b"--" + _boundary(content_type)
    start = body.find(delim)
    if start < 0:
        raise E.multipart_invalid.at(reason="the boundary never occurs in the body")
    form: dict[str, Any] = {}
    pos = start + len(delim)
    parts = 0
    while True:
        if body[pos:pos + 2] == b"--":
            return form  # the closing delimiter
        if body[pos:pos + 2] != b"\r\n":
            raise E.multipart_invalid.at(reason="a boundary line does not end in CRLF")
        pos += 2
        parts += 1
        if parts > MAX_PARTS:
            raise E.multipart_too_many_parts.at(max=MAX_PARTS)
        head_end = body.find(b"\r\n\r\n", pos, pos + MAX_PART_HEADERS + 4)
        if head_end < 0:
            raise E.multipart_invalid.at(
                reason=f"a part's headers are missing or longer than {MAX_PART_HEADERS} bytes")
        headers: dict[str, str] = {}
        for line in body[pos:head_end].split(b"\r\n"):
            k, sep, v = line.decode("utf-8", "replace").partition(":")
            if sep:
                headers[k.strip().lower()] = v.strip()
        end = body.find(b"\r\n" + delim, head_end + 4)
        if end < 0:
            raise E.multipart_invalid.at(reason="the body ends before the closing boundary")
        data = body[head_end + 4:end]
        pos = end + 2 + len(delim)
        disp = headers.get("content-disposition", "")
        if not disp.lower().startswith("form-data"):
            raise E.multipart_invalid.at(reason="a part has no 'Content-Disposition: form-data'")
        d = _disposition(disp)
        name = d.get("name")
        if not name:
            raise E.multipart_invalid.at(reason="a part has no name")
        value: Any
        if "filename" in d:
            value = Upload(d["filename"][:256], headers.get("content-type",
                                                            "application/octet-stream"), data)
        else:
            if len(data) > MAX_TEXT_FIELD:
                raise E.string_too_long.at(name, max_len=MAX_TEXT_FIELD, length=len(data))
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                raise E.multipart_invalid.at(reason=f"the field '{name[:64]}' is not UTF-8") \
                    from None
        listed = name.endswith("[]")
        if listed:
            name = name[:-2]
        old = form.get(name)
        if listed or old is not None:
            if old is None:
                form[name] = [value]
            elif isinstance(old, list):
                old.append(value)
            else:
                form[name] = [old, value]
        else:
            form[name] = value
