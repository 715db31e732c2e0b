"""JSON Schema driven value generation and validation.

Pure helpers (stdlib only, no I/O) used by the simulator to fabricate tool-call
arguments and structured outputs that conform to the JSON Schema subset used by
OpenAI function tools and ``response_format: json_schema``.

Public API:

* :func:`generate` - produce a JSON-serialisable value valid against a schema.
* :func:`generate_tool_arguments` - like :func:`generate` but always a ``dict``.
* :func:`validate` - a small validator for the same subset; returns error strings.

All randomness comes from the ``random.Random`` passed in, so the same schema and
the same RNG state always give the same value.
"""

from __future__ import annotations

import copy
import datetime as _dt
import ipaddress
import math
import random
import re
import string
import uuid
from typing import Any
from urllib.parse import unquote

__all__ = ["generate", "generate_tool_arguments", "validate"]

_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud "
    "exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure "
    "in reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur sint "
    "occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est "
    "laborum"
).split()

_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
# Preference order when we must stop recursing: cheapest values first.
_MINIMAL_TYPE_ORDER = ("null", "boolean", "integer", "number", "string", "array", "object")

_OBJECT_KEYS = (
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "minProperties",
    "maxProperties",
)
_ARRAY_KEYS = ("items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems")
_STRING_KEYS = ("minLength", "maxLength", "pattern", "format")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")

_MAX_FLATTEN_STEPS = 64
_HARD_DEPTH_SLACK = 20
_NODE_BUDGET = 20000
_TOP_LEVEL_ATTEMPTS = 3
_ONEOF_ATTEMPTS = 5


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    """True for JSON numbers (ints and floats, but not bools)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    """Name of the JSON type of ``value`` (or the Python type name if not JSON)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_type(value: Any, type_name: str) -> bool:
    """JSON Schema type check (``integer`` accepts integral floats, bools are not numbers)."""
    if type_name == "null":
        return value is None
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, int):
            return True
        return isinstance(value, float) and math.isfinite(value) and value.is_integer()
    if type_name == "number":
        return _is_number(value)
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "array":
        return isinstance(value, list)
    if type_name == "object":
        return isinstance(value, dict)
    return True  # unknown type names are not enforced


def _json_equal(a: Any, b: Any) -> bool:
    """Equality with JSON semantics (``1 == 1.0`` but ``True != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _contains_json(items: list[Any], value: Any) -> bool:
    return any(_json_equal(value, item) for item in items)


def _type_list(schema: dict) -> list[str] | None:
    """The declared ``type`` as a list (None if absent), honouring ``nullable``."""
    raw = schema.get("type")
    if raw is None:
        return None
    types = [raw] if isinstance(raw, str) else [t for t in raw if isinstance(t, str)]
    if schema.get("nullable") is True and "null" not in types:
        types.append("null")
    return types


def _resolve_pointer(root: Any, ref: str) -> tuple[bool, Any]:
    """Resolve a local ``$ref`` (``#``, ``#/$defs/x``, ``#/definitions/x``...).

    Returns ``(found, target)``.
    """
    if not isinstance(ref, str) or not ref.startswith("#"):
        return False, None
    fragment = unquote(ref[1:])
    if fragment == "":
        return True, root
    if not fragment.startswith("/"):
        return False, None
    node = root
    for raw_token in fragment[1:].split("/"):
        token = raw_token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False, None
    return True, node


_INF_COST = 10**6


class _CostEstimator:
    """Estimates how deep the *smallest* instance of a schema must nest.

    Used to pick branches that terminate when a recursive schema hits ``max_depth``:
    ``0`` for scalars/null, ``1 + max(required children)`` for objects and
    non-empty arrays, ``min`` over ``anyOf``/``oneOf``/type choices and
    "infinite" for a ``$ref`` cycle that cannot be escaped.
    """

    def __init__(self, root: Any) -> None:
        self.root = root
        self.budget = 0
        self.cache: dict[int, tuple[Any, int]] = {}

    def score(self, schema: Any) -> int:
        cached = self.cache.get(id(schema))
        if cached is not None and cached[0] is schema:
            return cached[1]
        self.budget = 5000
        value = self._cost(schema, frozenset())
        self.cache[id(schema)] = (schema, value)  # keep a reference so ids stay unique
        return value

    def _cost(self, schema: Any, visiting: frozenset[str]) -> int:
        self.budget -= 1
        if self.budget <= 0:
            return 0
        if schema is True or schema is None:
            return 0
        if not isinstance(schema, dict):
            return _INF_COST
        costs: list[int] = []
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in visiting:
                return _INF_COST
            found, target = _resolve_pointer(self.root, ref)
            costs.append(self._cost(target, visiting | {ref}) if found else 0)
        if "const" in schema or (isinstance(schema.get("enum"), list) and schema["enum"]):
            return max(costs, default=0)
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                costs.append(min(self._cost(b, visiting) for b in branches))
        parts = schema.get("allOf")
        if isinstance(parts, list):
            costs.extend(self._cost(p, visiting) for p in parts)
        costs.append(self._own_cost(schema, visiting))
        return max(costs)

    def _own_cost(self, schema: dict, visiting: frozenset[str]) -> int:
        types = _type_list(schema)
        if types is None:
            if any(k in schema for k in _OBJECT_KEYS):
                types = ["object"]
            elif any(k in schema for k in _ARRAY_KEYS):
                types = ["array"]
            else:
                return 0
        if any(t not in ("object", "array") for t in types):
            return 0
        best = _INF_COST
        if "object" in types:
            props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
            required = schema.get("required") if isinstance(schema.get("required"), list) else []
            child = max((self._cost(props.get(r, True), visiting) for r in required), default=0)
            best = min(best, 1 + child)
        if "array" in types:
            min_items = schema.get("minItems")
            if _is_number(min_items) and min_items > 0:
                prefix = schema.get("prefixItems")
                items = schema.get("items", True)
                if isinstance(prefix, list) and prefix:
                    child = max(self._cost(p, visiting) for p in prefix[: int(min_items)])
                    if min_items > len(prefix):
                        child = max(child, self._cost(items, visiting))
                else:
                    child = self._cost(items if isinstance(items, (dict, bool)) else True, visiting)
                best = min(best, 1 + child)
            else:
                best = min(best, 1)
        return min(best, _INF_COST)


def _number_bounds(schema: dict) -> tuple[Any, bool, Any, bool]:
    """Return ``(lo, lo_exclusive, hi, hi_exclusive)`` from the numeric keywords.

    Supports both the 2020-12 numeric ``exclusiveMinimum`` and the draft-4 boolean form.
    """
    lo: Any = None
    lo_ex = False
    hi: Any = None
    hi_ex = False
    mn, mx = schema.get("minimum"), schema.get("maximum")
    emn, emx = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(emn, bool):
        if emn and _is_number(mn):
            lo, lo_ex = mn, True
    elif _is_number(emn):
        lo, lo_ex = emn, True
    if _is_number(mn) and (lo is None or mn > lo):
        lo, lo_ex = mn, False
    if isinstance(emx, bool):
        if emx and _is_number(mx):
            hi, hi_ex = mx, True
    elif _is_number(emx):
        hi, hi_ex = emx, True
    if _is_number(mx) and (hi is None or mx < hi):
        hi, hi_ex = mx, False
    return lo, lo_ex, hi, hi_ex


def _is_multiple(value: float | int, divisor: float | int) -> bool:
    """Strict ``multipleOf`` check (same arithmetic as common validators)."""
    if isinstance(divisor, float) or isinstance(value, float):
        try:
            quotient = value / divisor
            return math.isfinite(quotient) and int(quotient) == quotient
        except (OverflowError, ZeroDivisionError):
            return False
    return value % divisor == 0


def _is_multiple_lenient(value: float | int, divisor: float | int) -> bool:
    """``multipleOf`` check tolerant of binary floating point noise."""
    if _is_multiple(value, divisor):
        return True
    try:
        quotient = value / divisor
    except (OverflowError, ZeroDivisionError):
        return False
    if not math.isfinite(quotient):
        return False
    return abs(quotient - round(quotient)) <= 1e-9 * max(1.0, abs(quotient))


# ---------------------------------------------------------------------------
# schema merging (used for allOf, $ref siblings and anyOf/oneOf branch selection)
# ---------------------------------------------------------------------------

_MIN_KEYS = ("minimum", "minLength", "minItems", "minProperties", "minContains")
_MAX_KEYS = ("maximum", "maxLength", "maxItems", "maxProperties", "maxContains")
_DEFERRED_KEYS = ("$ref", "anyOf", "oneOf")


def _normalise(schema: Any) -> Any:
    """Fold ``nullable: true`` into the ``type`` list (shallow copy)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("nullable") is True and "type" in out:
        out["type"] = _type_list(out)
        del out["nullable"]
    return out


def _merge_sub(a: Any, b: Any) -> Any:
    """Merge two subschemas (which may be booleans)."""
    if a is True or a is None:
        return b
    if b is True or b is None:
        return a
    if a is False or b is False:
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return _merge(a, b)
    return a


def _merge(a: Any, b: Any) -> Any:
    """Conjunction of two schemas, best effort (the result should accept only
    instances valid against both).  Combinators that collide are deferred into
    ``allOf`` so the generator can process them one at a time."""
    if a is True or a is None:
        return _normalise(b) if isinstance(b, dict) else b
    if b is True or b is None:
        return a
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a if isinstance(a, dict) else b
    a = _normalise(a)
    b = _normalise(b)
    out = dict(a)
    for key, bv in b.items():
        if key not in out:
            out[key] = bv
            continue
        av = out[key]
        if key == "type":
            a_types = [av] if isinstance(av, str) else list(av)
            b_types = [bv] if isinstance(bv, str) else list(bv)
            merged = [t for t in a_types if t in b_types]
            if "integer" in a_types and "number" in b_types and "integer" not in merged:
                merged.append("integer")
            if "number" in a_types and "integer" in b_types and "integer" not in merged:
                merged.append("integer")
            if merged:
                out[key] = merged[0] if len(merged) == 1 else merged
        elif key == "properties" and isinstance(av, dict) and isinstance(bv, dict):
            props = dict(av)
            for name, sub in bv.items():
                props[name] = _merge_sub(props[name], sub) if name in props else sub
            out[key] = props
        elif key == "patternProperties" and isinstance(av, dict) and isinstance(bv, dict):
            pats = dict(av)
            for name, sub in bv.items():
                pats[name] = _merge_sub(pats[name], sub) if name in pats else sub
            out[key] = pats
        elif key == "required" and isinstance(av, list) and isinstance(bv, list):
            out[key] = list(av) + [r for r in bv if r not in av]
        elif key == "enum" and isinstance(av, list) and isinstance(bv, list):
            both = [x for x in av if _contains_json(bv, x)]
            out[key] = both if both else av
        elif key in _MIN_KEYS and _is_number(av) and _is_number(bv):
            out[key] = max(av, bv)
        elif key in _MAX_KEYS and _is_number(av) and _is_number(bv):
            out[key] = min(av, bv)
        elif key == "exclusiveMinimum" and _is_number(av) and _is_number(bv):
            out[key] = max(av, bv)
        elif key == "exclusiveMaximum" and _is_number(av) and _is_number(bv):
            out[key] = min(av, bv)
        elif key == "multipleOf" and _is_number(av) and _is_number(bv):
            if isinstance(av, int) and isinstance(bv, int) and av > 0 and bv > 0:
                out[key] = av * bv // math.gcd(av, bv)
            elif _is_multiple_lenient(av, bv):
                out[key] = av
            elif _is_multiple_lenient(bv, av):
                out[key] = bv
        elif key in ("items", "additionalProperties", "contains", "additionalItems"):
            out[key] = _merge_sub(av, bv)
        elif key == "prefixItems" and isinstance(av, list) and isinstance(bv, list):
            longest = max(len(av), len(bv))
            out[key] = [
                _merge_sub(av[i] if i < len(av) else True, bv[i] if i < len(bv) else True)
                for i in range(longest)
            ]
        elif key == "uniqueItems":
            out[key] = bool(av) or bool(bv)
        elif key == "allOf" and isinstance(av, list) and isinstance(bv, list):
            out[key] = list(av) + list(bv)
        elif key in _DEFERRED_KEYS:
            out["allOf"] = list(out.get("allOf") or []) + [{key: bv}]
        elif key == "not":
            out[key] = {"anyOf": [av, bv]}
        # anything else (const, pattern, format, description, ...): keep a's value
    # additionalProperties: false on one side restricts the other side's properties.
    for side in (a, b):
        if side.get("additionalProperties") is False and isinstance(out.get("properties"), dict):
            allowed = side.get("properties") or {}
            out["properties"] = {k: v for k, v in out["properties"].items() if k in allowed}
    return out


# ---------------------------------------------------------------------------
# regex-driven string generation (best effort)
# ---------------------------------------------------------------------------

try:  # pragma: no cover - import guard
    import re._constants as _sre_c
    import re._parser as _sre_parse

    _MAXREPEAT = _sre_c.MAXREPEAT
except Exception:  # pragma: no cover - very old/odd interpreters
    _sre_parse = None  # type: ignore[assignment]
    _MAXREPEAT = 65535

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


class _RegexEmitter:
    """Walks a parsed ``re`` pattern and emits a (hopefully) matching string."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.groups: dict[int, str] = {}

    def _char_in_set(self, items: list) -> str:
        negate = bool(items) and items[0][0].name == "NEGATE"
        if negate:
            candidates = [c for c in _POOL if not self._set_matches(items[1:], c)]
            return self.rng.choice(candidates) if candidates else "~"
        op, av = self.rng.choice(items)
        name = op.name
        if name == "LITERAL":
            return chr(av)
        if name == "RANGE":
            lo, hi = av
            # Prefer readable ASCII inside wide ranges.
            if lo <= ord("a") and hi >= ord("z"):
                return self.rng.choice(string.ascii_lowercase)
            return chr(self.rng.randint(lo, min(hi, lo + 200)))
        if name == "CATEGORY":
            return self.rng.choice(_CATEGORY_CHARS.get(av.name, _ALNUM))
        return self.rng.choice(_ALNUM)

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
        out: list[str] = []
        for op, av in parsed:
            name = op.name
            if name == "LITERAL":
                out.append(chr(av))
            elif name == "NOT_LITERAL":
                out.append(self.rng.choice([c for c in _ALNUM if ord(c) != av]))
            elif name == "ANY":
                out.append(self.rng.choice(string.ascii_lowercase))
            elif name == "IN":
                out.append(self._char_in_set(list(av)))
            elif name == "CATEGORY":
                out.append(self.rng.choice(_CATEGORY_CHARS.get(av.name, _ALNUM)))
            elif name == "BRANCH":
                out.append(self.emit(self.rng.choice(av[1])))
            elif name == "SUBPATTERN":
                group, _add, _del, sub = av
                text = self.emit(sub)
                if group is not None:
                    self.groups[group] = text
                out.append(text)
            elif name == "ATOMIC_GROUP":
                out.append(self.emit(av))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, hi, sub = av
                upper = lo + 3 if hi == _MAXREPEAT else min(hi, lo + 3)
                count = self.rng.randint(lo, max(lo, upper))
                out.extend(self.emit(sub) for _ in range(count))
            elif name == "GROUPREF":
                out.append(self.groups.get(av, ""))
            elif name == "GROUPREF_EXISTS":
                group, yes, no = av
                branch = yes if group in self.groups else no
                if branch is not None:
                    out.append(self.emit(branch))
            # AT (anchors), ASSERT, ASSERT_NOT, ...: emit nothing
        return "".join(out)


def _string_from_pattern(
    pattern: str, rng: random.Random, min_len: int, max_len: int | None
) -> str | None:
    """Try to produce a string matching ``pattern`` (``re.search`` semantics)."""
    if _sre_parse is None:
        return None
    try:
        compiled = re.compile(pattern)
        parsed = _sre_parse.parse(pattern)
    except Exception:
        return None
    fallback: str | None = None
    for _ in range(25):
        try:
            candidate = _RegexEmitter(rng).emit(parsed)
        except Exception:
            return fallback
        if compiled.search(candidate) is None:
            continue
        if len(candidate) >= min_len and (max_len is None or len(candidate) <= max_len):
            return candidate
        if fallback is None:
            fallback = candidate
    return fallback


# ---------------------------------------------------------------------------
# validator
# ---------------------------------------------------------------------------

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME_RE = re.compile(r"^\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_DATETIME_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+$")
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:\S*$")
_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def _format_ok(fmt: str, value: str) -> bool:
    """Lenient checks for the formats we generate; unknown formats always pass."""
    try:
        if fmt == "date":
            if not _DATE_RE.match(value):
                return False
            _dt.date.fromisoformat(value)
            return True
        if fmt == "date-time":
            if not _DATETIME_RE.match(value):
                return False
            _dt.date.fromisoformat(value[:10])
            return True
        if fmt == "time":
            return bool(_TIME_RE.match(value))
        if fmt in ("email", "idn-email"):
            return bool(_EMAIL_RE.match(value))
        if fmt in ("uri", "iri"):
            return bool(_URI_RE.match(value))
        if fmt == "uuid":
            return bool(_UUID_RE.match(value))
        if fmt == "ipv4":
            ipaddress.IPv4Address(value)
            return True
        if fmt == "ipv6":
            ipaddress.IPv6Address(value)
            return True
        if fmt == "hostname":
            return bool(_HOSTNAME_RE.match(value))
    except ValueError:
        return False
    return True


class _Validator:
    """Validator for the supported subset, resolving local ``$ref`` against ``root``."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._active_refs: set[tuple[str, str]] = set()

    def errors(self, inst: Any, schema: Any, path: str = "$") -> list[str]:
        if schema is True or schema is None:
            return []
        if schema is False:
            return [f"{path}: no value is allowed here (schema is false)"]
        if not isinstance(schema, dict):
            return []
        errs: list[str] = []

        ref = schema.get("$ref")
        if isinstance(ref, str):
            found, target = _resolve_pointer(self.root, ref)
            if not found:
                errs.append(f"{path}: unresolvable $ref {ref!r}")
            else:
                key = (ref, path)
                if key not in self._active_refs:
                    self._active_refs.add(key)
                    try:
                        errs.extend(self.errors(inst, target, path))
                    finally:
                        self._active_refs.discard(key)

        is_null_ok = inst is None and schema.get("nullable") is True
        types = _type_list(schema)
        if types is not None and not is_null_ok:
            if not any(_is_type(inst, t) for t in types):
                expected = " or ".join(types) if types else "(no type)"
                errs.append(f"{path}: expected {expected}, got {_json_type(inst)}")
                return errs  # further keyword errors would just be noise

        if "enum" in schema and isinstance(schema["enum"], list) and not is_null_ok:
            if not _contains_json(schema["enum"], inst):
                errs.append(f"{path}: {inst!r} is not one of {schema['enum']!r}")
        if "const" in schema and not _json_equal(inst, schema["const"]):
            errs.append(f"{path}: expected constant {schema['const']!r}, got {inst!r}")

        if isinstance(inst, str):
            errs.extend(self._string_errors(inst, schema, path))
        elif _is_number(inst):
            errs.extend(self._number_errors(inst, schema, path))
        elif isinstance(inst, dict):
            errs.extend(self._object_errors(inst, schema, path))
        elif isinstance(inst, list):
            errs.extend(self._array_errors(inst, schema, path))
        elif inst is not None and not isinstance(inst, bool):
            errs.append(f"{path}: value of type {type(inst).__name__} is not JSON")

        errs.extend(self._combinator_errors(inst, schema, path))
        return errs

    def _combinator_errors(self, inst: Any, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            for sub in all_of:
                errs.extend(self.errors(inst, sub, path))
        any_of = schema.get("anyOf")
        if isinstance(any_of, list):
            if not any(not self.errors(inst, sub, path) for sub in any_of):
                errs.append(f"{path}: does not match any anyOf branch")
        one_of = schema.get("oneOf")
        if isinstance(one_of, list):
            matches = sum(1 for sub in one_of if not self.errors(inst, sub, path))
            if matches != 1:
                errs.append(f"{path}: matches {matches} oneOf branches (expected exactly 1)")
        if "not" in schema and not self.errors(inst, schema["not"], path):
            errs.append(f"{path}: must not match the 'not' schema")
        if "if" in schema:
            branch = "then" if not self.errors(inst, schema["if"], path) else "else"
            if branch in schema:
                errs.extend(self.errors(inst, schema[branch], path))
        return errs

    def _string_errors(self, inst: str, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        min_len, max_len = schema.get("minLength"), schema.get("maxLength")
        if _is_number(min_len) and len(inst) < min_len:
            errs.append(f"{path}: string shorter than minLength {min_len}")
        if _is_number(max_len) and len(inst) > max_len:
            errs.append(f"{path}: string longer than maxLength {max_len}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:
                if re.search(pattern, inst) is None:
                    errs.append(f"{path}: {inst!r} does not match pattern {pattern!r}")
            except re.error:
                pass  # pattern not expressible in Python's dialect; cannot judge
        fmt = schema.get("format")
        if isinstance(fmt, str) and not _format_ok(fmt, inst):
            errs.append(f"{path}: {inst!r} is not a valid {fmt}")
        return errs

    def _number_errors(self, inst: float | int, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        lo, lo_ex, hi, hi_ex = _number_bounds(schema)
        if lo is not None and (inst < lo or (lo_ex and inst == lo)):
            op = ">" if lo_ex else ">="
            errs.append(f"{path}: {inst} is not {op} {lo}")
        if hi is not None and (inst > hi or (hi_ex and inst == hi)):
            op = "<" if hi_ex else "<="
            errs.append(f"{path}: {inst} is not {op} {hi}")
        mult = schema.get("multipleOf")
        if _is_number(mult) and mult > 0 and not _is_multiple_lenient(inst, mult):
            errs.append(f"{path}: {inst} is not a multiple of {mult}")
        return errs

    def _object_errors(self, inst: dict, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        for key in inst:
            if not isinstance(key, str):
                errs.append(f"{path}: object key {key!r} is not a string")
        required = schema.get("required")
        if isinstance(required, list):
            for name in required:
                if name not in inst:
                    errs.append(f"{path}: missing required property {name!r}")
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        pattern_props = schema.get("patternProperties")
        if not isinstance(pattern_props, dict):
            pattern_props = {}
        additional = schema.get("additionalProperties", True)
        for key, value in inst.items():
            sub_path = f"{path}.{key}"
            matched = False
            if key in props:
                matched = True
                errs.extend(self.errors(value, props[key], sub_path))
            for pat, sub in pattern_props.items():
                try:
                    hit = isinstance(key, str) and re.search(pat, key) is not None
                except re.error:
                    hit = False
                if hit:
                    matched = True
                    errs.extend(self.errors(value, sub, sub_path))
            if not matched:
                if additional is False:
                    errs.append(f"{path}: additional property {key!r} is not allowed")
                elif isinstance(additional, dict):
                    errs.extend(self.errors(value, additional, sub_path))
        min_p, max_p = schema.get("minProperties"), schema.get("maxProperties")
        if _is_number(min_p) and len(inst) < min_p:
            errs.append(f"{path}: fewer than minProperties {min_p}")
        if _is_number(max_p) and len(inst) > max_p:
            errs.append(f"{path}: more than maxProperties {max_p}")
        names = schema.get("propertyNames")
        if isinstance(names, (dict, bool)):
            for key in inst:
                errs.extend(self.errors(key, names, f"{path}.{key}<name>"))
        return errs

    def _array_errors(self, inst: list, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        items = schema.get("items")
        if isinstance(schema.get("prefixItems"), list):
            prefix, rest = schema["prefixItems"], items
        elif isinstance(items, list):  # draft-7 tuple form
            prefix, rest = items, schema.get("additionalItems")
        else:
            prefix, rest = [], items
        for i, value in enumerate(inst):
            sub_path = f"{path}[{i}]"
            if i < len(prefix):
                errs.extend(self.errors(value, prefix[i], sub_path))
            elif rest is False:
                errs.append(f"{path}: unexpected item at index {i}")
            elif isinstance(rest, dict):
                errs.extend(self.errors(value, rest, sub_path))
        min_i, max_i = schema.get("minItems"), schema.get("maxItems")
        if _is_number(min_i) and len(inst) < min_i:
            errs.append(f"{path}: fewer than minItems {min_i}")
        if _is_number(max_i) and len(inst) > max_i:
            errs.append(f"{path}: more than maxItems {max_i}")
        if schema.get("uniqueItems") is True:
            for i in range(len(inst)):
                if _contains_json(inst[:i], inst[i]):
                    errs.append(f"{path}: items are not unique (index {i})")
                    break
        if "contains" in schema:
            hits = sum(1 for v in inst if not self.errors(v, schema["contains"], path))
            min_c = schema.get("minContains", 1)
            max_c = schema.get("maxContains")
            if _is_number(min_c) and hits < min_c:
                errs.append(f"{path}: contains {hits} matching items, need at least {min_c}")
            if _is_number(max_c) and hits > max_c:
                errs.append(f"{path}: contains {hits} matching items, at most {max_c}")
        return errs


def validate(instance: Any, schema: dict | bool | None) -> list[str]:
    """Validate ``instance`` against ``schema`` (the subset :func:`generate` supports).

    Returns a list of human-readable error strings (JSONPath-ish locations such as
    ``$.items[2].name``); an empty list means the instance is valid.  ``None`` and
    ``{}`` accept everything.  Local ``$ref`` (``#/$defs/...``, ``#/definitions/...``)
    is resolved against ``schema``.  OpenAPI's ``nullable: true`` is honoured.
    """
    return _Validator(schema).errors(instance, schema, "$")


# ---------------------------------------------------------------------------
# generator
# ---------------------------------------------------------------------------


class _Generator:
    def __init__(self, root: Any, rng: random.Random, max_depth: int) -> None:
        self.root = root
        self.rng = rng
        self.max_depth = max(0, int(max_depth))
        self.validator = _Validator(root)
        self.costs = _CostEstimator(root)
        self.nodes = 0

    # -- combinators -------------------------------------------------------

    def _pick_branch(self, branches: list, minimal: bool) -> Any:
        usable = [b for b in branches if b is not False]
        if not usable:
            return False
        if minimal:
            scores = [self.costs.score(b) for b in usable]
            best = min(scores)
            return usable[scores.index(best)]
        return self.rng.choice(usable)

    def flatten(self, schema: Any, depth: int) -> tuple[Any, list[list]]:
        """Resolve ``$ref``/``allOf``/``anyOf``/``oneOf`` at the top of ``schema``.

        Returns the merged, combinator-free schema (or ``False`` when unsatisfiable)
        and the ``oneOf`` branch lists whose exclusivity must be re-checked.
        """
        if schema is None or schema is True:
            return {}, []
        if schema is False:
            return False, []
        if not isinstance(schema, dict):
            return {}, []
        minimal = depth >= self.max_depth
        s: Any = _normalise(schema)
        one_of_checks: list[list] = []
        for _ in range(_MAX_FLATTEN_STEPS):
            if not isinstance(s, dict):
                break
            if "$ref" in s:
                s = dict(s)
                found, target = _resolve_pointer(self.root, s.pop("$ref"))
                s = _merge(target if found else {}, s)
            elif "anyOf" in s:
                s = dict(s)
                branches = s.pop("anyOf")
                if isinstance(branches, list) and branches:
                    s = _merge(s, self._pick_branch(branches, minimal))
            elif "oneOf" in s:
                s = dict(s)
                branches = s.pop("oneOf")
                if isinstance(branches, list) and branches:
                    one_of_checks.append(branches)
                    s = _merge(s, self._pick_branch(branches, minimal))
            elif "allOf" in s:
                s = dict(s)
                parts = s.pop("allOf")
                for part in parts if isinstance(parts, list) else []:
                    s = _merge(s, part)
                    if s is False:
                        break
            else:
                break
        if isinstance(s, dict):
            for key in ("$ref", "anyOf", "oneOf", "allOf"):
                s.pop(key, None)
        return s, one_of_checks

    # -- entry -------------------------------------------------------------

    def gen(self, schema: Any, depth: int) -> Any:
        self.nodes += 1
        if depth > self.max_depth + _HARD_DEPTH_SLACK or self.nodes > _NODE_BUDGET:
            return None  # runaway (unsatisfiable) recursion: give up on this branch
        attempts = _ONEOF_ATTEMPTS
        value: Any = None
        for _ in range(attempts):
            flat, checks = self.flatten(schema, depth)
            value = self.gen_flat(flat, depth)
            if all(self._exactly_one(value, branches, depth) for branches in checks):
                return value
        return value

    def _exactly_one(self, value: Any, branches: list, depth: int) -> bool:
        matches = 0
        for branch in branches:
            if not self.validator.errors(value, branch):
                matches += 1
                if matches > 1:
                    return False
        return matches == 1

    def gen_flat(self, s: Any, depth: int) -> Any:
        if s is False:
            return None
        if not isinstance(s, dict):
            s = {}
        minimal = depth >= self.max_depth
        if "const" in s:
            return copy.deepcopy(s["const"])
        enum = s.get("enum")
        if isinstance(enum, list) and enum:
            rest = {k: v for k, v in s.items() if k != "enum"}
            valid = [v for v in enum if not self.validator.errors(v, rest)]
            return copy.deepcopy(self.rng.choice(valid or enum))
        if not minimal:
            example = self._maybe_example(s)
            if example is not None:
                return example[0]

        type_name = self._choose_type(s, minimal)
        if type_name == "null":
            return None
        if type_name == "boolean":
            return self.rng.random() < 0.5
        if type_name == "integer":
            return self._gen_number(s, integer=True)
        if type_name == "number":
            return self._gen_number(s, integer=False)
        if type_name == "object":
            return self._gen_object(s, depth)
        if type_name == "array":
            return self._gen_array(s, depth)
        return self._gen_string(s)

    def _maybe_example(self, s: dict) -> tuple[Any] | None:
        candidates: list[Any] = []
        if isinstance(s.get("examples"), list):
            candidates.extend(s["examples"])
        if "default" in s:
            candidates.append(s["default"])
        if not candidates or self.rng.random() >= 0.2:
            return None
        valid = [c for c in candidates if not self.validator.errors(c, s)]
        if not valid:
            return None
        return (copy.deepcopy(self.rng.choice(valid)),)

    def _choose_type(self, s: dict, minimal: bool) -> str:
        types = _type_list(s)
        if types is None:
            if any(k in s for k in _OBJECT_KEYS):
                types = ["object"]
            elif any(k in s for k in _ARRAY_KEYS):
                types = ["array"]
            elif any(k in s for k in _STRING_KEYS):
                types = ["string"]
            elif any(k in s for k in _NUMBER_KEYS):
                types = ["integer"] if isinstance(s.get("multipleOf"), int) else ["number"]
            else:
                types = ["string"]
            if s.get("nullable") is True:
                types.append("null")
        types = [t for t in types if t in _JSON_TYPES] or ["string"]
        if len(types) == 1:
            return types[0]
        if minimal:
            return min(types, key=_MINIMAL_TYPE_ORDER.index)
        non_null = [t for t in types if t != "null"]
        if len(non_null) < len(types) and self.rng.random() < 0.25:
            return "null"
        return self.rng.choice(non_null)

    # -- strings -----------------------------------------------------------

    def _words(self, count: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(count))

    def _gen_format(self, fmt: str) -> str | None:
        rng = self.rng
        if fmt in ("date-time", "date", "time"):
            base = _dt.datetime(2020, 1, 1, tzinfo=_dt.UTC)
            moment = base + _dt.timedelta(seconds=rng.randrange(6 * 365 * 24 * 3600))
            if fmt == "date":
                return moment.date().isoformat()
            if fmt == "time":
                return moment.strftime("%H:%M:%SZ")
            return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        if fmt in ("email", "idn-email"):
            return f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}@example.com"
        if fmt in ("uri", "iri", "url", "uri-reference", "iri-reference"):
            return f"https://example.com/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}"
        if fmt == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if fmt == "ipv4":
            return ".".join(str(rng.randint(1, 254)) for _ in range(4))
        if fmt == "ipv6":
            return str(ipaddress.IPv6Address(rng.getrandbits(128)))
        if fmt in ("hostname", "idn-hostname"):
            return f"{rng.choice(_WORDS)}.example.com"
        if fmt == "duration":
            return f"P{rng.randint(1, 30)}DT{rng.randint(1, 23)}H"
        return None

    def _gen_string(self, s: dict) -> str:
        min_len = s.get("minLength") if _is_number(s.get("minLength")) else 0
        max_len = s.get("maxLength") if _is_number(s.get("maxLength")) else None
        min_len = max(0, math.ceil(min_len))
        if max_len is not None:
            max_len = max(0, math.floor(max_len))

        def fits(text: str) -> bool:
            return len(text) >= min_len and (max_len is None or len(text) <= max_len)

        pattern = s.get("pattern")
        if isinstance(pattern, str):
            text = _string_from_pattern(pattern, self.rng, min_len, max_len)
            if text is not None:
                return text
        fmt = s.get("format")
        if isinstance(fmt, str):
            text = self._gen_format(fmt)
            if text is not None and fits(text):
                return text
        words = [self.rng.choice(_WORDS) for _ in range(self.rng.randint(1, 4))]
        while len(" ".join(words)) < min_len:
            words.append(self.rng.choice(_WORDS))
        # Prefer dropping whole words over cutting one in half.
        while max_len is not None and len(words) > 1 and len(" ".join(words)) > max_len:
            words.pop()
        text = " ".join(words)
        if max_len is not None and len(text) > max_len:
            text = text[:max_len].rstrip()
        while len(text) < min_len:
            text += self.rng.choice(string.ascii_lowercase)
        return text

    # -- numbers -----------------------------------------------------------

    def _gen_number(self, s: dict, *, integer: bool) -> int | float:
        lo, lo_ex, hi, hi_ex = _number_bounds(s)
        mult = s.get("multipleOf")
        if not (_is_number(mult) and mult > 0):
            mult = None
        if integer:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_ex else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_ex else math.floor(hi))
            ilo, ihi = _default_range(ilo, ihi, 100)
            if mult is None:
                return self.rng.randint(ilo, ihi) if ilo <= ihi else ilo
            if float(mult).is_integer():
                step = int(mult)
                k_lo, k_hi = -((-ilo) // step), ihi // step
                if k_lo <= k_hi:
                    return self.rng.randint(k_lo, k_hi) * step
                return ilo
            return self._multiple_in_range(ilo, False, ihi, False, mult, integer=True)
        if mult is not None:
            flo = 0 if lo is None and (hi is None or hi > 0) else lo
            fhi = hi
            if flo is None:
                flo, lo_ex = fhi - 100 * mult, False
            if fhi is None:
                fhi, hi_ex = flo + 100 * mult, False
            return self._multiple_in_range(flo, lo_ex, fhi, hi_ex, mult, integer=False)
        flo, fhi = _default_range(lo, hi, 100)
        for _ in range(5):
            value = round(self.rng.uniform(flo, fhi), 2)
            if _in_bounds(value, lo, lo_ex, hi, hi_ex):
                return value
        mid = (flo + fhi) / 2
        return mid if _in_bounds(mid, lo, lo_ex, hi, hi_ex) else flo

    def _multiple_in_range(
        self, lo: Any, lo_ex: bool, hi: Any, hi_ex: bool, mult: float, *, integer: bool
    ) -> int | float:
        k_lo = math.ceil(lo / mult)
        k_hi = math.floor(hi / mult)
        if k_lo > k_hi:
            return lo
        fallback: int | float | None = None
        for _ in range(40):
            k = self.rng.randint(k_lo, k_hi)
            # Prefer a "pretty" value (no float noise); keep a noisy valid one as fallback.
            for value in (round(k * mult, 10), k * mult):
                if integer:
                    if not float(value).is_integer():
                        continue
                    value = int(value)
                if not _in_bounds(value, lo, lo_ex, hi, hi_ex) or not _is_multiple(value, mult):
                    continue
                if value == round(value, 10):
                    return value
                if fallback is None:
                    fallback = value
        if fallback is not None:
            return fallback
        if _in_bounds(0, lo, lo_ex, hi, hi_ex):
            return 0
        return lo

    # -- objects & arrays --------------------------------------------------

    def _gen_object(self, s: dict, depth: int) -> dict:
        minimal = depth >= self.max_depth
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        required = [r for r in s.get("required") or [] if isinstance(r, str)]
        additional = s.get("additionalProperties", True)
        out: dict[str, Any] = {}
        optional_included: list[str] = []
        skipped: list[str] = []
        for name, sub in props.items():
            if sub is False:
                continue
            if name in required:
                out[name] = self.gen(sub, depth + 1)
            elif not minimal and self.rng.random() < 0.5:
                out[name] = self.gen(sub, depth + 1)
                optional_included.append(name)
            else:
                skipped.append(name)
        for name in required:
            if name not in out:
                out[name] = self.gen(self._schema_for_extra_key(s, name), depth + 1)
        min_p = s.get("minProperties") if _is_number(s.get("minProperties")) else 0
        max_p = s.get("maxProperties") if _is_number(s.get("maxProperties")) else None
        for name in skipped:
            if len(out) >= min_p:
                break
            out[name] = self.gen(props[name], depth + 1)
            optional_included.append(name)
        counter = 0
        while len(out) < min_p and additional is not False and counter < 1000:
            counter += 1
            name = f"{self.rng.choice(_WORDS)}_{counter}"
            if name in out or name in props:
                continue
            out[name] = self.gen(self._schema_for_extra_key(s, name), depth + 1)
        if max_p is not None:
            while len(out) > max_p and optional_included:
                out.pop(optional_included.pop())
        return out

    @staticmethod
    def _schema_for_extra_key(s: dict, name: str) -> Any:
        pattern_props = s.get("patternProperties")
        if isinstance(pattern_props, dict):
            for pat, sub in pattern_props.items():
                try:
                    if re.search(pat, name):
                        return sub
                except re.error:
                    continue
        additional = s.get("additionalProperties", True)
        return additional if isinstance(additional, dict) else {}

    def _gen_array(self, s: dict, depth: int) -> list:
        minimal = depth >= self.max_depth
        items = s.get("items", True)
        if isinstance(s.get("prefixItems"), list):
            prefix, rest = s["prefixItems"], items
        elif isinstance(items, list):
            prefix, rest = items, s.get("additionalItems", True)
        else:
            prefix, rest = [], items
        rest_given = "items" in s if not isinstance(items, list) else "additionalItems" in s
        min_i = s.get("minItems") if _is_number(s.get("minItems")) else 0
        min_i = max(0, math.ceil(min_i))
        max_i = s.get("maxItems") if _is_number(s.get("maxItems")) else None
        if max_i is not None:
            max_i = max(0, math.floor(max_i))
        if rest is False:
            max_i = len(prefix) if max_i is None else min(max_i, len(prefix))
        if minimal:
            count = min_i
        else:
            lower = max(min_i, len(prefix))
            if prefix and not rest_given:
                upper = lower
            else:
                upper = lower + (3 if depth < 2 else 2 if depth < 4 else 1)
            if max_i is not None:
                upper = min(upper, max_i)
                lower = min(lower, max_i)
            lower = max(lower, min_i)
            count = self.rng.randint(lower, max(lower, upper))
        unique = s.get("uniqueItems") is True
        out: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else rest
            value = self.gen(sub, depth + 1)
            if unique and _contains_json(out, value):
                for _ in range(10):
                    value = self.gen(sub, depth + 1)
                    if not _contains_json(out, value):
                        break
                else:
                    if len(out) >= min_i:
                        break
            out.append(value)
        if "contains" in s:
            self._ensure_contains(s, out, prefix, rest, max_i, depth)
        return out

    def _ensure_contains(
        self, s: dict, out: list, prefix: list, rest: Any, max_i: int | None, depth: int
    ) -> None:
        contains = s["contains"]
        if any(not self.validator.errors(v, contains) for v in out):
            return
        if max_i is None or len(out) < max_i:
            index = len(out)
        elif len(out) > len(prefix):
            index = len(out) - 1
        else:
            return
        base = prefix[index] if index < len(prefix) else rest
        value = self.gen(_merge_sub(base, contains), depth + 1)
        if index == len(out):
            out.append(value)
        else:
            out[index] = value


def _default_range(lo: Any, hi: Any, span: int) -> tuple[Any, Any]:
    """Fill in missing bounds with a ``span``-wide window, preferring non-negatives."""
    if lo is None and hi is None:
        return 0, span
    if lo is None:
        return (max(0, hi - span) if hi >= 0 else hi - span), hi
    if hi is None:
        return lo, lo + span
    return lo, hi


def _in_bounds(value: Any, lo: Any, lo_ex: bool, hi: Any, hi_ex: bool) -> bool:
    if lo is not None and (value < lo or (lo_ex and value == lo)):
        return False
    if hi is not None and (value > hi or (hi_ex and value == hi)):
        return False
    return True


def generate(schema: dict | bool | None, rng: random.Random, *, max_depth: int = 6) -> Any:
    """Generate a JSON-serialisable value that validates against ``schema``.

    Supports the JSON Schema subset used by OpenAI tools / structured outputs:
    ``type`` (single or list), ``properties``/``required``/``additionalProperties``,
    ``enum``, ``const``, ``items``/``prefixItems``/``minItems``/``maxItems``,
    ``minLength``/``maxLength``/``pattern`` (best effort), ``format`` (date-time,
    date, time, email, uri, uuid, ipv4, ...), numeric bounds and ``multipleOf``,
    ``anyOf``/``oneOf``/``allOf``, local ``$ref`` (``#/$defs/..``,
    ``#/definitions/..``) including recursive schemas, OpenAPI ``nullable`` and
    ``default``/``examples``.

    * ``{}``, ``True`` and ``None`` yield a short lorem-ipsum string.
    * All required properties are present; optional ones appear with p~0.5.
    * Beyond ``max_depth`` nesting levels generation turns minimal (nullable/
      non-recursive branches, no optional properties, ``minItems`` items) so
      recursive schemas terminate.
    * Deterministic: the same schema and the same ``rng`` state give the same value.
    """
    generator = _Generator(schema, rng, max_depth)
    value: Any = None
    for _ in range(_TOP_LEVEL_ATTEMPTS):
        generator.nodes = 0
        value = generator.gen(schema, 0)
        if not generator.validator.errors(value, schema):
            return value
    return value


def generate_tool_arguments(parameters: dict | None, rng: random.Random) -> dict:
    """Generate arguments for a function tool whose JSON Schema is ``parameters``.

    ``None`` or an empty schema gives ``{}``.  The result is always a ``dict``
    (a schema without ``type`` is treated as an object schema).
    """
    if not parameters or not isinstance(parameters, dict):
        return {}
    schema = parameters
    combinators = ("$ref", "anyOf", "oneOf", "allOf", "enum", "const")
    if "type" not in schema and not any(k in schema for k in combinators):
        schema = {**schema, "type": "object"}
    value = generate(schema, rng)
    return value if isinstance(value, dict) else {}
