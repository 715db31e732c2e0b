"""JSON Schema support, small helpers (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import math
import reprlib
from typing import Any, TypeGuard, overload
from urllib.parse import unquote

from .limits import _ARRAY_KEYS, _NUMBER_KEYS, _OBJECT_KEYS, _SAT, _STRING_KEYS, MAX_SCHEMA_DEPTH
from .work import Work

# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _is_number(value: Any) -> TypeGuard[int | float]:
    """True for JSON numbers (ints and floats, but not bools)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dict_at(schema: dict, key: str) -> dict:
    """schema[key] when it is an object, else {}."""
    v = schema.get(key)
    return v if isinstance(v, dict) else {}


def _list_at(schema: dict, key: str) -> list:
    """schema[key] when it is an array, else []."""
    v = schema.get(key)
    return v if isinstance(v, list) else []


@overload
def _num_at(schema: dict, key: str, default: int) -> int | float: ...
@overload
def _num_at(schema: dict, key: str, default: None) -> int | float | None: ...
def _num_at(schema: dict, key: str, default: int | None) -> int | float | None:
    """schema[key] when it is a JSON number, else the default."""
    v = schema.get(key)
    return v if _is_number(v) else default


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


def _canon(value: Any) -> Any:
    """A hashable key with JSON equality (``1`` and ``1.0`` alike, ``True`` apart from 1)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _canon(v)) for k, v in value.items()))
    return ("z", None) if value is None else ("o", id(value))


def _json_size(value: Any, limit: int = _SAT) -> int:
    """A lower bound of the JSON size of ``value`` in bytes; stops counting past ``limit``."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += 2 + len(v)
        elif isinstance(v, dict):
            total += 1 + len(v)
            for k, x in v.items():
                total += 3 + len(k) if isinstance(k, str) else 3
                stack.append(x)
        elif isinstance(v, list):
            total += 1 + len(v)
            stack.extend(v)
        else:
            total += 1
    return total


def _copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (what ``copy.deepcopy`` does, without its memo)."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


_short = reprlib.Repr()  # error messages quote values, bounded: an enum may have 1000 values
_short.maxstring = _short.maxother = 80
_short.maxlist = _short.maxdict = 10


def _implied_type(s: dict) -> str | None:
    """The type an untyped schema implies by its keywords (``properties`` → object, ``items``
    → array, ``pattern`` → string, ``minimum`` → number/integer), None if nothing implies one."""
    if any(k in s for k in _OBJECT_KEYS):
        return "object"
    if any(k in s for k in _ARRAY_KEYS):
        return "array"
    if any(k in s for k in _STRING_KEYS):
        return "string"
    if any(k in s for k in _NUMBER_KEYS):
        return "integer" if isinstance(s.get("multipleOf"), int) else "number"
    return None


def _type_list(schema: dict) -> list[str] | None:
    """The declared ``type`` as a list (None if absent), honouring ``nullable``."""
    raw = schema.get("type")
    if raw is None:
        return None
    if isinstance(raw, str):
        types = [raw]
    else:  # a list of names; anything else (check() refuses it) allows nothing
        types = [t for t in raw if isinstance(t, str)] if isinstance(raw, list) else []
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


class _Refs:
    """Local ``$ref`` resolution against one root, each target looked up once; every
    expansion is counted in the request's :class:`Work`."""

    __slots__ = ("root", "work", "cache")

    def __init__(self, root: Any, work: Work) -> None:
        self.root = root
        self.work = work
        self.cache: dict[str, tuple[bool, Any]] = {}

    def resolve(self, ref: Any) -> tuple[bool, Any]:
        self.work.ref()
        if not isinstance(ref, str):
            return False, None
        hit = self.cache.get(ref)
        if hit is None:
            self.work.spend(1 + len(ref) // 32)
            hit = self.cache[ref] = _resolve_pointer(self.root, ref)
        return hit


_INF_COST = 10**6


class _CostEstimator:
    """Estimates how deep the *smallest* instance of a schema must nest.

    Used to pick branches that terminate when a recursive schema hits ``max_depth``:
    ``0`` for scalars/null, ``1 + max(required children)`` for objects and
    non-empty arrays, ``min`` over ``anyOf``/``oneOf``/type choices and
    "infinite" for a ``$ref`` cycle that cannot be escaped.
    """

    def __init__(self, refs: _Refs) -> None:
        self.refs = refs
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
        self.refs.work.spend()
        if self.budget <= 0 or len(visiting) > MAX_SCHEMA_DEPTH:
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
            found, target = self.refs.resolve(ref)
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
            props = _dict_at(schema, "properties")
            required = _list_at(schema, "required")
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
