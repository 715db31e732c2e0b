"""JSON Schema support, check: refuse a client's schema before anything is generated (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import math
from typing import Any

from ... import errors
from .limits import (
    _JSON_TYPES,
    _SAT,
    MAX_ENUM_VALUES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    MAX_VALUE_BYTES,
    MAX_VALUE_NODES,
)
from .regex import _regex
from .util import _implied_type, _is_number, _json_size, _resolve_pointer, _short, _type_list
from .work import Work

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
