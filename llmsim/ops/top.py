"""``llmsim top [URL ...]``: a live terminal view of ``/llmsim/stats``, of one server or of
several (replicas behind a load balancer: one section each, after a line of totals).

Standard library only (urllib + ANSI escapes). ``--once`` prints one frame and exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "render_frame"]


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f}s" if v >= 1000 else f"{v:.1f}ms"


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.1f}k"
    return f"{v:.{digits}f}"


def render_frame(s: dict[str, Any], url: str = "") -> str:
    """One screen of text for a ``/llmsim/stats`` document."""
    w = s.get("window", {})
    a = s["active"]
    lat = s["latency_ms"]
    lines = [
        f"llmsim top  {url}  uptime {s['uptime_s']:.0f}s  workers {s.get('workers', 1)}  "
        f"connections {a['connections']}",
        "",
        f"requests/s {_n(w.get('requests_per_s'), 1):>8}   tokens/s {_n(w.get('tokens_per_s')):>8}"
        f"   errors/s {_n(w.get('errors_per_s'), 2):>6}   (last {w.get('seconds', 0):.0f}s)",
        f"active     requests {a['requests']}  streams {a['streams']}  websockets "
        f"{a['websockets']}  running {s.get('running', 0)}  queued {s.get('queue_depth', 0)}",
        f"totals     requests {_n(s['requests_total'])}  tokens in {_n(s['tokens']['input'])} "
        f"out {_n(s['tokens']['output'])} delivered {_n(s['tokens']['delivered'])}  errors "
        f"{_n(s['errors_total'])}",
        "",
        f"{'latency':<12}{'p50':>10}{'p90':>10}{'p99':>10}{'count':>10}   (since reset)",
    ]
    for name, label in (("ttft", "TTFT"), ("itl", "inter-token"), ("e2e", "end-to-end")):
        x = lat[name]
        lines.append(f"{label:<12}{_ms(x['p50']):>10}{_ms(x['p90']):>10}{_ms(x['p99']):>10}"
                     f"{_n(x['count']):>10}")
    lines += ["", f"{'model':<28}{'requests':>9}{'errors':>8}{'running':>8}{'tokens':>9}"
                  f"{'TTFT p50':>10}{'ITL p50':>10}{'E2E p50':>10}"]
    models = sorted(s.get("models", {}).items(), key=lambda kv: -kv[1]["requests"])
    for m, v in models[:15]:
        lines.append(f"{m[:27]:<28}{_n(v['requests']):>9}{_n(v['errors']):>8}"
                     f"{v['running']:>8}{_n(v['delivered_tokens']):>9}"
                     f"{_ms(v['ttft_ms']['p50']):>10}{_ms(v['itl_ms']['p50']):>10}"
                     f"{_ms(v['e2e_ms']['p50']):>10}")
    if s.get("errors"):
        lines += ["", "errors: " + "  ".join(f"{k}={v}" for k, v in
                                             sorted(s["errors"].items(), key=lambda kv: -kv[1]))]
    return "\n".join(lines)


def _fetch(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/llmsim/stats", timeout=timeout) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


MAX_URLS = 16  # as the dashboard's ?replicas= list


def render_many(urls: Sequence[str], fetch: Any = None) -> tuple[str, int]:
    """One screen for several servers: a totals line, then each server's frame (or why it
    could not be read). Returns the text and how many servers could not be read."""
    fetch = fetch or (lambda u: _fetch(u, 5.0))
    parts: list[str] = []
    failed = 0
    req = tok = err = 0.0
    for url in urls:
        try:
            s = fetch(url)
            parts.append(render_frame(s, url))
            w = s.get("window", {})
            req += w.get("requests_per_s") or 0.0
            tok += w.get("tokens_per_s") or 0.0
            err += w.get("errors_per_s") or 0.0
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            failed += 1
            parts.append(f"llmsim top  {url}  cannot read /llmsim/stats: {exc}")
    if len(urls) == 1:
        return parts[0], failed
    head = (f"llmsim top  {len(urls)} servers ({len(urls) - failed} answering)  "
            f"requests/s {_n(req, 1)}  tokens/s {_n(tok)}  errors/s {_n(err, 2)}")
    rule = "\n" + "-" * 40 + "\n"
    return head + rule + rule.join(parts), failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llmsim top",
                                description="Live terminal view of running llmsim servers "
                                            "(one, or several replicas: a section each after "
                                            "a totals line).")
    p.add_argument("urls", nargs="*", metavar="URL", help="server base URLs (as many as "
                   f"--url; at most {MAX_URLS})")
    p.add_argument("--url", action="append", default=[], help="a server base URL "
                   "(repeatable; default: http://127.0.0.1:8080)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    ns = p.parse_intermixed_args(argv)
    urls = [*ns.url, *ns.urls] or ["http://127.0.0.1:8080"]
    if len(urls) > MAX_URLS:
        p.error(f"at most {MAX_URLS} URLs")
    try:
        while True:
            frame, failed = render_many(urls)
            if ns.once:
                if failed == len(urls):
                    print(frame, file=sys.stderr)
                    return 1
                print(frame)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + frame + "\n")
            sys.stdout.flush()
            time.sleep(max(ns.interval, 0.1))
    except KeyboardInterrupt:
        return 0
