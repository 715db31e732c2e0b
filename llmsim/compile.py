"""``python -m llmsim.compile``: build, check or remove the optional compiled build of the
per-event path (see :mod:`llmsim.native`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .native import NAMES, PKG, build, built, clean, unusable


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m llmsim.compile",
        description=f"Compile llmsim's per-event path ({NAMES}) with mypyc into C "
                    "extension modules next to their sources. Optional: pure Python is the default and "
                    "needs nothing built. Needs mypy and setuptools (pip install -e "
                    "'.[compile]'), a C compiler and the Python headers. A build whose "
                    "sources changed since is not used (the pure modules run, with a "
                    "warning); LLMSIM_PURE=1 runs the pure modules with a build present.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true",
                   help="print which build this interpreter would use, and why")
    g.add_argument("--clean", action="store_true", help="remove the compiled modules")
    a = ap.parse_args(argv)
    if a.check:
        if not built():
            print("pure Python (no compiled build)")
        else:
            why = unusable()
            print(f"compiled: {NAMES}" if why is None
                  else f"pure Python (the compiled build is not used: {why})")
        return 0
    if a.clean:
        gone = clean()
        print(f"removed {len(gone)} files" if gone else "nothing to remove")
        return 0
    try:
        files = build()
    except RuntimeError as e:
        print(f"llmsim.compile: {e}", file=sys.stderr)
        return 1
    print(f"compiled: {NAMES} ({len(files)} files in {PKG})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
