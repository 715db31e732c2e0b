"""The configuration reference page (docs/reference.md), generated from the declaration in
:mod:`llmsim.config`, so the documented options cannot drift from the real ones:
``python -m llmsim.ops.reference > docs/reference.md`` (a test checks the file is current)."""

from __future__ import annotations

import typing
from typing import Any

from ..config import Config, iter_options

__all__ = ["reference_markdown"]

HEAD = """# Configuration reference

Every option, generated from llmsim's configuration declaration (`llmsim/config.py`; regenerate
with `python -m llmsim.ops.reference > docs/reference.md`). Each has a flag, an `LLMSIM_*`
environment variable and a key in the `--config` TOML file (a dotted name is a key in that
table: `faults.p_429` is `p_429` under `[faults]`). Precedence: flags > environment > file >
defaults. Tables that have no flag (per-model and per-key settings) are described under
[Options](options.md) and [Faults](faults.md).
"""


def _type(tp: Any, choices: Any) -> str:
    if choices:
        return " \\| ".join(f"`{c}`" for c in choices)
    base = tp
    optional = False
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        base = args[0]
    if typing.get_origin(base) is tuple:
        name = "list of " + typing.get_args(base)[0].__name__
    else:
        name = getattr(base, "__name__", str(base))
    return name + (" or unset" if optional else "")


def _default(v: Any) -> str:
    if v is None or v == ():
        return "unset"
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"`{v}`"


def reference_markdown() -> str:
    """The page's Markdown text."""
    out = [HEAD]
    section: str | None = "none"
    for o in iter_options(Config):
        sec = o.path[0] if len(o.path) > 1 else None
        if sec != section:
            section = sec
            out.append(f"\n## {'General' if sec is None else '[' + sec + ']'}\n")
            out.append("| option | type | default | meaning |")
            out.append("| --- | --- | --- | --- |")
        name = ".".join(o.path)
        help_txt = o.help.replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{name}`<br>`{o.flag}`<br>`{o.env}` | {_type(o.type, o.choices)} | "
                   f"{_default(o.default)} | {help_txt} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
