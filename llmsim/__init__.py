"""llmsim: a fast, faithful OpenAI-compatible LLM API simulator."""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Config, ConfigError, load_config  # noqa: E402
from .transport.server import Server, ServerThread  # noqa: E402

__all__ = ["Server", "ServerThread", "Config", "ConfigError", "load_config", "serve",
           "__version__"]


async def serve(config: Config | None = None) -> None:
    """Run a server until cancelled."""
    await Server(config).serve_forever()
