"""A real ``redis-server`` for the shared-state tests (``--state redis://...``).

Fixtures (imported by conftest, so every test module can ask for them):

- ``redis_server`` (session): one private ``redis-server`` on a free 127.0.0.1 port, no
  persistence (``--save '' --appendonly no``), killed at the end of the session. Skips with a
  clear reason when ``redis-server`` or the ``redis`` package is not installed.
- ``redis_url`` (function): ``redis://127.0.0.1:PORT/0`` of the session server, flushed
  before the test, so every test starts from an empty Redis.
- ``own_redis`` (function): a factory for a private :class:`RedisServer` a test may stop and
  restart (Redis down mid-test) without disturbing the session server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

REDIS_BIN = shutil.which("redis-server") or ("/usr/bin/redis-server"
                                              if os.path.exists("/usr/bin/redis-server") else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on a fixed free port: ``start``/``stop``/``restart``
    (the port stays the same, so a server's ``--state`` URL points at it again)."""

    def __init__(self, port: int | None = None) -> None:
        assert REDIS_BIN is not None
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="llmsim-redis-")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [str(REDIS_BIN), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self._dir,
             "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def flushall(self) -> None:
        import redis

        with redis.Redis(port=self.port) as r:
            r.flushall()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _require_redis() -> None:
    if REDIS_BIN is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip("the redis package is not installed (pip install 'llmsim[redis]')")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    _require_redis()
    rs = RedisServer().start()
    try:
        yield rs
    finally:
        rs.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis_server.flushall()
    return redis_server.url()


@pytest.fixture
def own_redis() -> Iterator[Callable[[], RedisServer]]:
    _require_redis()
    made: list[RedisServer] = []

    def factory() -> RedisServer:
        rs = RedisServer().start()
        made.append(rs)
        return rs

    yield factory
    for rs in made:
        rs.close()
