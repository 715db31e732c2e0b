"""A pump sink for tests: keeps every frame written, never pauses, ignores abort."""

from __future__ import annotations


class FrameSink:
    paused = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write_events(self, frames: list[bytes]) -> None:
        self.frames.extend(frames)

    def abort(self) -> None:
        pass
