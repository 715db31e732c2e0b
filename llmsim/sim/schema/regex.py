"""JSON Schema support, regular expressions: parsed once, generated constructively, matched without backtracking (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import functools
import random
import re._constants as _sre_c  # type: ignore[import-not-found]  # the regex parser's node names (Python >= 3.11)
import re._parser as _sre_parse  # type: ignore[import-not-found]
import string
from collections.abc import Callable
from typing import Any

from .limits import _BYTES_PER_UNIT, _SAT, MAX_PATTERN_CHARS, MAX_REGEX_STATES
from .work import Work

# ---------------------------------------------------------------------------
# regular expressions: parsed once, generated constructively, matched without backtracking
# ---------------------------------------------------------------------------
# A client pattern is never run by Python's ``re`` matcher: a backtracking engine takes
# exponential time on patterns like ``^(a+)+$`` (issue 10: 22 s for three enum values).
# ``re``'s *parser* (syntax only, linear) gives the tree; strings are *generated* from it, and
# a string is *checked* by simulating a Thompson NFA built from the same tree: time linear in
# the text times the live states, metered by Work. Lookarounds, atomic groups and possessive
# quantifiers cannot be generated constructively (and are not ECMA-262 / JSON Schema regex
# anyway, except lookarounds): check() refuses them with a 400. Back-references are generated
# (the group's text is copied) but not matched: a generated string is trusted, others pass.

_MAXREPEAT = _sre_c.MAXREPEAT
_PATTERN_NESTING = 40  # groups inside groups; deeper is refused (and would recurse too deep)
_PATTERN_ATTEMPTS = 25  # candidates tried for a pattern plus minLength/maxLength
_DFA_ENTRIES = 1024  # cached NFA steps per pattern ...
_DFA_INTS = 4096  # ... and states they hold: at most ~300 KB per cached pattern

_ALNUM = string.ascii_lowercase + string.digits
_POOL = string.ascii_letters + string.digits + "-_. "
_CATEGORY_CHARS = {
    "CATEGORY_DIGIT": string.digits,
    "CATEGORY_NOT_DIGIT": string.ascii_letters,
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": _ALNUM,
    "CATEGORY_WORD": string.ascii_lowercase + string.digits + "_",
    "CATEGORY_NOT_WORD": " -.",
    "CATEGORY_LINEBREAK": "\n",
    "CATEGORY_NOT_LINEBREAK": _ALNUM,
}
_ONE_CHAR = (_sre_c.LITERAL, _sre_c.NOT_LITERAL, _sre_c.ANY, _sre_c.IN, _sre_c.CATEGORY)
_REPEATS = (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, _sre_c.POSSESSIVE_REPEAT)
_LOOKAROUND = ("lookahead and lookbehind assertions ((?=...), (?!...), (?<=...), (?<!...)) "
               "are not supported: llmsim cannot generate strings for them")
_ATOMIC = ("atomic groups and possessive quantifiers ((?>...), *+, ++, ?+) are not "
           "supported (they are not JSON Schema regular expressions)")
# global flags the matcher understands; (?i), (?a), (?L) and local flag groups are generated
# but not matched
_NFA_FLAGS = _sre_c.SRE_FLAG_UNICODE | _sre_c.SRE_FLAG_VERBOSE | _sre_c.SRE_FLAG_DOTALL \
    | _sre_c.SRE_FLAG_MULTILINE | _sre_c.SRE_FLAG_IGNORECASE


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


_CATEGORY_TEST: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdecimal(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": _is_word,
    "CATEGORY_NOT_WORD": lambda c: not _is_word(c),
    "CATEGORY_LINEBREAK": "\n".__eq__,
    "CATEGORY_NOT_LINEBREAK": "\n".__ne__,
}

# NFA instructions: (kind, a, b)
_CHAR, _SPLIT, _JMP, _ASSERT, _MATCH = range(5)


class _NoNFA(Exception):
    """Internal: the pattern has no (small enough) automaton; strings are not judged."""


def _variants(ch: str) -> tuple[str, ...]:
    """``ch`` and its simple case variants (what an IGNORECASE node compares)."""
    return (ch, ch.lower(), ch.upper())


def _set_test(items: Any, fold: bool = False) -> Callable[[str], bool]:
    negate = False
    lits: set[str] = set()
    ranges: list[tuple[int, int]] = []
    cats: list[Callable[[str], bool]] = []
    for op, av in items:
        if op is _sre_c.NEGATE:
            negate = True
        elif op is _sre_c.LITERAL:
            lits.add(chr(av))
        elif op is _sre_c.RANGE:
            ranges.append((av[0], av[1]))
        elif op is _sre_c.CATEGORY and av.name in _CATEGORY_TEST:
            cats.append(_CATEGORY_TEST[av.name])
        else:
            raise _NoNFA

    def member(ch: str) -> bool:
        hit = ch in lits
        if not hit and ranges:
            code = ord(ch)
            hit = any(lo <= code <= hi for lo, hi in ranges)
        if not hit and cats:
            hit = any(f(ch) for f in cats)
        return hit

    if fold:  # IGNORECASE: a variant in the set is a member (a negated set: none may be)
        return lambda ch: any(member(v) for v in _variants(ch)) != negate
    return lambda ch: member(ch) != negate


class _Regex:
    """One client pattern, analysed once (see :func:`_regex`).

    ``error``: why it is refused (syntax, size, nesting), else None; ``unsupported``: the
    construct check() refuses although generation can go on without it; ``min_len``: the
    length of the shortest string the generator emits (saturating); ``prog``: the NFA, or
    None when strings cannot be judged.
    """

    __slots__ = ("source", "tree", "error", "too_long", "unsupported", "min_len", "short",
                 "groups", "backrefs", "local_flags", "prog", "anchored", "multiline",
                 "asserts", "words", "dfa", "dfa_ints", "pools")

    def __init__(self, source: str) -> None:
        self.source = source
        self.tree: Any = None
        self.error: str | None = None
        self.too_long = False
        self.unsupported: str | None = None
        self.min_len = 0
        self.short: dict[int, int] = {}  # id(sequence) -> shortest emission
        self.groups: dict[int, int] = {}  # group number -> shortest emission
        self.backrefs = False
        self.local_flags = False
        self.prog: list[tuple[int, Any, Any]] | None = None
        self.anchored = False
        self.multiline = False
        self.asserts = False  # the program has anchors: positions need a context
        self.words = False  # ... and word boundaries
        self.dfa: dict[tuple[frozenset[int], str, int], frozenset[int]] = {}
        self.dfa_ints = 0  # states held by the cache (bounded: _DFA_INTS)
        self.pools: dict[int, str] = {}  # id(node) -> characters the emitter draws from
        if len(source) > MAX_PATTERN_CHARS:
            self.too_long = True
            self.error = (f"is {len(source)} characters long; llmsim accepts patterns of at "
                          f"most {MAX_PATTERN_CHARS}")
            return
        try:
            tree = _sre_parse.parse(source)
        except RecursionError:
            self.error = f"nests groups more than {_PATTERN_NESTING} levels deep"
            return
        except Exception as exc:  # re.error, OverflowError for a huge {n}, ...
            self.error = f"is not a valid regular expression: {exc}"
            return
        try:
            self.min_len = self._scan(tree, 0)
        except _NoNFA:
            self.error = f"nests groups more than {_PATTERN_NESTING} levels deep"
            return
        self.tree = tree
        flags = tree.state.flags
        self.multiline = bool(flags & _sre_c.SRE_FLAG_MULTILINE)
        first = tree[0] if len(tree) else None
        self.anchored = (first is not None and first[0] is _sre_c.AT and not self.multiline
                         and first[1] in (_sre_c.AT_BEGINNING, _sre_c.AT_BEGINNING_STRING))
        if self.unsupported is None and not self.backrefs and not self.local_flags \
                and not flags & ~_NFA_FLAGS:
            try:
                self.prog = self._compile(bool(flags & _sre_c.SRE_FLAG_DOTALL),
                                          bool(flags & _sre_c.SRE_FLAG_IGNORECASE))
            except _NoNFA:
                self.prog = None

    # -- analysis ----------------------------------------------------------

    def _scan(self, seq: Any, depth: int) -> int:
        """Shortest emission of ``seq``; records constructs and per-branch lengths."""
        if depth > _PATTERN_NESTING:
            raise _NoNFA
        total = 0
        for op, av in seq:
            if op in _ONE_CHAR:
                n = 1
            elif op is _sre_c.BRANCH:
                n = min(self._scan(alt, depth + 1) for alt in av[1])
            elif op is _sre_c.SUBPATTERN:
                group, add, rem, sub = av
                n = self._scan(sub, depth + 1)
                if add or rem:
                    self.local_flags = True
                if group is not None:
                    self.groups[group] = n
            elif op in _REPEATS:
                lo, _hi, sub = av
                n = min(lo * self._scan(sub, depth + 1), _SAT)
                if op is _sre_c.POSSESSIVE_REPEAT:
                    self.unsupported = self.unsupported or _ATOMIC
            elif op is _sre_c.AT:
                n = 0
            elif op is _sre_c.GROUPREF:
                n = self.groups.get(av, 0)
                self.backrefs = True
            elif op is _sre_c.GROUPREF_EXISTS:
                _group, yes, no = av
                n = min(self._scan(yes, depth + 1),
                        self._scan(no, depth + 1) if no is not None else 0)
                self.backrefs = True
            elif op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
                self._scan(av[1], depth + 1)
                n = 0
                self.unsupported = self.unsupported or _LOOKAROUND
            elif op is _sre_c.ATOMIC_GROUP:
                n = self._scan(av, depth + 1)
                self.unsupported = self.unsupported or _ATOMIC
            else:  # pragma: no cover - a node this parser version adds
                n = 0
                self.unsupported = self.unsupported or f"the construct {op} is not supported"
            total = min(total + n, _SAT)
        self.short[id(seq)] = total
        return total

    # -- matching ----------------------------------------------------------

    def _compile(self, dotall: bool, fold: bool = False) -> list[tuple[int, Any, Any]]:
        prog: list[tuple[int, Any, Any]] = []
        hole = (_JMP, -1, None)  # placeholder patched below

        def seq(items: Any) -> None:
            for op, av in items:
                one(op, av)
                if len(prog) > MAX_REGEX_STATES:
                    raise _NoNFA

        def one(op: Any, av: Any) -> None:
            if op is _sre_c.LITERAL and fold:
                forms = frozenset(_variants(chr(av)))
                prog.append((_CHAR, lambda c: not forms.isdisjoint(_variants(c)), None))
            elif op is _sre_c.NOT_LITERAL and fold:
                forms_n = frozenset(_variants(chr(av)))
                prog.append((_CHAR, lambda c: forms_n.isdisjoint(_variants(c)), None))
            elif op is _sre_c.LITERAL:
                prog.append((_CHAR, chr(av).__eq__, None))
            elif op is _sre_c.NOT_LITERAL:
                prog.append((_CHAR, chr(av).__ne__, None))
            elif op is _sre_c.ANY:
                prog.append((_CHAR, (lambda c: True) if dotall else "\n".__ne__, None))
            elif op is _sre_c.IN:
                prog.append((_CHAR, _set_test(av, fold), None))
            elif op is _sre_c.CATEGORY and av.name in _CATEGORY_TEST:
                prog.append((_CHAR, _CATEGORY_TEST[av.name], None))
            elif op is _sre_c.BRANCH:
                alts = av[1]
                jumps = []
                for i, alt in enumerate(alts):
                    if i == len(alts) - 1:
                        seq(alt)
                        break
                    split = len(prog)
                    prog.append(hole)
                    seq(alt)
                    jumps.append(len(prog))
                    prog.append(hole)
                    prog[split] = (_SPLIT, split + 1, len(prog))
                for j in jumps:
                    prog[j] = (_JMP, len(prog), None)
            elif op is _sre_c.SUBPATTERN:
                seq(av[3])
            elif op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
                lo, hi, sub = av
                start = len(prog)
                if lo:
                    seq(sub)
                    if len(prog) == start:  # an empty body: no copies needed
                        return
                    if (lo - 1) * (len(prog) - start) > MAX_REGEX_STATES:
                        raise _NoNFA
                    for _ in range(lo - 1):
                        seq(sub)
                if hi == _MAXREPEAT:
                    loop = len(prog)
                    prog.append(hole)
                    seq(sub)
                    prog.append((_JMP, loop, None))
                    prog[loop] = (_SPLIT, loop + 1, len(prog))
                elif hi > lo:
                    if hi - lo > MAX_REGEX_STATES:
                        raise _NoNFA
                    splits = []
                    for _ in range(hi - lo):
                        splits.append(len(prog))
                        prog.append(hole)
                        seq(sub)
                    for sp in splits:
                        prog[sp] = (_SPLIT, sp + 1, len(prog))
            elif op is _sre_c.AT:
                prog.append((_ASSERT, av, None))
                self.asserts = True
                if av in (_sre_c.AT_BOUNDARY, _sre_c.AT_NON_BOUNDARY):
                    self.words = True
            else:
                raise _NoNFA

        seq(self.tree)
        prog.append((_MATCH, None, None))
        return prog

    def _ctx(self, text: str, pos: int) -> int:
        """What the anchors at ``pos`` can see, as bits (0 when the program has none)."""
        if not self.asserts:
            return 0
        n = len(text)
        ctx = (pos == 0) | (pos == n) << 1 | (pos == n - 1 and text[pos] == "\n") << 2
        if self.words:
            ctx |= (pos > 0 and _is_word(text[pos - 1])) << 3
            ctx |= (pos < n and _is_word(text[pos])) << 4
        if self.multiline:
            ctx |= (pos > 0 and text[pos - 1] == "\n") << 5
            ctx |= (pos < n and text[pos] == "\n") << 6
        return ctx

    def _holds(self, at: Any, ctx: int) -> bool:
        if at is _sre_c.AT_BEGINNING:
            return bool(ctx & 1 or ctx & 32)
        if at is _sre_c.AT_BEGINNING_STRING:
            return bool(ctx & 1)
        if at is _sre_c.AT_END:
            return bool(ctx & 2 or ctx & 4 or ctx & 64)
        if at is _sre_c.AT_END_STRING:
            return bool(ctx & 2)
        if at is _sre_c.AT_BOUNDARY:
            return bool(ctx & 8) != bool(ctx & 16)
        if at is _sre_c.AT_NON_BOUNDARY:
            return bool(ctx & 8) == bool(ctx & 16) and ctx & 3 != 3  # never in ""
        return True  # pragma: no cover - other anchors only exist after re's compiler

    def _move(self, cur: frozenset[int], ch: str | None, ctx: int, start: bool) -> frozenset[int]:
        """The states after reading ``ch`` from ``cur`` (None: the initial states), closed
        over jumps and the anchors that hold in ``ctx``; ``start`` adds a match starting
        here (``re.search``)."""
        prog = self.prog
        assert prog is not None
        stack = [pc + 1 for pc in cur if prog[pc][0] == _CHAR and prog[pc][1](ch)] \
            if ch is not None else []
        if start:
            stack.append(0)
        out: set[int] = set()
        while stack:
            pc = stack.pop()
            if pc in out:
                continue
            out.add(pc)
            kind, a, b = prog[pc]
            if kind == _SPLIT:
                stack.append(b)
                stack.append(a)
            elif kind == _JMP:
                stack.append(a)
            elif kind == _ASSERT and self._holds(a, ctx):
                stack.append(pc + 1)
        return frozenset(out)

    def search(self, text: str, work: Work) -> bool | None:
        """``re.search`` semantics in linear time (a Thompson NFA whose steps are cached as a
        small DFA): True/False, or None when this pattern cannot be judged."""
        if self.prog is None:
            return None
        accept = len(self.prog) - 1
        again = not self.anchored
        dfa = self.dfa
        cur = self._move(frozenset(), None, self._ctx(text, 0), True)
        spent = 0
        for pos, ch in enumerate(text):
            if accept in cur:
                break
            ctx = self._ctx(text, pos + 1)
            key = (cur, ch, ctx)
            nxt = dfa.get(key)
            if nxt is None:
                spent += 2 + len(cur)
                nxt = self._move(cur, ch, ctx, again)
                if len(dfa) < _DFA_ENTRIES and self.dfa_ints + len(nxt) <= _DFA_INTS:
                    dfa[key] = nxt
                    self.dfa_ints += len(nxt)
            else:
                spent += 1
            if spent > 256:
                work.spend(spent)
                spent = 0
            cur = nxt
            if not cur:
                break
        work.spend(spent)
        return accept in cur


@functools.lru_cache(maxsize=128)
def _regex(pattern: str) -> _Regex:
    """The analysis of ``pattern`` (bounded cache: a pattern is usually seen many times)."""
    return _Regex(pattern)


def _pattern_search(pattern: str, text: str, work: Work) -> bool | None:
    rx = _regex(pattern)
    return None if rx.error is not None else rx.search(text, work)


class _RegexEmitter:
    """Walks a parsed pattern and emits a string, constructively (no backtracking).

    Repetitions take ``lo`` to ``lo + 3`` copies and branches are drawn at random until the
    output passes ``soft`` characters; after that ``lo`` copies and the shortest branch, so
    the output stays near the pattern's minimum length. Every step is paid from ``work``.
    """

    def __init__(self, rx: _Regex, rng: random.Random, work: Work, soft: int) -> None:
        self.rx = rx
        self.rng = rng
        self.work = work
        self.soft = soft
        self.size = 0
        self.groups: dict[int, str] = {}

    def _pool(self, op: Any, av: Any) -> str:
        """The characters a one-character node draws from (cached on the pattern)."""
        key = id(av) if op is _sre_c.IN else hash((op, av))
        pool = self.rx.pools.get(key)
        if pool is None:
            pool = self.rx.pools[key] = self._make_pool(op, av)
        return pool

    @staticmethod
    def _make_pool(op: Any, av: Any) -> str:
        if op is _sre_c.LITERAL:
            return chr(av)
        if op is _sre_c.NOT_LITERAL:
            return "".join(c for c in _ALNUM if ord(c) != av)
        if op is _sre_c.ANY:
            return string.ascii_lowercase
        if op is _sre_c.CATEGORY:
            return _CATEGORY_CHARS.get(av.name, _ALNUM)
        items = list(av)  # IN
        if items and items[0][0] is _sre_c.NEGATE:
            return "".join(c for c in _POOL if not _RegexEmitter._set_matches(items[1:], c)) \
                or "~"
        chars: list[str] = []
        for iop, iav in items:
            if iop is _sre_c.LITERAL:
                chars.append(chr(iav))
            elif iop is _sre_c.RANGE:
                lo, hi = iav
                if lo <= ord("a") and hi >= ord("z"):  # prefer readable ASCII in wide ranges
                    chars.append(string.ascii_lowercase)
                else:
                    chars.extend(map(chr, range(lo, min(hi, lo + 200) + 1)))
            elif iop is _sre_c.CATEGORY:
                chars.append(_CATEGORY_CHARS.get(iav.name, _ALNUM))
        return "".join(dict.fromkeys("".join(chars))) or _ALNUM

    @staticmethod
    def _set_matches(items: list, char: str) -> bool:
        code = ord(char)
        for op, av in items:
            name = op.name
            if name == "LITERAL" and code == av:
                return True
            if name == "RANGE" and av[0] <= code <= av[1]:
                return True
            if name == "CATEGORY" and char in _CATEGORY_CHARS.get(av.name, ""):
                return True
        return False

    def emit(self, parsed: Any) -> str:
        self.work.spend(1 + len(parsed) // 2)
        out: list[str] = []
        for op, av in parsed:
            if op in _ONE_CHAR:
                out.append(self.rng.choice(self._pool(op, av)))
                self.size += 1
            elif op is _sre_c.BRANCH:
                alts = av[1]
                if self.size > self.soft:
                    alt = min(alts, key=lambda a: self.rx.short.get(id(a), 0))
                else:
                    alt = self.rng.choice(alts)
                out.append(self.emit(alt))
            elif op is _sre_c.SUBPATTERN:
                group, _add, _del, sub = av
                text = self.emit(sub)
                if group is not None:
                    self.groups[group] = text
                out.append(text)
            elif op is _sre_c.ATOMIC_GROUP:
                out.append(self.emit(av))
            elif op in _REPEATS:
                lo, hi, sub = av
                if self.size > self.soft:
                    count = lo
                else:
                    upper = lo + 3 if hi == _MAXREPEAT else min(hi, lo + 3)
                    count = self.rng.randint(lo, max(lo, upper))
                # paid before producing anything, so a huge {n} stops here
                self.work.spend(1 + count // _BYTES_PER_UNIT)
                if len(sub) == 1 and sub[0][0] in _ONE_CHAR:
                    out.append("".join(self.rng.choices(self._pool(*sub[0]), k=count)))
                    self.size += count
                else:
                    out.extend(self.emit(sub) for _ in range(count))
            elif op is _sre_c.GROUPREF:
                text = self.groups.get(av, "")
                self.work.spend(1 + len(text) // _BYTES_PER_UNIT)
                self.size += len(text)
                out.append(text)
            elif op is _sre_c.GROUPREF_EXISTS:
                group, yes, no = av
                branch = yes if group in self.groups else no
                if branch is not None:
                    out.append(self.emit(branch))
            # AT (anchors), ASSERT, ASSERT_NOT: emit nothing
        return "".join(out)


def _string_from_pattern(pattern: str, rng: random.Random, min_len: int, max_len: int | None,
                         work: Work) -> str | None:
    """Try to produce a string matching ``pattern`` (``re.search`` semantics)."""
    rx = _regex(pattern)
    if rx.tree is None:
        return None
    soft = max(64, min_len)
    fallback: str | None = None
    for _ in range(_PATTERN_ATTEMPTS):
        candidate = _RegexEmitter(rx, rng, work, soft).emit(rx.tree)
        if rx.search(candidate, work) is False:
            continue
        if len(candidate) >= min_len and (max_len is None or len(candidate) <= max_len):
            return candidate
        if fallback is None:
            fallback = candidate
    return fallback
