"""JSON Schema support, schema merging (used for allOf, $ref siblings and anyOf/oneOf branch selection) (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import math
from typing import Any

from .util import _contains_json, _is_multiple_lenient, _is_number, _type_list
from .work import Work

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
