"""The optional compiled build of the per-event path (built by ``python -m llmsim.compile``).

Theory of operation. Every token of every stream runs through these modules: the shared clock
(``llmsim.clock``), the pump (``llmsim.flow``), the event stream (``llmsim.stream``) and the
connection that writes it: ``llmsim.protocol`` (which also parses every request) and
``llmsim.wire`` (what a stream's pump writes through: an HTTP connection's chunks, a WebSocket
connection's text frames). They
are plain, fully annotated Python, and mypyc (part of mypy) can compile them as they are into
C extension modules placed next to their sources, which Python then imports instead. Nothing
else changes: same code, same tests (CI runs the whole suite against both builds). Pure Python
stays the default and the reference; the compiled build is an opt-in, like uvloop.

Measured (bench/RESULTS.md, "the optional compiled build"): the user-space instructions per
streamed event fall by about a quarter (callgrind on a live server: chat 33.7k -> 25.0k,
Responses 38.0k -> 27.5k, WebSocket 41.1k -> 31.4k, 26.5k with the WebSocket wire; the bare anchor
about 25k), the CPU per token live by 0-17%: a token's live cost is mostly memory traffic and
the kernel's write, which compiling does not change.

A build records each source's SHA-256 (``_compiled.json``). At import, ``choose()`` (called
first thing by ``llmsim/__init__``) loads the compiled modules only if every source is
unchanged since the build and the build is for this interpreter; otherwise it warns once and
loads them all from source (they are compiled against each other: all or none). Set
``LLMSIM_PURE=1`` to run the pure modules with a build present.

Usage::

    pip install -e '.[compile]'      # mypy and setuptools; plus a C compiler and Python headers
    python -m llmsim.compile         # build in place (about 15 s)
    python -m llmsim.compile --check # which build this interpreter uses
    python -m llmsim.compile --clean # back to pure Python
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["MODULES", "build_info", "choose"]

PKG = Path(__file__).resolve().parent
MODULES = ("clock", "flow", "stream", "protocol", "wire")  # compiled together (one mypyc group): all or none
NAMES = ", ".join(f"llmsim.{n}" for n in MODULES)
GROUP = "llmsim._native"  # the group's shared runtime library: llmsim/_native__mypyc.*.so
MANIFEST = "_compiled.json"
PURE_ENV = "LLMSIM_PURE"
CHOICE = "pure"  # what choose() decided when llmsim was imported (see build_info)


def _extensions(pkg: Path, name: str) -> list[Path]:
    return [p for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if (p := pkg / f"{name}{suffix}").exists()]


def built(pkg: Path = PKG) -> list[str]:
    """The modules of :data:`MODULES` that have a compiled extension in ``pkg``."""
    return [n for n in MODULES if _extensions(pkg, n)]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unusable(pkg: Path = PKG) -> str | None:
    """Why the build present in ``pkg`` must not be used (None: it may): a partial build, no
    manifest, another interpreter, or a source changed since the build."""
    if len(built(pkg)) != len(MODULES):
        return "a partial build"
    try:
        manifest = json.loads((pkg / MANIFEST).read_text())
        sources = manifest["sources"]
        tag = manifest["cache_tag"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {MANIFEST}"
    if tag != sys.implementation.cache_tag:
        return f"built for {tag}, this is {sys.implementation.cache_tag}"
    for n in MODULES:
        src = pkg / f"{n}.py"
        try:
            if sources.get(n) != _digest(src):
                return f"{src.name} changed since the build"
        except (OSError, AttributeError):
            return f"{src.name} unreadable or not in the manifest"
    return None


class _FromSource(importlib.abc.MetaPathFinder):
    """Loads the named modules of the package from their ``.py`` files, compiled
    extensions next to them notwithstanding."""

    def __init__(self, pkg: Path, package: str, names: Sequence[str]) -> None:
        self.pkg, self.names = pkg, {f"{package}.{n}": n for n in names}

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        n = self.names.get(fullname)
        if n is None:
            return None
        return importlib.util.spec_from_file_location(fullname, self.pkg / f"{n}.py")


def choose(pkg: Path = PKG, package: str = "llmsim",
           env: dict[str, str] | None = None) -> str:
    """Decide, before they are imported, whether the compiled modules load: returns
    ``"compiled"``, ``"pure"`` (no build, or ``LLMSIM_PURE``) or ``"pure (reason)"`` for
    a build that must not be used (also warned)."""
    global CHOICE
    CHOICE = result = _choose(pkg, package, os.environ if env is None else env)
    return result


def _choose(pkg: Path, package: str, env: Any) -> str:
    if not built(pkg):
        return "pure"
    if env.get(PURE_ENV, "") not in ("", "0"):
        why = None
        result = "pure"
    else:
        why = unusable(pkg)
        if why is None:
            return "compiled"
        result = f"pure ({why})"
        warnings.warn(f"llmsim: the compiled build is not used ({why}): running the pure-Python "
                      f"modules; rebuild with `python -m llmsim.compile`", RuntimeWarning,
                      stacklevel=3)
    if not any(isinstance(f, _FromSource) and f.pkg == pkg for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource(pkg, package, MODULES))
    return result


def build_info() -> str:
    """``"compiled"`` when the per-event modules running are the compiled ones, else
    ``"pure"`` or ``"pure (why a build present is not used)"`` (the banner and
    ``--version`` say it)."""
    mod = sys.modules.get("llmsim.flow")
    if mod is None:  # not imported yet: what will be
        return CHOICE
    f = getattr(mod, "__file__", None) or ""
    if f.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return "compiled"
    return CHOICE if CHOICE.startswith("pure") else "pure"


def clean(pkg: Path = PKG) -> list[Path]:
    """Remove the compiled modules, the group library and the manifest from ``pkg``."""
    gone = [p for n in (*MODULES, GROUP.rpartition(".")[2] + "__mypyc")
            for p in _extensions(pkg, n)]
    if (pkg / MANIFEST).exists():
        gone.append(pkg / MANIFEST)
    for p in gone:
        p.unlink()
    return gone


_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
paths, group, target, lib, tmp = sys.argv[1:6]
setup(name="llmsim-compiled", py_modules=[], packages=[],
      ext_modules=mypycify(paths.split(","), group_name=group, target_dir=target, opt_level="3"),
      script_args=["build_ext", "--build-lib", lib, "--build-temp", tmp])
"""


def build(pkg: Path = PKG, quiet: bool = False) -> list[Path]:
    """Compile :data:`MODULES` with mypyc and install them next to their sources (raises
    RuntimeError with the compiler's output on failure; nothing is installed then)."""
    import shutil
    import subprocess
    import tempfile

    try:
        import mypyc  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"the compiled build needs mypy and setuptools ({e}): "
                           "pip install -e '.[compile]'") from None
    digests = {n: _digest(pkg / f"{n}.py") for n in MODULES}
    with tempfile.TemporaryDirectory(prefix="llmsim-compile-") as tmp:
        t = Path(tmp)
        paths = ",".join(f"{pkg.name}/{n}.py" for n in MODULES)
        # run where the package is a top-level directory, so mypyc names the modules llmsim.*
        cmd = [sys.executable, "-c", _SETUP, paths, GROUP, str(t / "c"), str(t / "lib"),
               str(t / "tmp")]
        env = {**os.environ, PURE_ENV: "1"}  # (mypy reads the sources, never the build)
        r = subprocess.run(cmd, cwd=pkg.parent, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mypyc failed (exit {r.returncode}):\n{r.stdout[-4000:]}"
                               f"\n{r.stderr[-4000:]}")
        out = t / "lib" / pkg.name
        made = sorted(out.glob("*")) if out.is_dir() else []
        if not made:
            raise RuntimeError(f"mypyc produced no modules:\n{r.stdout[-4000:]}")
        if any(_digest(pkg / f"{n}.py") != d for n, d in digests.items()):
            raise RuntimeError("a source changed during the build: run it again")
        clean(pkg)
        installed = []
        for p in made:
            dest = pkg / p.name
            shutil.copy2(p, dest)
            installed.append(dest)
    manifest = {"cache_tag": sys.implementation.cache_tag, "sources": digests,
                "modules": [f"{pkg.name}.{n}" for n in MODULES]}
    (pkg / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return [*installed, pkg / MANIFEST]
