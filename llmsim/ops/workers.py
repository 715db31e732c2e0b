"""``--workers N``: N server processes on one port, supervised by the parent.

Theory of operation. The parent resolves the address and binds a *placeholder* socket with
``SO_REUSEPORT`` (bound, never listening: it reserves the port, and port 0 becomes a real port
every worker then shares). For each worker it creates a fresh listening socket with
``SO_REUSEPORT`` on that port and forks; the kernel spreads new connections evenly over the
listening sockets (a shared accept socket lets one busy process grab bursts of connections).
``TCP_NODELAY`` is set on every accepted connection by the protocol (``connection_made``).

Supervision. The parent never runs an event loop: it waits on a self-pipe fed by
``signal.set_wakeup_fd`` for SIGCHLD, SIGTERM and SIGINT. A worker that exits while the server
is running is restarted after a backoff (0.1 s doubling to 5 s; reset after 10 s of healthy
life). SIGTERM/SIGINT are forwarded to every worker, which drains in-flight requests for
``shutdown_grace_s``; workers still alive ``grace + 5 s`` later are killed.

Statistics. Every worker writes its raw stats snapshot (:meth:`Stats.raw`, mergeable by
addition) to ``<state dir>/w-<pid>.json`` every :data:`FLUSH_S` seconds (atomic replace). The
worker that serves ``/llmsim/stats`` or ``/metrics`` merges its own live snapshot with every
other file (``app.stats_collect``), so the endpoints show the whole server, the
other workers at most ``FLUSH_S`` old. When a worker dies the parent keeps its last snapshot as
``dead-<pid>.json`` with its gauges zeroed: counters stay whole across crashes (minus at most
``FLUSH_S`` of the dead worker's last activity). ``POST /llmsim/stats/reset`` writes a reset
epoch and signals the other workers (SIGUSR1) to apply it at once; snapshots older than the
epoch are left out until they do.

Stored responses. A follow-up (``previous_response_id``, ``GET /v1/responses/{id}``) may land
on any worker, and with a kernel-balanced port no worker can route by id, so ``--workers > 1``
keeps stored responses in one shared on-disk store (:mod:`llmsim.state.shared`, sqlite in the
state dir) instead of per-process memory. The state dir is a fresh temporary directory removed
when the parent exits. When a worker dies, the parent marks the unfinished responses that
worker was running ``failed`` in the shared store at once (each unfinished response records
its owner's pid), before restarting the slot: every worker then answers the same for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import glob
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from ..app import App
    from ..config import Config

__all__ = ["resolve_workers", "run_workers", "install_stats", "FLUSH_S"]

FLUSH_S = 0.2  # how stale another worker's numbers may be in /llmsim/stats
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
HEALTHY_S = 10.0  # a worker that lived this long restarts with the shortest backoff
KILL_AFTER_GRACE_S = 5.0


def resolve_workers(value: str | int) -> int:
    """``"auto"`` → CPU count; otherwise a positive integer."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return os.cpu_count() or 1
    n = int(value)
    if n < 1:
        raise ValueError("workers must be >= 1 or 'auto'")
    return n


# ------------------------------------------------------------------------------------------
# sockets
# ------------------------------------------------------------------------------------------

def _addr(host: str, port: int) -> tuple[int, Any]:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def _reuseport_socket(family: int, sockaddr: Any, listen: bool) -> socket.socket:
    from ..transport.server import bound_socket  # (not at import: the server module loads the app)

    return bound_socket(family, sockaddr, reuse_port=True, listen=listen)


# ------------------------------------------------------------------------------------------
# stats across workers (runs inside each worker)
# ------------------------------------------------------------------------------------------

def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError):
        return None


def _reset_epoch(state_dir: str) -> float:
    v = _read_json(os.path.join(state_dir, "reset"))
    return float(v) if isinstance(v, (int, float)) else 0.0


def install_stats(app: App, state_dir: str) -> None:
    """Make this worker's ``/llmsim/stats`` and ``/metrics`` report every worker, and keep
    this worker's snapshot file fresh (a loop timer every :data:`FLUSH_S`, no task)."""
    pid = os.getpid()
    mine = os.path.join(state_dir, f"w-{pid}.json")
    loop = asyncio.get_running_loop()

    def apply_reset() -> float:
        epoch = _reset_epoch(state_dir)
        if epoch > app.stats.reset_at:
            app.stats.reset()
        return epoch

    def flush() -> bool:
        apply_reset()
        try:
            _write_atomic(mine, orjson.dumps(app.stats.raw()))
        except OSError:  # the state dir went away: the parent is shutting down
            return False
        return True

    def tick() -> None:
        if flush():
            loop.call_later(FLUSH_S, tick)

    async def collect(app_: App) -> dict[str, Any]:
        from ..state.stats import merge

        epoch = apply_reset()
        snaps = [app.stats.raw()]
        for path in glob.glob(os.path.join(state_dir, "*.json")):
            if path == mine:
                continue
            s = _read_json(path)
            if isinstance(s, dict) and s.get("reset_at", 0.0) >= epoch:
                snaps.append(s)
        return merge(snaps)

    async def reset(app_: App) -> None:
        now = time.time()
        _write_atomic(os.path.join(state_dir, "reset"), orjson.dumps(now))
        for path in glob.glob(os.path.join(state_dir, "*.json")):
            name = os.path.basename(path)
            if name.startswith("dead-"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            elif path != mine:
                # SIGUSR1: apply the reset now rather than at the next flush, so requests the
                # sibling serves in between are not counted and then wiped
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(name[2:-5]), signal.SIGUSR1)
        app.stats.reset()

    app.stats_collect = collect
    app.stats_reset = reset
    loop.add_signal_handler(signal.SIGUSR1, flush)
    tick()


def _retire(state_dir: str, pid: int) -> None:
    """Keep a dead worker's counters (``dead-<pid>.json``) with its live gauges zeroed."""
    path = os.path.join(state_dir, f"w-{pid}.json")
    s = _read_json(path)
    if isinstance(s, dict):
        s["workers"] = 0
        s["gauges"] = {k: 0 for k in s.get("gauges", {})}
        s["running"] = {}
        s["model_gauges"] = {}
        w = s.get("window")
        if isinstance(w, dict):
            s["window"] = {"seconds": 0.0, "requests": 0, "tokens": 0, "input_tokens": 0,
                           "errors": 0, "rates": {}, "hist": {}}
        with contextlib.suppress(OSError):
            _write_atomic(os.path.join(state_dir, f"dead-{pid}.json"), orjson.dumps(s))
    with contextlib.suppress(OSError):
        os.unlink(path)


# ------------------------------------------------------------------------------------------
# the worker process
# ------------------------------------------------------------------------------------------

def _worker_main(cfg: Config, sock: socket.socket, state_dir: str, index: int) -> None:
    from ..transport.server import Server, run_loop

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)

    async def serve() -> None:
        server = Server(cfg, sock=sock, state_dir=state_dir)
        await server.start()
        install_stats(server.app, state_dir)
        server.settle_soon()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        run_loop(serve(), cfg)


# ------------------------------------------------------------------------------------------
# the supervisor (parent)
# ------------------------------------------------------------------------------------------

class Supervisor:
    """Forks, restarts and stops the workers (see the module doc)."""

    def __init__(self, cfg: Config, n: int, *, log: Any = None) -> None:
        self.cfg = cfg
        self.n = n
        self.log = log or (lambda msg: print(f"llmsim: {msg}", file=sys.stderr, flush=True))
        self.family, sockaddr = _addr(cfg.host, cfg.port)
        self.placeholder = _reuseport_socket(self.family, sockaddr, listen=False)
        self.sockaddr = self.placeholder.getsockname()
        self.port: int = self.sockaddr[1]
        self.state_dir = tempfile.mkdtemp(prefix="llmsim-workers-")
        from ..state import shared

        shared.prepare(self.state_dir)  # WAL set once here: workers never race to switch it
        self.slots: dict[int, int] = {}  # pid → slot
        self.started_at: dict[int, float] = {}
        self.failures = [0] * n
        self.restart_at: dict[int, float] = {}  # slot → monotonic time
        self.stopping = False
        self.restarts = 0

    @property
    def url(self) -> str:
        host = self.cfg.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def spawn(self, slot: int) -> int:
        sock = _reuseport_socket(self.family, self.sockaddr, listen=True)
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                self.placeholder.close()
                _worker_main(self.cfg, sock, self.state_dir, slot)
            except BaseException:  # pragma: no cover - reported, then exit
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        sock.close()
        self.slots[pid] = slot
        self.started_at[pid] = time.monotonic()
        return pid

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.slots.pop(pid, None)
            if slot is None:
                continue
            _retire(self.state_dir, pid)
            lived = time.monotonic() - self.started_at.pop(pid, time.monotonic())
            if self.stopping:
                continue
            self._fail_orphans(pid)
            if lived >= HEALTHY_S:
                self.failures[slot] = 0
            delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** self.failures[slot])
            self.failures[slot] += 1
            how = (f"signal {-os.waitstatus_to_exitcode(status)}"
                   if os.WIFSIGNALED(status) else f"exit {os.waitstatus_to_exitcode(status)}")
            self.log(f"worker {slot} (pid {pid}) ended ({how}); restarting in {delay:.1f} s")
            self.restart_at[slot] = time.monotonic() + delay

    def _fail_orphans(self, pid: int) -> None:
        """The worker ``pid`` died: its unfinished responses become ``failed`` everywhere."""
        from ..api.responses.state import fail_orphans

        try:
            n = fail_orphans(self.cfg.responses, self.state_dir, pid)
        except Exception as exc:  # the supervisor must survive a store it cannot update
            self.log(f"could not mark the responses of worker pid {pid} failed: {exc!r}")
            return
        if n:
            self.log(f"marked {n} unfinished response(s) of worker pid {pid} failed")

    def run(self, on_ready: Any = None) -> int:
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        got: list[int] = []
        old_wakeup = signal.set_wakeup_fd(wfd)
        old = {s: signal.signal(s, lambda sig, _f: got.append(sig))
               for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)}
        kill_at: float | None = None
        try:
            for slot in range(self.n):
                self.spawn(slot)
            if on_ready is not None:
                on_ready(self)
            while self.slots or (not self.stopping and self.restart_at):
                timeout = None
                now = time.monotonic()
                if self.restart_at and not self.stopping:
                    timeout = max(0.0, min(self.restart_at.values()) - now)
                if kill_at is not None:
                    t = max(0.0, kill_at - now)
                    timeout = t if timeout is None else min(timeout, t)
                try:
                    select.select([rfd], [], [], timeout)
                except InterruptedError:  # pragma: no cover - PEP 475 retries
                    pass
                with contextlib.suppress(BlockingIOError):
                    while os.read(rfd, 512):
                        pass
                while got:
                    sig = got.pop()
                    if sig in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                        self.stopping = True
                        self.restart_at.clear()
                        kill_at = time.monotonic() + self.cfg.shutdown_grace_s + \
                            KILL_AFTER_GRACE_S
                        for pid in list(self.slots):
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGTERM)
                self._reap()
                now = time.monotonic()
                for slot, at in list(self.restart_at.items()):
                    if at <= now and not self.stopping:
                        del self.restart_at[slot]
                        self.restarts += 1
                        self.spawn(slot)
                if kill_at is not None and now >= kill_at:
                    for pid in list(self.slots):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    kill_at = None
        finally:
            for pid in list(self.slots):  # an exception in the supervisor: leave no orphans
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in list(self.slots):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)
            for s, h in old.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_wakeup)
            os.close(rfd)
            os.close(wfd)
            self.placeholder.close()
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return 0


def run_workers(cfg: Config, n: int, on_ready: Any = None) -> int:
    """Run ``n`` supervised workers until SIGTERM/SIGINT; returns an exit code."""
    try:
        sup = Supervisor(cfg, n)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE or exc.strerror:
            print(f"llmsim: error: cannot listen on {cfg.host}:{cfg.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        raise
    return sup.run(on_ready)
