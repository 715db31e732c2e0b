"""API families. Each module exposes ``register(app)`` which adds its routes; handlers take
``(request, app)`` and return data (JSON, raw bytes or an EventStream), never write bytes.

Registration is explicit: every module listed here must import (a missing or broken module is
an error at start-up, never a silently absent API). A streaming family also defines its
:class:`~llmsim.dialect.Dialect` next to its renderer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import (
    admin,
    anthropic,
    cassette,
    chat,
    clients,
    completions,
    embeddings,
    faults,
    gemini,
    models,
    realtime,
    responses,
)

if TYPE_CHECKING:
    from ..app import App

# one line per family; the order is only the order of `routes()`
MODULES = (models, chat, completions, embeddings, responses, realtime, anthropic, gemini, faults,
           admin, clients, cassette)  # cassette last: record/replay replace generation routes


def register_all(app: App) -> None:
    for mod in MODULES:
        mod.register(app)
