"""A JavaScript client against the Gemini family (issue 32): the official ``@google/genai``
package, driven by node. The package is installed once with npm into a cache directory
(``LLMSIM_NODE_DIR``, default ``~/.cache/llmsim-tests/node``); the test skips when node or
npm is missing or the install fails (no registry)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmsim import Config, ServerThread

PACKAGE = "@google/genai"
PROBE = Path(__file__).parent / "data" / "genai_probe.mjs"


@pytest.fixture(scope="module")
def node_dir() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed")
    d = Path(os.environ.get("LLMSIM_NODE_DIR", Path.home() / ".cache" / "llmsim-tests" / "node"))
    if not (d / "node_modules" / PACKAGE / "package.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                            "--prefix", str(d), PACKAGE], check=True, timeout=300,
                           capture_output=True)
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"npm install {PACKAGE} failed: {exc}")
    shutil.copy(PROBE, d / PROBE.name)  # (an ES module resolves packages from its own dir)
    return d


def test_google_genai_js(node_dir: Path) -> None:
    with ServerThread(Config(port=0, latency="instant", seed=3, quiet=True)) as s:
        run = subprocess.run(["node", str(node_dir / PROBE.name), s.url], capture_output=True,
                             text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out: dict[str, Any] = json.loads(run.stdout)
    assert out["text"] and out["usage"]["totalTokenCount"] == (
        out["usage"]["promptTokenCount"] + out["usage"]["candidatesTokenCount"])
    assert out["chunks"] >= 12 and out["streamText"]
    assert out["tokens"] > 0 and out["dims"] == 16
    assert out["error"]["status"] == 400 and "candidate" in out["error"]["message"]
