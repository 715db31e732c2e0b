"""The composition root: which API families, hooks and WebSocket modes an :class:`App` is
assembled with. Nothing below this module names a feature: the app dispatches to routes and
hooks, each family module registers its own (``register(app)``), each feature keeps its state
under a typed key it owns (:class:`~llmsim.app.Key`). Importing the ``llmsim`` package imports
this module, so every ``App`` is assembled the same way.

Adding an API family: its module under ``api/`` and one line in :data:`MODULES`.
"""

from __future__ import annotations

from .api import (
    admin,
    anthropic,
    audio,
    azure,
    bedrock,
    cassette,
    chat,
    clients,
    completions,
    embeddings,
    faults,
    gemini,
    images,
    media,
    models,
    moderations,
    ollama,
    realtime,
    responses,
    serving,
)
from .api.realtime import record as realtime_record
from .app import App, install_with

__all__ = ["MODULES", "install"]

# one line per family or feature; the order is the order of the routes (cassette last:
# record/replay replaces the generation routes)
MODULES = (models, chat, completions, embeddings, responses, realtime, anthropic, gemini, ollama, azure,
           bedrock, images, audio, moderations, media, faults, serving, admin, clients, cassette,
           realtime_record)  # cassette last: record/replay replace generation routes


def install(app: App) -> None:
    """Register every family, hook and WebSocket mode into ``app``. Registration is explicit:
    every module listed must import (a missing or broken one is an error at start-up, never a
    silently absent API)."""
    for mod in MODULES:
        mod.register(app)


install_with(install)
