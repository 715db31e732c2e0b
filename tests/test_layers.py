"""The architecture holds (issue 30): no import circle anywhere in llmsim, counting
``TYPE_CHECKING`` and in-function imports (grimp, import-linter's graph), and the layer
contracts of pyproject.toml ([tool.importlinter]) pass, as ``lint-imports`` checks in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def _cycles() -> list[list[str]]:
    g = grimp.build_graph("llmsim", include_external_packages=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.find_modules_directly_imported_by(v):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(g.modules):
        if m not in index:
            strong(m)
    return out


def test_no_import_circle() -> None:
    assert _cycles() == []


def test_layer_contracts() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]


def test_few_modules_flat_in_the_package() -> None:
    flat = sorted(p.name for p in (ROOT / "llmsim").glob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= 8, flat
