"""llmsim: a fast, faithful OpenAI-compatible LLM API simulator."""

from __future__ import annotations

from . import assemble  # noqa: F401  (every App is assembled with the families)
from .config import Config, ConfigError, __version__, load_config  # noqa: E402
from .transport.server import Server, ServerThread  # noqa: E402

__all__ = ["Server", "ServerThread", "Config", "ConfigError", "load_config", "serve",
           "__version__"]


async def serve(config: Config | None = None) -> None:
    """Run a server until cancelled."""
    await Server(config).serve_forever()
