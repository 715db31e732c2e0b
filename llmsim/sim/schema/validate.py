"""JSON Schema support, the validator (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import datetime as _dt
import ipaddress
import re
from typing import Any

from .limits import _NODE_COST, _VALIDATE_DEPTH
from .regex import _pattern_search
from .util import (
    _canon,
    _dict_at,
    _is_multiple_lenient,
    _is_number,
    _is_type,
    _json_equal,
    _json_type,
    _number_bounds,
    _Refs,
    _short,
    _type_list,
)
from .work import _BUDGET_WHAT, Work, _OverBudget

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
