"""Every example in README.md and docs/ is run (issue 35): code blocks are extracted and
executed against a fresh server on a free port (the URL ``127.0.0.1:8080`` / ``localhost:8080``
rewritten to it), so an example that drifts from the code fails here.

What each fenced block gets, by its language, unless an HTML comment on the line before it
says otherwise (``<!-- example: KIND [ARG] -->``):

- ``python``: executed (top-level ``await`` allowed; ``client`` is predefined as an OpenAI
  client of the server; ``test_*`` functions it defines are called);
- ``bash``: each command line: ``curl`` is run and must get a 2xx; ``llmsim ...`` is parsed
  by llmsim's own command line (``llmsim top`` runs ``--once`` against the server);
  ``python bench/X.py --flags`` must name an existing script
  whose ``--help`` has the flags; ``pip install -e '.[x]'`` an existing extra; the set-up
  lines must be what ``.ci/run`` runs;
- ``toml``: a configuration llmsim loads, or a script (``rules``) it parses;
- ``json``: JSON, and a script when it has ``rules``;
- ``text`` and unlabelled blocks are output samples, not examples.

Kinds: ``pytest`` (the block is a test file run by pytest in a fresh project, with the
plugin), ``file NAME`` (written to NAME in the examples' directory, which later blocks of the
page see, and checked by its type), ``banner`` (equal to the start-up banner of a default
server).
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import contextlib
import inspect
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmsim import Config, ServerThread
from llmsim.config import load_config
from llmsim.ops.cli import banner, config_from_args, split_command
from llmsim.sim.script import parse_script

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*example:\s*(\w+)\s*(.*?)\s*-->$")
URL = re.compile(r"(?:http://)?(?:127\.0\.0\.1|localhost):8080")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    kind: str | None
    arg: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        mk = MARK.match(prev.strip())
        out.append(Block(page, start + 1, m.group(1), mk.group(1) if mk else None,
                         mk.group(2) if mk else "", "\n".join(lines[start + 1:j])))
        i = j + 1
    return out


ALL = [b for p in PAGES for b in blocks(p)]


def _pages_with_examples() -> list[Path]:
    return sorted({b.page for b in ALL if b.lang in ("python", "bash", "toml", "json")
                   or b.kind})


@pytest.fixture
def server() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=1, quiet=True)) as st:
        yield st


# -- the runners ------------------------------------------------------------------------------

def run_python(b: Block, url: str, workdir: Path) -> None:
    from openai import OpenAI

    code = URL.sub(url, b.code)
    tree = compile(code, b.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    ns: dict[str, Any] = {"__name__": "__example__",
                          "client": OpenAI(base_url=url + "/v1", api_key="sk-example")}
    with contextlib.chdir(workdir), contextlib.redirect_stdout(io.StringIO()):
        res = eval(tree, ns)  # noqa: S307 - the repository's own documentation
        if inspect.iscoroutine(res):
            asyncio.run(res)
        for name, fn in list(ns.items()):
            if name.startswith("test_") and callable(fn):
                params = inspect.signature(fn).parameters
                fn(**({"tmp_path": workdir} if "tmp_path" in params else {}))


def _ci_text() -> str:
    return (ROOT / ".ci" / "run").read_text()


def _help(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _extras() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["project"]["optional-dependencies"])


def run_command(b: Block, line: str, url: str) -> None:
    if line.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e "):
        # the set-up commands: CI runs this install (and this test command) itself
        install, _, rest = line.partition(" && llmsim")
        if not rest and "pytest" in line:
            install, _, test_cmd = line.rpartition(" && ")
            assert test_cmd in _ci_text(), f"{b.id}: .ci/run does not run {test_cmd!r}"
        assert install.split(" && pip install")[0] in _ci_text(), b.id
        return
    words = shlex.split(line, comments=True)
    if not words:
        return
    if words[0] == "curl":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        words = [URL.sub(url, w) for w in words]
        r = subprocess.run([*words, "-sS", "--max-time", "30", "-o", "/dev/null", "-w",
                            "%{http_code}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("2"), (b.id, line, r.stdout,
                                                                r.stderr)
        return
    if words[0] == "llmsim" or words[:3] == ["python", "-m", "llmsim"]:
        args = words[1:] if words[0] == "llmsim" else words[3:]
        command, rest = split_command(args)
        if command == "top":
            from llmsim.ops.top import main as top_main

            with contextlib.redirect_stdout(io.StringIO()):
                assert top_main([URL.sub(url, a) for a in rest] + ["--once"]) == 0, b.id
            return
        if command == "record":
            rest = ["--record-upstream" if a == "--upstream" else a for a in rest]
        config_from_args(rest, env={})  # exits (SystemExit) on a flag llmsim does not have
        return
    if words[0] == "python" and words[1].startswith("bench/"):
        text = _help(["python", words[1], "--help"])
        for w in words[2:]:
            if w.startswith("--"):
                assert w.split("=")[0] in text, f"{b.id}: {words[1]} has no {w}"
        return
    if words[:3] == ["pip", "install", "-e"]:
        m = re.fullmatch(r"\.\[([\w,]+)\]", words[3])
        assert m and set(m.group(1).split(",")) <= _extras(), (b.id, line)
        return
    raise AssertionError(f"{b.id}: no runner for the command {line!r}: give it one here")


def run_bash(b: Block, url: str) -> None:
    for line in re.sub(r"\\\n\s*", " ", b.code).split("\n"):
        if line.strip() and not line.lstrip().startswith("#"):
            run_command(b, line.strip(), url)


def check_toml(b: Block, workdir: Path, name: str = "example.toml") -> None:
    data = tomllib.loads(b.code)
    if "rules" in data:
        parse_script(data)
        return
    f = workdir / name
    f.write_text(b.code)
    load_config(f, env={})


def check_json(b: Block) -> None:
    data = json.loads(b.code)
    if isinstance(data, dict) and "rules" in data:
        parse_script(data)


def run_pytest(b: Block, url: str, workdir: Path) -> None:
    project = workdir / f"project_{b.line}"
    project.mkdir()
    ini = workdir / "pytest.ini"
    (project / "pytest.ini").write_text(ini.read_text() if ini.exists() else "[pytest]\n")
    (project / f"test_example_{b.line}.py").write_text(b.code)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(project)], cwd=project, capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items()
                                         if k != "PYTEST_ADDOPTS"})
    assert r.returncode == 0, f"{b.id}:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert " passed" in r.stdout


def run_block(b: Block, url: str, workdir: Path) -> None:
    if b.kind == "file":
        path = workdir / b.arg
        path.write_text(b.code + "\n")
        if b.arg.endswith(".json"):
            check_json(b)
        elif b.arg.endswith(".toml"):
            check_toml(b, workdir, "checked-" + b.arg)
        elif b.arg.endswith(".ini"):
            configparser.ConfigParser().read_string(b.code)
        return
    if b.kind == "pytest":
        run_pytest(b, url, workdir)
        return
    if b.kind == "banner":
        want = banner("http://127.0.0.1:8080", Config()).split("\nTry it:")[0]
        assert b.code == want, f"{b.id}: the banner is now:\n{want}"
        return
    assert b.kind is None, f"{b.id}: unknown example kind {b.kind!r}"
    if b.lang == "python":
        run_python(b, url, workdir)
    elif b.lang == "bash":
        run_bash(b, url)
    elif b.lang == "toml":
        check_toml(b, workdir)
    elif b.lang == "json":
        check_json(b)


@pytest.mark.parametrize("page", _pages_with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page: Path, server: Any, tmp_path: Path) -> None:
    """A page's examples in order, sharing one server and one directory (a ``file`` block
    is seen by the blocks after it); each python and bash block gets a fresh server."""
    for b in blocks(page):
        if b.lang in ("python", "bash") and b.kind is None:
            with ServerThread(Config(port=0, latency="instant", seed=1, quiet=True)) as st:
                run_block(b, st.url, tmp_path)
        else:
            run_block(b, server.url, tmp_path)


def test_extraction_sees_the_examples() -> None:
    kinds = {(b.lang, b.kind) for b in ALL}
    assert ("python", None) in kinds and ("bash", None) in kinds and ("python", "pytest") in kinds
    assert len([b for b in ALL if b.page.name == "README.md"]) >= 5
    assert any(b.kind == "banner" for b in ALL)


def test_a_drifted_example_fails(server: Any, tmp_path: Path) -> None:
    page = ROOT / "README.md"
    with pytest.raises(SystemExit):  # a flag llmsim does not have
        run_command(Block(page, 1, "bash", None, "", ""), "llmsim --no-such-flag", server.url)
    with pytest.raises(AssertionError):  # an answer that is not 2xx
        run_command(Block(page, 1, "bash", None, "", ""),
                    f"curl {server.url}/v1/nothing-here", server.url)
    with pytest.raises(AssertionError, match="no runner"):
        run_command(Block(page, 1, "bash", None, "", ""), "rm -rf /", server.url)
    with pytest.raises(Exception):  # noqa: B017 - any failure of the example's code
        run_python(Block(page, 1, "python", None, "", "client.models.retrieve('x' * 300)\n"
                         "raise SystemError('the example failed')"), server.url, tmp_path)
    with pytest.raises(Exception):  # noqa: B017
        check_toml(Block(page, 1, "toml", None, "", "latency = 'slow'"), tmp_path)


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.split("\n")) <= 250
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to a missing {target}"


def test_endpoint_tables_agree() -> None:
    """The README's endpoint table and docs/endpoints.md are the same table."""
    def rows(text: str) -> list[str]:
        return [ln.replace("](docs/", "](") for ln in text.split("\n") if ln.startswith("| ")]

    assert rows((ROOT / "README.md").read_text().split("## Endpoints")[1].split("\n## ")[0]) \
        == rows((ROOT / "docs" / "endpoints.md").read_text())


def test_reference_page_is_generated_from_the_config() -> None:
    from llmsim.ops.reference import reference_markdown

    assert (ROOT / "docs" / "reference.md").read_text() == reference_markdown(), \
        "docs/reference.md is stale: python -m llmsim.ops.reference > docs/reference.md"


def test_every_page_is_in_the_site_nav() -> None:
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(items: Any) -> set[str]:
        out: set[str] = set()
        for it in items:
            for v in it.values():
                out |= pages(v) if isinstance(v, list) else {v}
        return out

    have = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert have == pages(nav)
