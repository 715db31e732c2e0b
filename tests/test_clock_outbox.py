"""The writes a clock pass holds (``Clock.outbox``): the token writes of a pass's common ticks
are made back to back when the pass ends, each connection's bytes unchanged and in order,
whatever else writes during the pass, and never more than 64 held. Virtual time only."""

from __future__ import annotations

import asyncio

import pytest

from llmsim.api.chat import CHAT
from llmsim.sim.latency import ConstantGaps
from llmsim.streaming import encode
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun
from llmsim.streaming.wire import HTTPWire

GAP = 0.01
KEY = ({"id": "chatcmpl-1"}, 0)


class Clock2(FakeClock):
    """Tells a transport how many held writes the flush writing to it is making."""

    flushing = 0

    def flush(self) -> None:
        self.flushing = len(self._held)
        try:
            super().flush()
        finally:
            self.flushing = 0


class Transport:
    """Records each write into a log shared by every connection: (connection, bytes, how many
    writes the clock held at that moment)."""

    def __init__(self, name: int, log: list[tuple[int, bytes, int]], clock: Clock2) -> None:
        self.name, self.log, self.clock = name, log, clock

    def write(self, data: bytes) -> None:
        self.log.append((self.name, data, self.clock.flushing))

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass


def plan(tokens: int) -> list[tuple[float, str, object]]:
    return [(0.1, "chunk", {"role": "assistant"}),
            (0.0, "chunk", TokenRun([f"t{i}" for i in range(tokens)],
                                    ConstantGaps(GAP, tokens - 1), KEY)),
            (0.0, "chunk", {"finish": 1}), (0.0, "done", None)]


async def run(streams: int, tokens: int, hold: bool = True,
              extra: tuple[tuple[float, int, bytes], ...] = ()) -> list[tuple[int, bytes, int]]:
    """``streams`` streams begun together on one clock, each on its own connection; ``extra``:
    timers that write ``bytes`` to connection ``n`` at a deadline (armed after the pumps)."""
    clock = Clock2(start=0.0)
    log: list[tuple[int, bytes, int]] = []
    loop = asyncio.get_running_loop()
    done = [loop.create_future() for _ in range(streams)]
    wires = []
    for i in range(streams):
        wire = HTTPWire(Transport(i, log, clock))  # type: ignore[arg-type]
        wire.open = True
        wires.append(wire)
        stream = EventStream(iter(plan(tokens)), CHAT)
        p = Pump(stream, clock, encode.sse_chat, wire, on_done=done[i].set_result)
        if not hold:
            p.held_write = None  # every write made at once, as before the outbox
        p.start(0.0)
    for at, n, data in extra:  # (armed half a gap before: after the pump armed its token)
        def write(n: int = n, data: bytes = data) -> None:
            wires[n].transport.write(data)  # type: ignore[union-attr]

        clock.call_at(at - GAP / 2, lambda at=at, write=write: clock.call_at(at, write))
    assert await asyncio.wait_for(asyncio.gather(*done), 5) == ["completed"] * streams
    return log


def per_connection(log: list[tuple[int, bytes, int]]) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for n, data, _ in log:
        out[n] = out.get(n, b"") + data
    return out


@pytest.mark.asyncio
async def test_a_pass_holds_its_token_writes_and_makes_them_together() -> None:
    log = await run(3, 6)
    # the middle tokens (the common tick) of the three streams: written by the pass's flush,
    # three in a row, one per connection in the order the pumps were armed
    held = [(n, k) for n, _, k in log if k]
    assert len(held) == 3 * 4
    assert [n for n, _ in held] == [0, 1, 2] * 4
    assert all(k == 3 for _, k in held)  # all three held when the first was written
    # the bytes each connection receives are exactly those of writes made at once
    assert per_connection(log) == per_connection(await run(3, 6, hold=False))


@pytest.mark.asyncio
async def test_a_timer_writing_during_a_pass_comes_after_the_held_writes() -> None:
    # a timer due with stream 0's second token, armed after it: its bytes follow the token's
    # on the wire (the clock makes the held writes before it runs a timer that is not a pump)
    log = await run(2, 4, extra=((0.1 + GAP, 0, b"X"),))
    conn0 = [data for n, data, _ in log if n == 0]
    i = conn0.index(b"X")
    assert b'"t1"' in conn0[i - 1]
    assert b'"t2"' in conn0[i + 1]


@pytest.mark.asyncio
async def test_at_most_64_writes_are_held() -> None:
    log = await run(150, 4)
    assert 32 <= max(k for _, _, k in log) <= 64
    assert len([1 for _, _, k in log if k]) == 150 * 2  # every common tick was held
    assert per_connection(log) == per_connection(await run(150, 4, hold=False))


@pytest.mark.asyncio
async def test_nothing_is_held_outside_a_pass() -> None:
    clock = FakeClock(start=0.0)
    assert clock.outbox is None
    log = await run(2, 3)
    assert log and clock.outbox is None and not clock._held


async def failing(ends: bool) -> list[bytes]:
    """The writes of a stream whose observer raises at the write of its last events (the last
    token, the finish chunk, [DONE]), on a wire whose owner takes them (``ends``) or not."""
    clock = Clock2(start=0.0)
    log: list[tuple[int, bytes, int]] = []
    wire = HTTPWire(Transport(0, log, clock))  # type: ignore[arg-type]
    wire.open = True
    wire.ends = ends
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    class Observer:
        calls = 0

        def __call__(self, etype: str, data: object, now: float) -> None:
            pass

        def per_write(self, n: int, now: float) -> None:
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("observer failed")

    def on_done(reason: str) -> None:
        assert wire.last is None  # (nothing left for the owner: the pump wrote it)
        done.set_result(reason)

    p = Pump(EventStream(iter(plan(3)), CHAT), clock, encode.sse_chat, wire, on_done,
             Observer(), CHAT.sse_error)
    p.start(0.0)
    assert await asyncio.wait_for(done, 5) == "error"
    return [d for _, d, _ in log]


@pytest.mark.asyncio
async def test_a_failure_after_the_last_events_writes_them_before_its_error() -> None:
    """A pump that left a stream's last events to the wire's owner (``Wire.ends``) and then
    fails writes them itself, ahead of the terminal error frame and in its write: the same
    bytes as when it writes them at once."""
    got = await failing(ends=True)
    was = await failing(ends=False)
    assert len(got) == len(was) - 1
    assert b"".join(got) == b"".join(was)
    assert b'"t2"' in got[-1] and b"[DONE]" in got[-1] and b'"error"' in got[-1]
    out = b"".join(got)
    assert out.index(b'"t2"') < out.index(b"[DONE]") < out.index(b'"error"')


class Flaky(Transport):
    """A transport whose ``fail_at``-th write raises (a transport closed under the pass)."""

    def __init__(self, name: int, log: list[tuple[int, bytes, int]], clock: Clock2,
                 fail_at: int) -> None:
        super().__init__(name, log, clock)
        self.writes = 0
        self.fail_at = fail_at
        self.failed_held = 0  # how many writes the flush held when this one raised

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            self.failed_held = self.clock.flushing
            raise RuntimeError("transport closed")
        super().write(data)


@pytest.mark.asyncio
@pytest.mark.parametrize("broken", [0, 1, 2])
async def test_a_held_write_that_raises_ends_its_stream_alone(broken: int) -> None:
    """A held write that raises ends that stream (its token written again, then the error
    frame) while the other streams' held writes of the pass, before and after it, are made."""
    clock = Clock2(start=0.0)
    log: list[tuple[int, bytes, int]] = []
    loop = asyncio.get_running_loop()
    done = [loop.create_future() for _ in range(3)]
    flaky: list[Flaky] = []
    for i in range(3):
        # the third write of a connection: its third token, a held one
        tr = (Flaky(i, log, clock, 3) if i == broken else Transport(i, log, clock))
        if isinstance(tr, Flaky):
            flaky.append(tr)
        wire = HTTPWire(tr)  # type: ignore[arg-type]
        wire.open = True
        p = Pump(EventStream(iter(plan(4)), CHAT), clock, encode.sse_chat, wire,
                 on_done=done[i].set_result, error_frame=CHAT.sse_error)
        p.start(0.0)
    got = await asyncio.wait_for(asyncio.gather(*done), 5)
    assert flaky[0].failed_held == 3  # (a held write: the three streams' in one flush)
    assert got == ["error" if i == broken else "completed" for i in range(3)]
    conns = per_connection(log)
    ok = per_connection(await run(3, 4))
    for i in range(3):
        if i != broken:
            assert conns[i] == ok[i]
    out = conns[broken]
    cut = out.rindex(b"\r\n", 0, out.index(b'data: {"error"') - 2) + 2  # (its chunk)
    assert out[:cut] == ok[broken][:cut] and b'"t2"' in out[:cut]
    assert b'"t3"' not in out and out.endswith(b"data: [DONE]\n\n\r\n")
