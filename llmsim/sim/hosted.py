"""What the simulated hosted tools find, run and draw: pure, seeded, no I/O, no wire format.

The server runs these tools itself in the real API (web and file search, code interpreter,
image generation, remote MCP servers); llmsim makes up their results, deterministically from
the request's RNG and words: fake but stable web sources, file chunks drawn from the
request's vector store ids, a small Python program with the logs it would print (computed,
never executed), a small valid PNG (stdlib zlib), the tools of an MCP server named from its
label. :func:`seconds` is how long each takes (a search takes seconds, not a token gap).
"""

from __future__ import annotations

import hashlib
import random
import re
import struct
import zlib
from typing import Any

import orjson

from . import tokens as tok
from .latency import Latency, _lognorm

__all__ = ["item_parts", "seconds", "query_of", "web_sources", "file_results", "program", "png",
           "mcp_tools", "mcp_arguments", "mcp_output", "computer_action", "shell_commands",
           "patch", "HOSTED_SECONDS"]

# median seconds each hosted step takes (jittered by the profile's TTFT jitter; none under
# --latency instant; --ttft-ms fixes it)
HOSTED_SECONDS = {"web_search": 2.5, "open_page": 1.2, "file_search": 0.8,
                  "code_interpreter": 1.5, "image_generation": 12.0, "mcp_list_tools": 0.4,
                  "mcp_call": 0.9}
_SITES = ("example.com", "example.org", "example.net", "docs.example.com", "news.example.org",
          "wiki.example.net", "blog.example.com", "research.example.edu")
_WORD = re.compile(r"[A-Za-z0-9]+")


def seconds(lat: Latency, rng: random.Random, kind: str) -> float:
    """Seconds one hosted step of ``kind`` takes under ``lat``."""
    if lat.instant:
        return 0.0
    if lat.fixed_ttft_ms is not None:
        return lat.fixed_ttft_ms / 1000.0
    return HOSTED_SECONDS.get(kind, 1.0) * _lognorm(rng, lat.profile.ttft_jitter)


def _words(text: str, n: int) -> list[str]:
    return _WORD.findall(text[:2048])[:n]


def query_of(user_text: str, rng: random.Random) -> str:
    """A search query made of the user's words (lorem when they gave none)."""
    words = [w for w in _words(user_text, 24) if len(w) > 2][:8]
    if not words:
        words = "".join(tok.lorem_pieces(4, rng)).split()
    return " ".join(words).lower()


def _slug(words: list[str]) -> str:
    return "-".join(w.lower() for w in words)[:60] or "page"


def web_sources(query: str, rng: random.Random, n: int) -> list[dict[str, str]]:
    """``n`` fake web pages about ``query``: url, title (the same for the same query)."""
    words = query.split()[:5]
    out = []
    for i in range(n):
        site = _SITES[(rng.randrange(len(_SITES)) + i) % len(_SITES)]
        title = " ".join(w.capitalize() for w in words) or "Result"
        out.append({"url": f"https://{site}/{_slug(words)}-{i + 1}",
                    "title": f"{title} - {site}"})
    return out


def _file_id(store: str, i: int) -> str:
    h = hashlib.sha256(f"{store}/{i}".encode()).hexdigest()[:22]
    return f"file-{h}"


def file_results(query: str, stores: list[str], rng: random.Random,
                 n: int) -> list[dict[str, Any]]:
    """``n`` chunks found in the vector stores (file ids derived from the store ids), best
    first, each with its score and text."""
    out = []
    score = round(rng.uniform(0.82, 0.97), 4)
    for i in range(n):
        store = stores[i % len(stores)]
        k = rng.randrange(8)
        text = query.capitalize() + ": " + "".join(tok.lorem_pieces(rng.randint(20, 40), rng))
        out.append({"file_id": _file_id(store, k), "filename": f"document_{k + 1}.pdf",
                    "score": score, "text": text.strip(), "attributes": {}})
        score = round(score * rng.uniform(0.8, 0.97), 4)
    return out


def program(rng: random.Random) -> tuple[str, str]:
    """A small Python program and the logs it prints (computed here, never run)."""
    values = [rng.randint(1, 99) for _ in range(rng.randint(4, 8))]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    code = (f"import statistics\n\nvalues = {values}\n"
            "mean = statistics.fmean(values)\n"
            "spread = statistics.pstdev(values)\n"
            'print(f"mean = {mean:.4f}")\n'
            'print(f"stdev = {spread:.4f}")\n')
    logs = f"mean = {mean:.4f}\nstdev = {var ** 0.5:.4f}\n"
    return code, logs


def png(rng: random.Random, size: int = 32) -> bytes:
    """A valid ``size``×``size`` RGB PNG: a gradient in seeded colours."""
    r0, g0, b0 = rng.randrange(256), rng.randrange(256), rng.randrange(256)
    rows = bytearray()
    for y in range(size):
        rows.append(0)  # filter: none
        for x in range(size):
            rows += bytes(((r0 + 4 * x) % 256, (g0 + 4 * y) % 256, (b0 + 2 * (x + y)) % 256))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + \
        chunk(b"IDAT", zlib.compress(bytes(rows), 9)) + chunk(b"IEND", b"")


def _ident(label: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    return s[:32] or "server"


QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}},
                 "required": ["query"], "additionalProperties": False}


def mcp_tools(label: str, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The tools an MCP server lists: ``names`` (e.g. its ``allowed_tools``), else three
    named from its label."""
    s = _ident(label)
    if not names:
        names = [f"search_{s}", f"fetch_{s}_document", f"list_{s}_topics"]
    return [{"name": n, "description": f"{n.replace('_', ' ').capitalize()} ({label}).",
             "input_schema": QUERY_SCHEMA, "annotations": {"read_only": True}}
            for n in names]


def mcp_arguments(query: str) -> str:
    return '{"query":' + _json_str(query) + "}"


def _json_str(s: str) -> str:
    return orjson.dumps(s).decode()


def mcp_output(name: str, query: str, rng: random.Random) -> str:
    """What an MCP tool answers (text)."""
    body = "".join(tok.lorem_pieces(rng.randint(15, 40), rng)).strip()
    return f"{name}({query!r}): {body}"


def computer_action(rng: random.Random, first: bool, width: int, height: int) -> dict[str, Any]:
    """The next computer-use action: a screenshot first, then a click or typing."""
    if first:
        return {"type": "screenshot"}
    if rng.random() < 0.6:
        return {"type": "click", "button": "left", "x": rng.randrange(max(1, width)),
                "y": rng.randrange(max(1, height))}
    return {"type": "type", "text": "".join(tok.lorem_pieces(rng.randint(2, 5), rng)).strip()}


def shell_commands(query: str, rng: random.Random) -> list[str]:
    word = (query.split() or ["src"])[0]
    return ["ls -la", f"grep -rn {word!r} . | head -20"][:rng.randint(1, 2)]


def patch(query: str, rng: random.Random) -> dict[str, Any]:
    """An ``apply_patch`` operation: a new file of a few lines (a V4A diff)."""
    name = _ident(query.split()[0] if query.split() else "notes")
    lines = ["".join(tok.lorem_pieces(rng.randint(4, 9), rng)).strip() for _ in range(3)]
    return {"type": "create_file", "path": f"{name}.md",
            "diff": "".join(f"+{line}\n" for line in lines)}


_NOT_READ = frozenset(("id", "type", "status", "call_id", "approval_request_id", "result",
                       "partial_image_b64", "encrypted_content"))
IMAGE_TOKENS = 85  # a screenshot, at the low-detail price (as llmsim.sim.prompt counts images)


def item_parts(it: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """A hosted-tool item in a prompt (as :func:`llmsim.sim.prompt._item_parts` counts
    items): 3 tokens of framing plus what the model reads of it, its fields as JSON (not
    its ids, nor an image's bytes: a screenshot costs a low-detail image)."""
    if it.get("type") == "computer_call_output":
        return 3 + IMAGE_TOKENS, ()
    return 3, (orjson.dumps({k: v for k, v in it.items() if k not in _NOT_READ}).decode(),)
