"""--time-scale: the scaled clock, checked against a stub loop (no wall-clock timing)."""

from __future__ import annotations

from typing import Any

import pytest

from llmsim.config import Config, ConfigError
from llmsim.streaming.timescale import ScaledClock


class StubLoop:
    def __init__(self) -> None:
        self.t = 100.0
        self.at: list[float] = []
        self.soon = 0

    def time(self) -> float:
        return self.t

    def call_at(self, when: float, cb: Any) -> Any:
        self.at.append(when)
        return self

    def call_soon(self, cb: Any) -> Any:
        self.soon += 1
        return self

    def cancel(self) -> None:
        pass


def test_simulated_time_runs_scale_times_faster() -> None:
    loop = StubLoop()
    clock = ScaledClock(60.0, loop)  # type: ignore[arg-type]
    assert clock.now() == 6000.0
    fired: list[float] = []
    clock.call_at(6000.0 + 30.0, lambda: fired.append(clock.now()))  # 30 simulated s
    assert loop.at and loop.at[-1] == pytest.approx(100.5, abs=1e-3)  # 0.5 real s
    loop.t = 100.5
    clock._fire()
    assert fired == [pytest.approx(6030.0)]


def test_time_scale_bounds() -> None:
    for bad in (0.0, 2000.0):
        with pytest.raises(ConfigError, match="time_scale"):
            Config(time_scale=bad)
    assert Config(time_scale=10).time_scale == 10
