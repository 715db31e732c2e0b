"""A renderer for the Go-template subset deploy/helm/llmsim uses, so the chart is tested
without a helm binary (none installs from the registries CI reaches). It is not helm: it
knows only what the chart's templates use, and fails loudly on anything else.

Subset: ``{{ .Values.a.b }}``, ``.``, ``$`` and ``$.x`` lookups (a missing key raises
KeyError, as ``helm template --strict`` refuses it); string and integer literals;
pipelines ``x | f a`` (the piped value is the last argument); the functions ``include``,
``toYaml``, ``nindent``, ``indent``, ``quote``, ``sha256sum``, ``trunc``, ``trimSuffix``,
``printf`` (``%s``/``%d`` only), ``contains``, ``default``, ``and``, ``or``, ``not``,
``eq``, ``fail`` (raises :class:`TemplateFail`); ``{{ if }}``/``{{ else if }}``/
``{{ else }}``/``{{ end }}``, ``{{ with }}`` (dot becomes the value; skipped when empty),
``{{ define "name" }}``; ``{{/* comments */}}``; ``{{-``/``-}}`` trimming whitespace.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

_TAG = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')

__all__ = ["TemplateFail", "Chart", "truthy"]


class TemplateFail(Exception):
    """A template's ``{{ fail "..." }}``: helm refuses to render with this message."""


def truthy(v: Any) -> bool:
    """Go template truth: false, 0, nil and empty strings or collections are false."""
    return v is not None and v is not False and v != 0 and v != "" and v != {} and v != []


def _text(v: Any) -> str:
    """How Go prints a value into the output."""
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        raise AssertionError(f"a collection printed without toYaml: {v!r}")
    return str(v)


def _indent(n: int, s: Any) -> str:
    return "\n".join(" " * n + ln for ln in _text(s).split("\n"))


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _printf(fmt: str, *args: Any) -> str:
    assert re.fullmatch(r"(?:[^%]|%[sd])*", fmt), f"printf format {fmt!r} not supported"
    return fmt.replace("%d", "%s") % tuple(_text(a) for a in args)


def _trim_suffix(suffix: str, s: Any) -> str:
    s = _text(s)
    return s[:-len(suffix)] if suffix and s.endswith(suffix) else s


def _fail(msg: str) -> Any:
    raise TemplateFail(msg)


FUNCS: dict[str, Any] = {
    "toYaml": _to_yaml, "nindent": lambda n, s: "\n" + _indent(n, s), "indent": _indent,
    "quote": lambda s: json.dumps(_text(s)), "trunc": lambda n, s: _text(s)[:n],
    "sha256sum": lambda s: hashlib.sha256(_text(s).encode()).hexdigest(),
    "trimSuffix": _trim_suffix, "printf": _printf, "contains": lambda sub, s: sub in _text(s),
    "default": lambda d, v: v if truthy(v) else d, "not": lambda v: not truthy(v),
    "and": lambda *a: all(truthy(x) for x in a), "or": lambda *a: any(truthy(x) for x in a),
    "eq": lambda a, b: a == b, "fail": _fail,
}


def _tokens(template: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []  # ("text", s) or ("tag", expression)
    pos, trim_next = 0, False
    for m in _TAG.finditer(template):
        text = template[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        expr = m.group(2)
        if not (expr.startswith("/*") and expr.endswith("*/")):
            out.append(("tag", expr))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = template[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


Node = tuple[Any, ...]


def _parse(tokens: list[tuple[str, str]], i: int, defines: dict[str, list[Node]]
           ) -> tuple[int, list[Node], str]:
    """Nodes from ``i`` up to a closing ``end``/``else...`` (returned) or the end."""
    nodes: list[Node] = []
    while i < len(tokens):
        kind, s = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", s))
        elif s == "end" or s == "else" or s.startswith("else if "):
            return i, nodes, s
        elif s.startswith(("if ", "with ")):
            word, _, cond = s.partition(" ")
            branches: list[tuple[str | None, list[Node]]] = []
            while True:
                i, body, closer = _parse(tokens, i, defines)
                branches.append((cond, body))
                if closer == "end":
                    break
                assert closer, f"{{{{ {word} }}}} without {{{{ end }}}}"
                cond = closer[8:] if closer.startswith("else if ") else None  # type: ignore[assignment]
                if cond is None:
                    i, body, closer = _parse(tokens, i, defines)
                    assert closer == "end", f"{{{{ {word} }}}} without {{{{ end }}}}"
                    branches.append((None, body))
                    break
            nodes.append((word, branches))
        elif s.startswith("define "):
            name = json.loads(s[7:].strip())
            i, body, closer = _parse(tokens, i, defines)
            assert closer == "end", f"define {name} without end"
            defines[name] = body
        else:
            nodes.append(("expr", s))
    return i, nodes, ""


class Chart:
    """A chart directory: ``render(values, release)`` → {template file: output text}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = yaml.safe_load((path / "Chart.yaml").read_text())
        self.defines: dict[str, list[Node]] = {}
        self.templates: dict[str, list[Node]] = {}
        for f in sorted((path / "templates").iterdir()):
            _, nodes, closer = _parse(_tokens(f.read_text()), 0, self.defines)
            assert closer == "", f"{f.name}: unbalanced {{{{ {closer} }}}}"
            if not f.name.startswith("_"):
                self.templates[f.name] = nodes

    def render(self, values: dict[str, Any], release: str = "llmsim",
               namespace: str = "default") -> dict[str, str]:
        root = {"Values": values,
                "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
                "Chart": {"Name": self.meta["name"], "Version": self.meta["version"],
                          "AppVersion": self.meta["appVersion"]}}
        return {name: self._run(nodes, root, root) for name, nodes in self.templates.items()}

    def render_string(self, template: str, values: dict[str, Any]) -> str:
        _, nodes, closer = _parse(_tokens(template), 0, self.defines)
        assert closer == "", f"unbalanced {{{{ {closer} }}}}"
        root = {"Values": values, "Release": {"Name": "llmsim", "Namespace": "default",
                                              "Service": "Helm"},
                "Chart": {"Name": "llmsim", "Version": "0", "AppVersion": "0"}}
        return self._run(nodes, root, root)

    # -- evaluation ---------------------------------------------------------------------------
    def _run(self, nodes: list[Node], dot: Any, root: Any) -> str:
        out: list[str] = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "expr":
                out.append(_text(self._pipeline(node[1], dot, root)))
            else:  # if / with
                for cond, body in node[1]:
                    if cond is None:
                        out.append(self._run(body, dot, root))
                        break
                    v = self._pipeline(cond, dot, root)
                    if truthy(v):
                        out.append(self._run(body, v if kind == "with" else dot, root))
                        break
        return "".join(out)

    def _value(self, w: str, dot: Any, root: Any) -> Any:
        if w.startswith('"'):
            return json.loads(w)
        if re.fullmatch(r"-?\d+", w):
            return int(w)
        if w in ("true", "false"):
            return w == "true"
        if w == ".":
            return dot
        if w == "$":
            return root
        cur = root if w.startswith("$.") else dot
        assert w.startswith((".", "$.")), f"template word {w!r} not supported by the renderer"
        for part in w.lstrip("$").lstrip(".").split("."):
            cur = cur[part]
        return cur

    def _pipeline(self, expr: str, dot: Any, root: Any) -> Any:
        value: Any = None
        for n, cmd in enumerate(p.strip() for p in expr.split("|")):
            fn, *words = _WORD.findall(cmd)
            if fn == "include":
                args = [self._value(w, dot, root) for w in words]
                if n:
                    args.append(value)
                name, ctx = args
                value = self._run(self.defines[name], ctx, root)
            elif fn in FUNCS:
                args = [self._value(w, dot, root) for w in words]
                if n:
                    args.append(value)
                value = FUNCS[fn](*args)
            else:
                assert n == 0 and not words, f"template function {fn} not supported"
                value = self._value(fn, dot, root)
        return value
