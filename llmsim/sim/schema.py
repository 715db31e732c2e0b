"""JSON Schema driven value generation and validation.

Pure helpers (stdlib only, no I/O) used by the simulator to fabricate tool-call
arguments and structured outputs that conform to the JSON Schema subset used by
OpenAI function tools and ``response_format: json_schema``.

Public API:

* :func:`check` - refuse a client's schema before any generation: malformed, or over
  the work budget below (a 400 naming the parameter).
* :func:`generate` - produce a JSON-serialisable value valid against a schema.
* :func:`generate_tool_arguments` - like :func:`generate` but always a ``dict``.
* :func:`validate` - a small validator for the same subset; returns error strings.
* :class:`Work` - what one request may still spend on its schemas.

All randomness comes from the ``random.Random`` passed in, so the same schema and
the same RNG state always give the same value.

Theory of operation (bounded work). A schema arrives in a few hundred bytes but is
answered by *generating* a value, so its cost has nothing to do with its size: nested
``$ref``/``allOf``/``oneOf`` multiply, ``minLength: 1e9`` asks for a gigabyte, and a
pattern like ``^(a+)+$`` makes a backtracking matcher exponential. Two layers bound it:

1. :func:`check` (at request validation, before anything is generated) walks the
   document once: JSON types of keywords, nesting depth, values per request, enum sizes,
   regex syntax and supported constructs, and a lower bound of the JSON size of the
   *smallest* value the schema admits (repetition counts multiplied through nesting).
2. :class:`Work` meters what cannot be judged from the document (combinator products,
   ``oneOf`` retries, validation, ``$ref`` expansions, characters produced) inside the
   generator, validator and regex code. Past a share of the budget the generator
   produces minimal values; past the whole budget the request is a 400.

Client regular expressions are never run by Python's backtracking ``re`` matcher: strings
are generated from the parse tree, and checked by a Thompson NFA simulation whose time is
linear in the text (see ``_Regex``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import ipaddress
import math
import random
import re
import re._constants as _sre_c  # type: ignore[import-not-found]  # the regex parser's node names (Python >= 3.11)
import re._parser as _sre_parse  # type: ignore[import-not-found]
import reprlib
import string
import uuid
from collections.abc import Callable
from typing import Any, TypeGuard, overload
from urllib.parse import unquote

from .. import errors

__all__ = ["Work", "check", "generate", "generate_tool_arguments", "validate",
           "MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES", "MAX_ENUM_VALUES", "MAX_VALUE_BYTES",
           "MAX_VALUE_NODES",
           "MAX_PATTERN_CHARS", "MAX_REGEX_STATES", "MAX_SCHEMA_WORK", "MAX_REF_EXPANSIONS"]

# ---------------------------------------------------------------------------
# limits: the work one request's schemas may cost
# ---------------------------------------------------------------------------
# Each limit says why it is this number. Over a limit the request is a 400 naming the
# schema's parameter, with code ``request_too_large`` (the simulator's own work bound, as in
# api.validate.check_request_work); a malformed schema is a 400 with the real API's code.

# JSON nesting of one schema document (objects and arrays, const/enum values included). The
# real API allows 10 levels of object nesting in strict mode, about 3 JSON levels each; 64
# leaves room for that plus $defs, and keeps every recursive walk in this module far from
# Python's recursion limit.
MAX_SCHEMA_DEPTH = 64

# JSON values (objects, arrays, scalars) in all the schemas of one request, walked once by
# check() (~0.5 µs each: ~10 ms). The real API's strict limit is 5,000 object properties in
# one schema (~20k values); 128 tools of ~150 values each fit as well.
MAX_SCHEMA_NODES = 20_000

# Values in one ``enum``: the real API's strict-mode limit for a whole schema. Generating a
# value filters its enum against the sibling keywords, so this multiplies with every node.
MAX_ENUM_VALUES = 1_000

# Work units one request may spend generating and validating values. A unit is ~1 µs on the
# 2-core dev machine (measured 0.2-1 µs): a node generated or validated costs 4, a $ref
# expansion 2, a regex step 1, two characters produced 1 (making them, then JSON-encoding and
# tokenizing them downstream). So one request's generation holds the event loop ~20 ms at
# most (~40 ms when the 2 cores are contended; tests/test_hostile_schema.py measures it).
# Shared by all the choices and tool calls of the request: `n` does not multiply it.
MAX_SCHEMA_WORK = 20_000

# JSON bytes of the smallest value a schema admits (minLength, minItems, minProperties,
# regex repetition counts ``{n}``, enum/const values and required properties, multiplied
# through nesting), and of any one enum/const value. 16 KiB (~4k tokens) is twice the longest
# completion llmsim draws by default (output_tokens_max 2048), and generating it costs 8k
# units: well within MAX_SCHEMA_WORK, so a schema that passes check() can be generated.
MAX_VALUE_BYTES = 16_384

# JSON values (of any kind) in the smallest value a schema admits. Each costs ~11 units to
# generate and validate: 1,000 of them are about half of MAX_SCHEMA_WORK.
MAX_VALUE_NODES = 1_000

# Characters in one ``pattern`` (or ``patternProperties`` key). Real-world patterns (e-mail,
# URL, ISO dates) are well under 500; parsing is linear, but this keeps it under ~1 ms.
MAX_PATTERN_CHARS = 1_000

# Instructions of the automaton a pattern compiles to for matching (``{n,m}`` copies its
# body m times). Matching costs len(text) × live states; above this size, strings generated
# from the pattern are trusted (the generator is constructive) and other strings (enum
# values, examples) are not judged against it.
MAX_REGEX_STATES = 2_000

# $ref expansions in one request's generation and validation (each also costs 2 units of
# MAX_SCHEMA_WORK). A recursive tree schema generated to the default depth uses a few
# hundred; this bounds reference chains and reference bombs on their own.
MAX_REF_EXPANSIONS = 10_000

# A generation produces rich values (optional properties, a few extra array items) until it
# has spent 1/_RICH_SHARE of what the request had left when it started, or the request has
# spent half its budget; then minimal ones (required properties, minItems items, the shortest
# regex branch), so the other choices and tool calls of the request still fit.
_RICH_SHARE = 4

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
_SAT = 1 << 40  # sizes saturate here: "more than anything llmsim accepts"
_NODE_COST = 4  # work units of one generated or validated node (a unit is ~1 µs, see Work)
_BYTES_PER_UNIT = 2  # characters produced per work unit: making them, then JSON-encoding and
#                      tokenizing them downstream (~0.35 µs a character), is ~1 µs per 2
_EXAMPLES = 16  # examples considered for a generated value (each is validated first)
_EXAMPLE_BYTES = 4096  # a bigger default/example is never used as a generated value
_VALIDATE_DEPTH = 150  # nested validator calls (instance depth × $ref/allOf hops): a chain
#                        deeper than this is refused as over budget instead of recursing on


# ---------------------------------------------------------------------------
# the work meter and the errors it raises
# ---------------------------------------------------------------------------


class _OverBudget(Exception):
    """Internal: a :class:`Work` counter ran out (``what`` says which bound)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Work:
    """What one request may still spend on its schemas.

    ``nodes`` is spent by :func:`check` (one per JSON value walked), ``units`` and ``refs``
    by generation and validation. Create one per request (one for its checks at parse time,
    one for its generation) and pass it to every call, so that ``n`` choices and several tool
    calls share one bound instead of multiplying it.
    """

    __slots__ = ("nodes", "units", "refs", "total")

    def __init__(self, units: int = MAX_SCHEMA_WORK, *, nodes: int = MAX_SCHEMA_NODES,
                 refs: int = MAX_REF_EXPANSIONS) -> None:
        self.nodes = nodes
        self.units = units
        self.refs = refs
        self.total = units

    def spend(self, units: int = 1) -> None:
        self.units -= units
        if self.units < 0:
            raise _OverBudget("work")

    def ref(self) -> None:
        self.refs -= 1
        self.units -= 2
        if self.refs < 0:
            raise _OverBudget("refs")
        if self.units < 0:
            raise _OverBudget("work")


_BUDGET_WHAT = {
    "work": f"more than the {MAX_SCHEMA_WORK} work units llmsim spends on the schemas of one "
            "request (nodes generated or validated, combinator branches tried, regex steps, "
            "characters produced)",
    "refs": f"more than the {MAX_REF_EXPANSIONS} $ref expansions llmsim follows for one "
            "request",
    "depth": f"subschemas nested more than {_VALIDATE_DEPTH} levels deep through $ref and "
             "combinators",
}


def _budget_error(param: str | None, what: str) -> errors.APIError:
    """The 400 for a generation that ran out of :class:`Work`."""
    where = f"'{param}'" if param else "the schema"
    return errors.E.schema_generation_bound.at(param, where=where,
                                               what=_BUDGET_WHAT.get(what, what))


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


def _merge_sub(a: Any, b: Any, work: Work | None = None) -> Any:
    """Merge two subschemas (which may be booleans)."""
    if a is True or a is None:
        return b
    if b is True or b is None:
        return a
    if a is False or b is False:
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return _merge(a, b, work)
    return a


def _merge(a: Any, b: Any, work: Work | None = None) -> Any:
    """Conjunction of two schemas, best effort (the result should accept only
    instances valid against both).  Combinators that collide are deferred into
    ``allOf`` so the generator can process them one at a time.  Each (recursive) merge of
    two objects is paid from ``work``, if given: merges copy, and nest under ``not``."""
    if a is True or a is None:
        return _normalise(b) if isinstance(b, dict) else b
    if b is True or b is None:
        return a
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a if isinstance(a, dict) else b
    if work is not None:
        work.spend(1 + (len(a) + len(b)) // 4)
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
                props[name] = _merge_sub(props[name], sub, work) if name in props else sub
            out[key] = props
        elif key == "patternProperties" and isinstance(av, dict) and isinstance(bv, dict):
            pats = dict(av)
            for name, sub in bv.items():
                pats[name] = _merge_sub(pats[name], sub, work) if name in pats else sub
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
            out[key] = _merge_sub(av, bv, work)
        elif key == "prefixItems" and isinstance(av, list) and isinstance(bv, list):
            longest = max(len(av), len(bv))
            out[key] = [
                _merge_sub(av[i] if i < len(av) else True, bv[i] if i < len(bv) else True,
                           work)
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

    def __init__(self, root: Any, work: Work | None = None) -> None:
        self.root = root
        self.work = work if work is not None else Work()
        self.refs = _Refs(root, self.work)
        self.depth = 0
        self._active_refs: set[tuple[str, str]] = set()
        self._enums: dict[int, tuple[set[Any], list]] = {}

    def errors(self, inst: Any, schema: Any, path: str = "$") -> list[str]:
        if schema is True or schema is None:
            return []
        if schema is False:
            return [f"{path}: no value is allowed here (schema is false)"]
        if not isinstance(schema, dict):
            return []
        self.work.spend(_NODE_COST)
        if self.depth >= _VALIDATE_DEPTH:
            raise _OverBudget("depth")
        self.depth += 1
        try:
            return self._errors(inst, schema, path)
        finally:
            self.depth -= 1

    def _errors(self, inst: Any, schema: dict, path: str) -> list[str]:
        errs: list[str] = []
        ref = schema.get("$ref")
        if isinstance(ref, str):
            found, target = self.refs.resolve(ref)
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
            if not self._in_enum(schema["enum"], inst):
                errs.append(f"{path}: {_short.repr(inst)} is not one of "
                            f"{_short.repr(schema['enum'])}")
        if "const" in schema and not _json_equal(inst, schema["const"]):
            errs.append(f"{path}: expected constant {_short.repr(schema['const'])}, got "
                        f"{_short.repr(inst)}")

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

    def _in_enum(self, enum: list, inst: Any) -> bool:
        """Membership with JSON equality, O(1) after one pass over the enum."""
        hit = self._enums.get(id(enum))
        if hit is None or hit[1] is not enum:
            self.work.spend(1 + len(enum))
            hit = self._enums[id(enum)] = ({_canon(v) for v in enum}, enum)
        return _canon(inst) in hit[0]

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
        # never re.search: a client pattern may backtrack exponentially; None = cannot judge
        if isinstance(pattern, str) and _pattern_search(pattern, inst, self.work) is False:
            errs.append(f"{path}: {_short.repr(inst)} does not match pattern "
                        f"{_short.repr(pattern)}")
        fmt = schema.get("format")
        if isinstance(fmt, str) and not _format_ok(fmt, inst):
            errs.append(f"{path}: {_short.repr(inst)} is not a valid {fmt}")
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
        props = _dict_at(schema, "properties")
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
                hit = isinstance(key, str) and _pattern_search(pat, key, self.work) is True
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
            seen: set[Any] = set()
            for i, value in enumerate(inst):
                self.work.spend()
                key = _canon(value)
                if key in seen:
                    errs.append(f"{path}: items are not unique (index {i})")
                    break
                seen.add(key)
        if "contains" in schema:
            hits = sum(1 for v in inst if not self.errors(v, schema["contains"], path))
            min_c = schema.get("minContains", 1)
            max_c = schema.get("maxContains")
            if _is_number(min_c) and hits < min_c:
                errs.append(f"{path}: contains {hits} matching items, need at least {min_c}")
            if _is_number(max_c) and hits > max_c:
                errs.append(f"{path}: contains {hits} matching items, at most {max_c}")
        return errs


def validate(instance: Any, schema: dict | bool | None, *, work: Work | None = None) -> list[str]:
    """Validate ``instance`` against ``schema`` (the subset :func:`generate` supports).

    Returns a list of human-readable error strings (JSONPath-ish locations such as
    ``$.items[2].name``); an empty list means the instance is valid.  ``None`` and
    ``{}`` accept everything.  Local ``$ref`` (``#/$defs/...``, ``#/definitions/...``)
    is resolved against ``schema``.  OpenAPI's ``nullable: true`` is honoured.
    ``pattern`` is matched in linear time; a pattern whose automaton would be too big, or
    that uses back-references or lookarounds, is not judged. Validation that needs more
    than ``work`` (default: a fresh :class:`Work`) ends with one error saying so.
    """
    try:
        return _Validator(schema, work).errors(instance, schema, "$")
    except _OverBudget as exc:
        return [f"$: not judged: validation needs {_BUDGET_WHAT.get(exc.what, exc.what)}"]


# ---------------------------------------------------------------------------
# check: refuse a client's schema before anything is generated
# ---------------------------------------------------------------------------

_SUBSCHEMA_KEYS = ("additionalProperties", "additionalItems", "contains", "propertyNames",
                   "not", "if", "then", "else", "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
               "maxProperties", "minContains", "maxContains")
_TYPE_NAMES = ", ".join(f"'{t}'" for t in _JSON_TYPES)
_MIN_SIZE_DEPTH = 200  # $ref hops followed by the size estimate; deeper counts as 0 (a lower
#                        bound stays a lower bound) and keeps the recursion short


class _Refused(Exception):
    """Internal: why check() refuses a schema (``over`` = a simulator bound, not a defect)."""

    def __init__(self, path: tuple[Any, ...], detail: str, over: bool = False) -> None:
        super().__init__(detail)
        self.path = path
        self.detail = detail
        self.over = over

    def error(self, param: str, label: str, code: str) -> errors.APIError:
        context = repr(self.path)
        if self.over:
            return errors.E.schema_over_bound.at(param, label=label, context=context,
                                                 detail=self.detail)
        return errors.E.invalid_schema.at(param, code=code, label=label, context=context,
                                          detail=self.detail)


def _is_count(value: Any) -> bool:
    """A JSON Schema non-negative integer (``2.0`` counts, ``True`` does not)."""
    if isinstance(value, bool) or not _is_number(value) or value < 0:
        return False
    return isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())


def _count(value: Any) -> int:
    """A count keyword's value as an int (0 if absent or malformed), saturating."""
    if not _is_number(value) or value <= 0:
        return 0
    return _SAT if value >= _SAT else math.ceil(value)


class _Checker:
    """The structural checks of :func:`check` (the document is known to be shallow)."""

    def __init__(self, work: Work) -> None:
        self.work = work

    def document(self, root: Any) -> None:
        """Count every JSON value and measure the nesting: level by level, no recursion."""
        level = [root]
        depth = count = 0  # depth: levels of objects/arrays
        while level:
            count += len(level)
            if count > self.work.nodes:
                raise _Refused((), f"the schemas of this request hold more than "
                               f"{MAX_SCHEMA_NODES} JSON values in total (llmsim's bound)",
                               over=True)
            below: list[Any] = []
            containers = False
            for v in level:
                if type(v) is dict:
                    below.extend(v.values())
                    containers = True
                elif type(v) is list:
                    below.extend(v)
                    containers = True
            depth += containers
            if depth > MAX_SCHEMA_DEPTH:
                raise _Refused((), f"it nests more than {MAX_SCHEMA_DEPTH} levels deep "
                               "(llmsim's bound)", over=True)
            level = below
        self.work.nodes -= count

    def schema(self, s: Any, path: tuple[Any, ...]) -> None:
        if isinstance(s, bool):
            return
        if not isinstance(s, dict):
            raise _Refused(path, f"{_short.repr(s)} is not of type 'object', 'boolean'")
        for key, v in s.items():
            if key == "type":
                names: Any = [v] if isinstance(v, str) else v
                if not (isinstance(names, list) and names and len(set(map(str, names)))
                        == len(names) and all(t in _JSON_TYPES for t in names)):
                    raise _Refused(path, f"'type' must be one of {_TYPE_NAMES} or a non-empty "
                                   f"array of distinct ones, not {_short.repr(v)}")
            elif key in _SUBSCHEMA_MAPS:
                if not isinstance(v, dict):
                    raise _Refused(path, f"'{key}' must be an object, not {_short.repr(v)}")
                for name, sub in v.items():
                    if key == "patternProperties":
                        self.pattern(name, path, f"'patternProperties' key {_short.repr(name)}")
                    self.schema(sub, (*path, key, name))
            elif key in _SUBSCHEMA_KEYS:
                self.schema(v, (*path, key))
            elif key == "items" and isinstance(v, list):  # draft-7 tuple form
                for i, sub in enumerate(v):
                    self.schema(sub, (*path, key, i))
            elif key == "items":
                self.schema(v, (*path, key))
            elif key in _SUBSCHEMA_LISTS:
                if not isinstance(v, list) or not v:
                    raise _Refused(path, f"'{key}' must be a non-empty array of schemas, not "
                                   f"{_short.repr(v)}")
                for i, sub in enumerate(v):
                    self.schema(sub, (*path, key, i))
            elif key == "enum":
                if not isinstance(v, list):
                    raise _Refused(path, f"'enum' must be an array, not {_short.repr(v)}")
                if len(v) > MAX_ENUM_VALUES:
                    raise _Refused(path, f"'enum' has {len(v)} values; llmsim accepts at most "
                                   f"{MAX_ENUM_VALUES} in one enum", over=True)
                for i, x in enumerate(v):
                    self.literal(x, path, f"'enum' value {i}")
            elif key == "const":
                self.literal(v, path, "'const'")
            elif key == "required":
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise _Refused(path, "'required' must be an array of strings, not "
                                   f"{_short.repr(v)}")
            elif key in _COUNT_KEYS:
                if not _is_count(v):
                    raise _Refused(path, f"'{key}' must be a non-negative integer, not "
                                   f"{_short.repr(v)}")
            elif key in ("minimum", "maximum"):
                if not _is_number(v):
                    raise _Refused(path, f"'{key}' must be a number, not {_short.repr(v)}")
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                if not (_is_number(v) or isinstance(v, bool)):
                    raise _Refused(path, f"'{key}' must be a number, not {_short.repr(v)}")
            elif key == "multipleOf":
                if not (_is_number(v) and v > 0):
                    raise _Refused(path, "'multipleOf' must be a number greater than 0, not "
                                   f"{_short.repr(v)}")
            elif key == "pattern":
                self.pattern(v, path, "'pattern'")
            elif key in ("format", "$ref"):
                if not isinstance(v, str):
                    raise _Refused(path, f"'{key}' must be a string, not {_short.repr(v)}")
            elif key in ("uniqueItems", "nullable"):
                if not isinstance(v, bool):
                    raise _Refused(path, f"'{key}' must be a boolean, not {_short.repr(v)}")

    @staticmethod
    def literal(v: Any, path: tuple[Any, ...], what: str) -> None:
        """An enum/const value is output as it is: it must fit in a generated value."""
        size = _json_size(v, MAX_VALUE_BYTES)
        if size > MAX_VALUE_BYTES:
            raise _Refused(path, f"{what} has more than {MAX_VALUE_BYTES} bytes of JSON; llmsim "
                           f"generates at most {MAX_VALUE_BYTES}", over=True)

    def pattern(self, v: Any, path: tuple[Any, ...], what: str) -> None:
        if not isinstance(v, str):
            raise _Refused(path, f"{what} must be a string, not {_short.repr(v)}")
        self.work.nodes -= len(v) // 16  # parsing costs about a value per 16 characters
        rx = _regex(v)
        if rx.error is not None:
            over = rx.tree is None and (rx.too_long or "levels deep" in rx.error)
            raise _Refused(path, f"{what} {rx.error}", over=over)
        if rx.unsupported is not None:
            raise _Refused(path, f"{what}: {rx.unsupported}")


class _MinSize:
    """Lower bounds of the JSON bytes and JSON values of the smallest value :func:`generate`
    produces for a schema.

    The generator's own choices are followed (a schema without ``type`` but with
    ``minItems`` is an array), ``anyOf``/``oneOf`` take their smallest branch, ``allOf``
    its largest part, and a ``$ref`` cycle counts 0 — so memoising by node stays a lower
    bound. Each node is sized once.
    """

    def __init__(self, root: Any) -> None:
        self.root = root
        self.memo: dict[int, tuple[int, int]] = {}
        self.active: set[int] = set()
        self.refs: dict[str, tuple[bool, Any]] = {}

    def of(self, s: Any, depth: int = 0) -> tuple[int, int]:
        if s is True or s is None:
            return 2, 1
        if not isinstance(s, dict):
            return 0, 0  # false: nothing can be generated
        key = id(s)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if key in self.active or depth > _MIN_SIZE_DEPTH:
            return 0, 0
        self.active.add(key)
        try:
            size, nodes = self._of(s, depth)
        finally:
            self.active.discard(key)
        value = self.memo[key] = (min(size, _SAT), min(nodes, _SAT))
        return value

    def _of(self, s: dict, depth: int) -> tuple[int, int]:
        parts: list[tuple[int, int]] = []
        ref = s.get("$ref")
        if isinstance(ref, str):
            if ref not in self.refs:
                self.refs[ref] = _resolve_pointer(self.root, ref)
            found, target = self.refs[ref]
            if found:
                parts.append(self.of(target, depth + 1))
        enum = s.get("enum")
        if "const" in s or (isinstance(enum, list) and enum):
            values: list[Any] = [s["const"]] if "const" in s else list(enum or ())
            parts.append((min(_json_size(v) for v in values), 1))
            return max(b for b, _ in parts), max(n for _, n in parts)
        for key in ("anyOf", "oneOf"):
            branches = s.get(key)
            if isinstance(branches, list):
                sizes = [self.of(b, depth + 1) for b in branches if b is not False]
                if sizes:
                    parts.append((min(b for b, _ in sizes), min(n for _, n in sizes)))
        all_of = s.get("allOf")
        if isinstance(all_of, list):
            parts.extend(self.of(p, depth + 1) for p in all_of)
        parts.append(self._own(s, depth))
        return max(b for b, _ in parts), max(n for _, n in parts)

    def _own(self, s: dict, depth: int) -> tuple[int, int]:
        types = _type_list(s)
        if types is None:
            implied = _implied_type(s)
            if implied is None or implied in ("integer", "number"):
                return 1, 1
            types = [implied]
        best_size = best_nodes = _SAT
        for t in types:
            if t == "string":
                pattern = s.get("pattern")
                rx = _regex(pattern) if isinstance(pattern, str) else None
                size, nodes = 2 + max(_count(s.get("minLength")), rx.min_len if rx else 0), 1
            elif t == "array":
                n = _count(s.get("minItems"))
                prefix = s.get("prefixItems")
                items = s.get("items", True)
                if not isinstance(prefix, list):
                    prefix, items = (items, s.get("additionalItems", True)) \
                        if isinstance(items, list) else ([], items)
                size, nodes = 1 + n, 1
                for p in prefix[:n]:
                    b, k = self.of(p, depth + 1)
                    size, nodes = size + b, nodes + k
                if n > len(prefix):
                    b, k = self.of(items, depth + 1)
                    size, nodes = size + (n - len(prefix)) * b, nodes + (n - len(prefix)) * k
            elif t == "object":
                props: dict[str, Any] = s["properties"] \
                    if isinstance(s.get("properties"), dict) else {}
                required: list[Any] = s["required"] if isinstance(s.get("required"), list) else []
                extra = s.get("additionalProperties", True)
                names = {r for r in required if isinstance(r, str)}
                size, nodes = 1 + len(names), 1
                for name in names:
                    b, k = self.of(props[name] if name in props else extra, depth + 1)
                    size, nodes = size + len(name) + 3 + b, nodes + k
                more = max(0, _count(s.get("minProperties")) - len(names))
                size, nodes = size + more * 6, nodes + more  # at least "k":0, each
            else:  # null, boolean, numbers; an unknown name generates a string
                size, nodes = (1 if t in _JSON_TYPES else 2), 1
            best_size, best_nodes = min(best_size, size), min(best_nodes, nodes)
        return best_size, best_nodes


def check(schema: Any, *, param: str, label: str, code: str, work: Work | None = None) -> None:
    """Refuse a client's schema before anything is generated from it.

    ``param`` names the schema in the request (``tools[0].function.parameters``,
    ``response_format.json_schema.schema``, ``text.format.schema``...), ``label`` is the
    real API's wording for its owner (``function 'get_weather'``, ``response_format 'x'``)
    and ``code`` its error code for a malformed schema. Raises a 400
    :class:`~llmsim.errors.APIError`:

    * ``code``: a keyword of the wrong JSON type (``{"type": 5}``, ``{"properties": []}``,
      ``{"enum": 3}``, ``{"required": {}}``, ``{"$ref": 7}``, a subschema that is not an
      object or boolean...), a ``pattern`` that does not parse, or one using a construct
      llmsim cannot generate strings for (lookarounds, atomic groups);
    * ``request_too_large``: over a bound of this module (MAX_SCHEMA_DEPTH,
      MAX_SCHEMA_NODES across the request's schemas, MAX_ENUM_VALUES, MAX_PATTERN_CHARS,
      MAX_VALUE_BYTES for the smallest value the schema admits).

    ``work`` is the request's :class:`Work` (its ``nodes`` are spent); the default is a
    fresh one.
    """
    work = work if work is not None else Work()
    checker = _Checker(work)
    try:
        checker.document(schema)
        checker.schema(schema, ())
        size, nodes = _MinSize(schema).of(schema)
        why = ("minLength, minItems, minProperties, pattern repetition counts, enum/const "
               "values and required properties, multiplied through nesting")
        if size > MAX_VALUE_BYTES:
            raise _Refused((), "the smallest value it admits has at least "
                           f"{'~2^40' if size >= _SAT else size} bytes of JSON ({why}); "
                           f"llmsim generates at most {MAX_VALUE_BYTES}", over=True)
        if nodes > MAX_VALUE_NODES:
            raise _Refused((), "the smallest value it admits has at least "
                           f"{'~2^40' if nodes >= _SAT else nodes} JSON values ({why}); "
                           f"llmsim generates at most {MAX_VALUE_NODES}", over=True)
    except _Refused as exc:
        raise exc.error(param, label, code) from None
    except RecursionError:  # pragma: no cover - the depth bounds above should prevent it
        raise _Refused((), "it nests too deeply", over=True).error(param, label, code) from None


# ---------------------------------------------------------------------------
# generator
# ---------------------------------------------------------------------------


OMIT_OPTIONAL = 0.05
"""The chance that a generated object leaves out one optional property: a real model fills
the fields a schema describes (extraction libraries expect them), now and then one less."""


class _Generator:
    def __init__(self, root: Any, rng: random.Random, max_depth: int, work: Work,
                 omit_optional: float = OMIT_OPTIONAL) -> None:
        self.root = root
        self.rng = rng
        self.omit_optional = omit_optional
        self.max_depth = max(0, int(max_depth))
        self.work = work
        self.validator = _Validator(root, work)
        self.refs = self.validator.refs
        self.costs = _CostEstimator(self.refs)
        self.nodes = 0
        # rich values until the request's work falls below this, then minimal ones
        self.floor = max(work.units - work.units // _RICH_SHARE, work.total // 2)
        self._enum_cache: dict[tuple[int, ...], tuple[list[Any], Any]] = {}

    def _minimal(self, depth: int) -> bool:
        return depth >= self.max_depth or self.work.units < self.floor

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
        minimal = self._minimal(depth)
        s: Any = _normalise(schema)
        one_of_checks: list[list] = []
        merged: set[int] = set()  # targets already merged in: A and A is A
        for _ in range(_MAX_FLATTEN_STEPS):
            if not isinstance(s, dict):
                break
            self.work.spend(1)  # (each merge pays for its copies)
            if "$ref" in s:
                s = dict(s)
                found, target = self.refs.resolve(s.pop("$ref"))
                if id(target) not in merged:
                    merged.add(id(target))
                    s = _merge(target if found else {}, s, self.work)
            elif "anyOf" in s:
                s = dict(s)
                branches = s.pop("anyOf")
                if isinstance(branches, list) and branches:
                    s = _merge(s, self._pick_branch(branches, minimal), self.work)
            elif "oneOf" in s:
                s = dict(s)
                branches = s.pop("oneOf")
                if isinstance(branches, list) and branches:
                    one_of_checks.append(branches)
                    s = _merge(s, self._pick_branch(branches, minimal), self.work)
            elif "allOf" in s:
                s = dict(s)
                parts = s.pop("allOf")
                for part in parts if isinstance(parts, list) else []:
                    s = _merge(s, part, self.work)
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
        self.work.spend(_NODE_COST)
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
        minimal = self._minimal(depth)
        if "const" in s:
            return self._copy(s["const"])
        enum = s.get("enum")
        if isinstance(enum, list) and enum:
            return self._copy(self.rng.choice(self._enum_values(enum, s)))
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
            return _encodable(self._gen_number(s, integer=True))
        if type_name == "number":
            return _encodable(self._gen_number(s, integer=False))
        if type_name == "object":
            return self._gen_object(s, depth)
        if type_name == "array":
            return self._gen_array(s, depth)
        return self._gen_string(s, minimal)

    def _copy(self, value: Any) -> Any:
        self.work.spend(1 + _json_size(value) // _BYTES_PER_UNIT)
        return _copy_json(value)

    def _enum_values(self, enum: list, s: dict) -> list:
        """The enum values valid against the sibling keywords (or all if none is), cached:
        the same enum under the same keywords is filtered once per generation."""
        rest = {k: v for k, v in s.items() if k != "enum"}
        key = (id(enum), *(id(v) for v in rest.values()), *map(id, rest))
        hit = self._enum_cache.get(key)
        if hit is None:
            valid = [v for v in enum if not self.validator.errors(v, rest)]
            hit = self._enum_cache[key] = (valid or enum, (enum, rest))  # refs keep ids unique
        return hit[0]

    def _maybe_example(self, s: dict) -> tuple[Any] | None:
        candidates: list[Any] = []
        if isinstance(s.get("examples"), list):
            candidates.extend(s["examples"][:_EXAMPLES])
        if "default" in s:
            candidates.append(s["default"])
        if not candidates or self.rng.random() >= 0.2:
            return None
        # an example is a sample, not a requirement: a big one is not worth the work
        valid = [c for c in candidates if _json_size(c, _EXAMPLE_BYTES) <= _EXAMPLE_BYTES
                 and not self.validator.errors(c, s)]
        if not valid:
            return None
        return (self._copy(self.rng.choice(valid)),)

    def _choose_type(self, s: dict, minimal: bool) -> str:
        types = _type_list(s)
        if types is None:
            types = [_implied_type(s) or "string"]
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

    def _gen_string(self, s: dict, minimal: bool = False) -> str:
        min_len = _num_at(s, "minLength", 0)
        max_len = _num_at(s, "maxLength", None)
        min_len = max(0, math.ceil(min_len))
        if max_len is not None:
            max_len = max(0, math.floor(max_len))
        # paid before producing anything, so a huge minLength stops here
        self.work.spend(1 + min_len // _BYTES_PER_UNIT)

        def fits(text: str) -> bool:
            return len(text) >= min_len and (max_len is None or len(text) <= max_len)

        pattern = s.get("pattern")
        if isinstance(pattern, str):
            text = _string_from_pattern(pattern, self.rng, min_len, max_len, self.work)
            if text is not None:
                return text
        fmt = s.get("format")
        if isinstance(fmt, str):
            text = self._gen_format(fmt)
            if text is not None and fits(text):
                return text
        words = [self.rng.choice(_WORDS) for _ in range(1 if minimal
                                                        else self.rng.randint(1, 4))]
        size = len(words) - 1 + sum(map(len, words))  # len(" ".join(words)), kept up to date
        while size < min_len:
            word = self.rng.choice(_WORDS)
            words.append(word)
            size += 1 + len(word)
        # Prefer dropping whole words over cutting one in half.
        while max_len is not None and len(words) > 1 and size > max_len:
            size -= 1 + len(words.pop())
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
            # halves first: the span of two huge bounds (±1e308) overflows to inf
            value = round(2 * (flo / 2 + (fhi / 2 - flo / 2) * self.rng.random()), 2)
            if _in_bounds(value, lo, lo_ex, hi, hi_ex):
                return value
        mid = flo / 2 + fhi / 2
        return mid if _in_bounds(mid, lo, lo_ex, hi, hi_ex) else flo

    def _multiple_in_range(
        self, lo: Any, lo_ex: bool, hi: Any, hi_ex: bool, mult: float, *, integer: bool
    ) -> int | float:
        try:
            k_lo = math.ceil(lo / mult)
            k_hi = math.floor(hi / mult)
        except (OverflowError, ValueError):  # bounds over multipleOf beyond a float
            return lo
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
        minimal = self._minimal(depth)
        props = _dict_at(s, "properties")
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
            elif not minimal and self.rng.random() >= self.omit_optional:
                out[name] = self.gen(sub, depth + 1)
                optional_included.append(name)
            else:
                skipped.append(name)
        for name in required:
            if name not in out:
                out[name] = self.gen(self._schema_for_extra_key(s, name), depth + 1)
        min_p = _num_at(s, "minProperties", 0)
        max_p = _num_at(s, "maxProperties", None)
        for name in skipped:
            if len(out) >= min_p:
                break
            out[name] = self.gen(props[name], depth + 1)
            optional_included.append(name)
        counter = 0
        self.work.spend(min(1000, max(0, _count(min_p) - len(out))))  # before the loop
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

    def _schema_for_extra_key(self, s: dict, name: str) -> Any:
        pattern_props = s.get("patternProperties")
        if isinstance(pattern_props, dict):
            for pat, sub in pattern_props.items():
                if isinstance(pat, str) and _pattern_search(pat, name, self.work):
                    return sub
        additional = s.get("additionalProperties", True)
        return additional if isinstance(additional, dict) else {}

    def _gen_array(self, s: dict, depth: int) -> list:
        minimal = self._minimal(depth)
        items = s.get("items", True)
        if isinstance(s.get("prefixItems"), list):
            prefix, rest = s["prefixItems"], items
        elif isinstance(items, list):
            prefix, rest = items, s.get("additionalItems", True)
        else:
            prefix, rest = [], items
        rest_given = "items" in s if not isinstance(items, list) else "additionalItems" in s
        min_i = _num_at(s, "minItems", 0)
        min_i = max(0, math.ceil(min_i))
        max_i = _num_at(s, "maxItems", None)
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
        self.work.spend(count)  # paid before the loop, so a huge minItems stops here
        out: list[Any] = []
        seen: set[Any] = set()
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else rest
            value = self.gen(sub, depth + 1)
            if unique and _canon(value) in seen:
                for _ in range(10):
                    value = self.gen(sub, depth + 1)
                    if _canon(value) not in seen:
                        break
                else:
                    if len(out) >= min_i:
                        break
            if unique:
                seen.add(_canon(value))
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
        value = self.gen(_merge_sub(base, contains, self.work), depth + 1)
        if index == len(out):
            out.append(value)
        else:
            out[index] = value


_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # the integers orjson, so every answer, can encode


def _encodable(value: int | float) -> int | float:
    """``value`` as JSON can carry it: an integer beyond 64 bits becomes the (integral, so
    still ``integer``-valid) float nearest to it; a non-finite float (only possible from
    extreme bounds) becomes 0."""
    if isinstance(value, int) and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        try:
            return float(value)
        except OverflowError:
            return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return value


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


def generate(schema: dict | bool | None, rng: random.Random, *, max_depth: int = 6,
             work: Work | None = None, param: str | None = None,
             omit_optional: float = OMIT_OPTIONAL) -> Any:
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
    * All required properties are present; each optional one is left out with probability
      ``omit_optional`` (a real model fills what the schema describes).
    * Beyond ``max_depth`` nesting levels generation turns minimal (nullable/
      non-recursive branches, no optional properties, ``minItems`` items) so
      recursive schemas terminate.
    * Deterministic: the same schema and the same ``rng`` state give the same value.
    * Bounded: everything is paid from ``work`` (a fresh :class:`Work` if None; pass the
      request's one so all its values share it). A generation turns minimal once it has
      spent a quarter of what was left; running out raises a 400
      :class:`~llmsim.errors.APIError` (``request_too_large``) naming ``param``.
    """
    work = work if work is not None else Work()
    try:
        generator = _Generator(schema, rng, max_depth, work, omit_optional)
        value: Any = None
        for _ in range(_TOP_LEVEL_ATTEMPTS):
            generator.nodes = 0
            value = generator.gen(schema, 0)
            if not generator.validator.errors(value, schema):
                return value
        return value
    except _OverBudget as exc:
        raise _budget_error(param, exc.what) from None
    except RecursionError:  # a pathological unchecked schema: same answer as over budget
        raise _budget_error(param, "depth") from None


def generate_tool_arguments(parameters: dict | None, rng: random.Random, *,
                            work: Work | None = None, param: str | None = None,
                            omit_optional: float = OMIT_OPTIONAL) -> dict:
    """Generate arguments for a function tool whose JSON Schema is ``parameters``.

    ``None`` or an empty schema gives ``{}``.  The result is always a ``dict``
    (a schema without ``type`` is treated as an object schema). ``work`` and ``param``
    as for :func:`generate`.
    """
    if not parameters or not isinstance(parameters, dict):
        return {}
    schema = parameters
    combinators = ("$ref", "anyOf", "oneOf", "allOf", "enum", "const")
    if "type" not in schema and not any(k in schema for k in combinators):
        schema = {**schema, "type": "object"}
    value = generate(schema, rng, work=work, param=param, omit_optional=omit_optional)
    return value if isinstance(value, dict) else {}
