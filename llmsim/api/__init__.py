"""API families. Each module exposes ``register(app)`` which adds its routes; handlers take
``(request, app)`` and return data (JSON, raw bytes or an EventStream), never write bytes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app import App

# Order matters only for readability of `routes()`; each module registers its own paths.
MODULES = ("models", "chat", "responses", "faults", "admin", "websocket")


def register_all(app: App) -> None:
    for name in MODULES:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # family not built yet
            raise
        mod.register(app)
