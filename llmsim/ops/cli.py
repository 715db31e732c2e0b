"""Command line: flags derived once from the Config dataclasses; signals live here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import typing
from collections.abc import Sequence
from typing import Any

from ..config import FAULT_KINDS, Config, ConfigError, __version__, iter_options, load_config
from ..transport.server import run_loop

__all__ = ["main", "build_parser"]

EPILOG = """\
precedence: flags > LLMSIM_* environment variables > --config file > defaults.
Every flag has an environment variable: --ttft-ms → LLMSIM_TTFT_MS, --strict-models →
LLMSIM_STRICT_MODELS=1, and a config-file key: ttft_ms = 200 (sections become TOML tables).

examples:
  llmsim                                   # realistic per-model latency on 127.0.0.1:8080
  llmsim --latency instant --seed 1        # CI: no delays, reproducible output
  llmsim --ttft-ms 200 --itl-ms 10         # benchmark: fixed TTFT and inter-token gap
  llmsim --config llmsim.toml --port 0     # settings from a file, any free port
  llmsim --max-tokens-mode exact           # every max_tokens filled exactly (fixed lengths)

commands (options may come before or after the command):
  llmsim top [URL ...] [--url URL]         # live terminal view of /llmsim/stats (several servers)
  llmsim record --upstream https://api.openai.com \
                --upstream anthropic=https://api.anthropic.com --cassettes DIR
                                           # proxy real providers, save cassettes
  llmsim --replay DIR [--replay-speed X]   # serve the saved exchanges offline
  (record/replay: docs/record-replay.md)

An unknown LLMSIM_* environment variable is ignored with a warning (naming the close match
when it looks like a typo of a known one).

Point an OpenAI client at it:  OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=x
"""


def _flag_type(tp: Any) -> Any:
    base = tp
    origin = typing.get_origin(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        base = args[0] if args else str
    if base in (int, float):
        return base
    return str


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmsim",
        description="llmsim — a fast, faithful OpenAI-compatible LLM API simulator "
                    "(Chat Completions, legacy Completions, Responses over HTTP/SSE and "
                    "WebSocket, models).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"llmsim {__version__}")
    p.add_argument("--config", metavar="FILE.toml", default=None,
                   help="Read settings from a TOML file (env: LLMSIM_CONFIG). Unknown keys "
                        "are an error.")
    for o in iter_options():
        base = typing.get_args(o.type)[0] if typing.get_origin(o.type) is not None and \
            typing.get_origin(o.type) is not typing.Literal else o.type
        default_txt = "" if o.default in (None, False, (), "") else f" (default: {o.default})"
        help_txt = f"{o.help}{default_txt} [env {o.env}]"
        if o.type is bool:
            p.add_argument(o.flag, dest=o.dest, action=argparse.BooleanOptionalAction,
                           default=None, help=help_txt)
        elif typing.get_origin(o.type) is tuple:
            p.add_argument(o.flag, dest=o.dest, action="append", default=None,
                           metavar=o.metavar or "VALUE", help=help_txt + " (repeatable)")
        else:
            p.add_argument(o.flag, dest=o.dest, default=None, type=_flag_type(o.type),
                           choices=o.choices, metavar=o.metavar if not o.choices else None,
                           help=help_txt)
        del base
    return p


def _warn(msg: str) -> None:
    print(f"llmsim: warning: {msg}", file=sys.stderr, flush=True)


def config_from_args(argv: Sequence[str] | None = None,
                     env: dict[str, str] | None = None) -> tuple[Config, argparse.Namespace]:
    parser = build_parser()
    ns = parser.parse_args(argv)
    env = dict(os.environ) if env is None else env
    overrides = {}
    for o in iter_options():
        v = getattr(ns, o.dest)
        if v is not None:
            overrides[".".join(o.path)] = v
    cfg = load_config(ns.config or env.get("LLMSIM_CONFIG"), env=env, overrides=overrides,
                      warn=_warn)
    return cfg, ns


COMMANDS = ("top", "record")


def split_command(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The subcommand (``top``, ``record``) wherever it stands among the options, and the
    other arguments in order: ``llmsim --port 9000 record --upstream U`` is ``record`` with
    ``--port 9000 --upstream U``. A word that is an option's value (``--fixed-text top``) is
    not a command; neither is anything after ``--``."""
    takes_value: set[str] = set()
    for action in build_parser()._actions:
        if action.nargs != 0:
            takes_value.update(action.option_strings)
    takes_value.add("--upstream")  # record's own spelling of --record-upstream
    rest = list(args)
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            break
        if a.startswith("-"):
            if "=" not in a and a in takes_value:
                i += 1  # skip its value
        elif a in COMMANDS:
            return a, rest[:i] + rest[i + 1:]
        i += 1
    return None, rest


def _redact(url: str) -> str:
    """A state URL without its password (the banner may end up in shared logs)."""
    scheme, sep, rest = url.partition("://")
    cred, at, host = rest.rpartition("@")
    if not at:
        return url
    user = cred.split(":", 1)[0]
    return f"{scheme}{sep}{user + ':***' if ':' in cred else user}@{host}"


def describe(cfg: Config, workers: int = 1) -> list[str]:
    """What the banner says about a configuration: mode, state back end, realism models."""
    if cfg.record_upstream:
        mode = f"record (proxying {cfg.record_upstream}, cassettes in {cfg.cassettes or './cassettes'})"
    elif cfg.replay:
        mode = f"replay (cassettes in {cfg.replay}, speed {cfg.replay_speed:g}x)"
    elif cfg.script:
        mode = f"script ({cfg.script}; unmatched requests are simulated)"
    else:
        mode = "simulate"
    if cfg.state:
        state = f"redis ({_redact(cfg.state)})"
    elif workers > 1:
        state = f"shared on-disk store across {workers} worker processes"
    else:
        state = "in memory"
    latency: str = cfg.latency
    if cfg.ttft_ms is not None or cfg.itl_ms is not None:
        latency = f"fixed (ttft {cfg.ttft_ms} ms, itl {cfg.itl_ms} ms)"
    realism = []
    f = cfg.faults
    drawn = [f"{k} {getattr(f, 'p_' + k):g}" for k in FAULT_KINDS if getattr(f, "p_" + k)]
    if drawn or f.models or f.endpoints:
        realism.append("faults (" + (", ".join(drawn) or "per model/endpoint") + ")")
    if cfg.ratelimit.enabled:
        realism.append(f"rate limits (rpm {cfg.ratelimit.rpm}, tpm {cfg.ratelimit.tpm}"
                       f"{', per model/key' if cfg.ratelimit.models or cfg.ratelimit.keys else ''})")
    if cfg.capacity.enabled:
        realism.append(f"capacity (max_seqs {cfg.capacity.max_seqs}, queue {cfg.capacity.queue}"
                       f"{', itl_slope ' + format(cfg.capacity.itl_slope, 'g') if cfg.capacity.itl_slope else ''})")
    return [f"mode: {mode}",
            f"state: {state}",
            f"latency: {latency}, seed: {cfg.seed}, text: {cfg.text}, max_tokens: "
            f"{cfg.max_tokens_mode}",
            "realism: " + ("; ".join(realism) or "none (no faults, rate limits or capacity "
                                                  "model)")]


def banner(url: str, cfg: Config, workers: int = 1) -> str:
    lines = "".join(f"  {line}\n" for line in describe(cfg, workers))
    return (f"llmsim {__version__} listening on {url}\n{lines}"
            f"Try it:\n"
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
            f"    -d '{{\"model\": \"gpt-4o\", \"messages\": [{{\"role\": \"user\", "
            f"\"content\": \"Hello\"}}]}}'\n"
            f"  OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY=sk-test python your_app.py\n"
            f"Press Ctrl+C to stop.")


async def _serve(cfg: Config) -> None:
    from ..state.logs import setup_logging
    from ..transport.server import Server

    setup_logging(cfg.log_level, cfg.log_format)
    server = Server(cfg)
    await server.start()
    if not cfg.quiet:
        print(banner(server.url, cfg), flush=True)
    server.settle_soon()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if not cfg.quiet:
        print("llmsim: shutting down (waiting for in-flight requests)...", file=sys.stderr,
              flush=True)
    await server.close()


def _serve_workers(cfg: Config, n: int) -> int:
    """``--workers N``: the parent supervises N forked workers (see workers.py)."""
    from ..state.logs import setup_logging
    from .workers import run_workers

    setup_logging(cfg.log_level, cfg.log_format)

    def ready(sup: Any) -> None:
        if not cfg.quiet:
            print(banner(sup.url, cfg, n) + f"\n({n} worker processes)", flush=True)

    return run_workers(cfg, n, on_ready=ready)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    command, args = split_command(args)
    if command == "top":  # `llmsim top URL... [--url ...]`: the terminal stats view
        from .top import main as top_main

        return top_main(args)
    if command == "record":  # `llmsim [options] record --upstream [NAME=]URL ... [--cassettes DIR]`
        rest, args = args, []
        for i, a in enumerate(rest):
            if a == "--upstream" and i + 1 < len(rest):
                routed = "=" in rest[i + 1].split("://", 1)[0]
                args.append("--record-route" if routed else "--record-upstream")
            elif a.startswith("--upstream="):
                value = a[len("--upstream="):]
                routed = "=" in value.split("://", 1)[0]
                args.append(("--record-route=" if routed else "--record-upstream=") + value)
            else:
                args.append(a)
        if not any(a.partition("=")[0] in ("--record-upstream", "--record-route")
                   for a in args):
            print("llmsim: error: record needs --upstream URL", file=sys.stderr)
            return 2
    argv = args
    try:
        cfg, _ns = config_from_args(argv)
    except ConfigError as exc:
        print(f"llmsim: error: {exc}", file=sys.stderr)
        return 2
    if cfg.replay or cfg.record_upstream or cfg.record_route or cfg.record_mode:
        from ..api.cassette import preflight  # bad cassettes or CA: an error, no traceback

        try:
            preflight(cfg)
        except ConfigError as exc:
            print(f"llmsim: error: {exc}", file=sys.stderr)
            return 2
    if cfg.script:  # a bad script is a start-up error naming its place, not a traceback
        from ..sim.script import ScriptError, load_script

        try:
            load_script(cfg.script)
        except ScriptError as exc:
            print(f"llmsim: error: script {cfg.script}: {exc}", file=sys.stderr)
            return 2
    from .workers import resolve_workers

    n = resolve_workers(cfg.workers)
    if n > 1:
        return _serve_workers(cfg, n)
    try:
        run_loop(_serve(cfg), cfg)
    except OSError as exc:
        print(f"llmsim: error: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
