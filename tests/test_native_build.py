"""The optional compiled build (llmsim.native, ``python -m llmsim.compile``): a build is used
only whole, for this interpreter and with its sources unchanged; otherwise the pure modules
load (a compiled file next to them notwithstanding) and the user is told why.

CI runs the whole suite twice, pure and compiled (``EXPECT_LLMSIM_BUILD`` says which: the
first test fails if the build in use is not the one CI built)."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmsim import native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_the_build_in_use_is_the_one_expected() -> None:
    import llmsim.flow  # noqa: F401  (the per-event path is loaded)

    expected = os.environ.get("EXPECT_LLMSIM_BUILD")
    if expected is None:
        assert native.build_info() in ("pure", "compiled")
    else:
        assert native.build_info() == expected
        import llmsim.clock
        import llmsim.flow
        import llmsim.protocol
        import llmsim.stream

        for m in (llmsim.clock, llmsim.flow, llmsim.stream, llmsim.protocol):
            assert (m.__file__ or "").endswith(SUFFIX) == (expected == "compiled")


@pytest.fixture
def fake_pkg(tmp_path: Path) -> Iterator[Path]:
    """A package ``fakebuild`` with the build's modules and a 'compiled' file for each that
    is not an extension at all: importing one of those fails, so a test sees which loads."""
    pkg = tmp_path / "fakebuild"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for n in native.MODULES:
        (pkg / f"{n}.py").write_text(f"WHO = 'source {n}'\n")
        (pkg / f"{n}{SUFFIX}").write_bytes(b"not a shared object")
    manifest = {"cache_tag": sys.implementation.cache_tag,
                "sources": {n: native._digest(pkg / f"{n}.py") for n in native.MODULES}}
    (pkg / native.MANIFEST).write_text(json.dumps(manifest))
    sys.path.insert(0, str(tmp_path))
    before = list(sys.meta_path)
    try:
        yield pkg
    finally:
        sys.path.remove(str(tmp_path))
        sys.meta_path[:] = before
        for name in [m for m in sys.modules if m.split(".")[0] == "fakebuild"]:
            del sys.modules[name]


def test_a_whole_current_build_is_used(fake_pkg: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.choose(fake_pkg, "fakebuild", env={}) == "compiled"
    with pytest.raises(ImportError):  # the 'extension' is what Python would load
        importlib.import_module("fakebuild.flow")


@pytest.mark.parametrize("spoil,why", [
    (lambda p: (p / "flow.py").write_text("WHO = 'edited'\n"), "flow.py changed since the build"),
    (lambda p: (p / native.MANIFEST).unlink(), "no readable _compiled.json"),
    (lambda p: (p / native.MANIFEST).write_text("{not json"), "no readable _compiled.json"),
    (lambda p: (p / native.MANIFEST).write_text('{"cache_tag": "cpython-27", "sources": {}}'),
     "built for cpython-27"),
    (lambda p: (p / f"stream{SUFFIX}").unlink(), "a partial build"),
], ids=["source edited", "no manifest", "bad manifest", "other python", "partial"])
def test_a_build_that_must_not_be_used_loads_the_sources(fake_pkg: Path, spoil: object,
                                                         why: str) -> None:
    spoil(fake_pkg)  # type: ignore[operator]
    with pytest.warns(RuntimeWarning, match="python -m llmsim.compile"):
        choice = native.choose(fake_pkg, "fakebuild", env={})
    assert choice.startswith("pure (") and why in choice
    for n in native.MODULES:  # all from source: they are compiled against each other
        mod = importlib.import_module(f"fakebuild.{n}")
        assert mod.__file__ == str(fake_pkg / f"{n}.py")
        assert mod.WHO in (f"source {n}", "edited")


def test_llmsim_pure_loads_the_sources_without_a_warning(fake_pkg: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.choose(fake_pkg, "fakebuild", env={"LLMSIM_PURE": "1"}) == "pure"
        assert native.choose(fake_pkg, "fakebuild", env={"LLMSIM_PURE": "1"}) == "pure"
    assert sum(isinstance(f, native._FromSource) and f.pkg == fake_pkg
               for f in sys.meta_path) == 1  # once
    assert importlib.import_module("fakebuild.clock").WHO == "source clock"


def test_no_build_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text("")
    before = list(sys.meta_path)
    assert native.choose(tmp_path, "fakebuild", env={}) == "pure"
    assert sys.meta_path == before


def test_clean_removes_the_build_and_nothing_else(fake_pkg: Path) -> None:
    (fake_pkg / f"_native__mypyc{SUFFIX}").write_bytes(b"")
    (fake_pkg / f"other{SUFFIX}").write_bytes(b"")
    gone = native.clean(fake_pkg)
    assert sorted(p.name for p in gone) == sorted(
        [f"{n}{SUFFIX}" for n in native.MODULES] + [f"_native__mypyc{SUFFIX}", native.MANIFEST])
    left = sorted(p.name for p in fake_pkg.iterdir())
    assert left == sorted(["__init__.py", *(f"{n}.py" for n in native.MODULES),
                           f"other{SUFFIX}"])
    assert native.built(fake_pkg) == []


def test_the_command_says_which_build_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "llmsim.compile", "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(("pure Python", "compiled: llmsim.clock, llmsim.flow"))
    v = subprocess.run([sys.executable, "-m", "llmsim", "--version"],
                       capture_output=True, text=True, timeout=60)
    assert "per-event path: " in v.stdout


def test_llmsim_pure_is_a_known_environment_variable() -> None:
    from llmsim.config import load_config

    seen: list[str] = []  # (the config warns of unknown LLMSIM_* variables)
    load_config(None, env={"LLMSIM_PURE": "1"}, warn=seen.append)
    assert seen == []
    load_config(None, env={"LLMSIM_PUREX": "1"}, warn=seen.append)
    assert seen == ["unknown environment variable LLMSIM_PUREX ignored (did you mean "
                    "LLMSIM_PURE?)"]
