"""JSON Schema support, the generator (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

import datetime as _dt
import ipaddress
import math
import random
import string
import uuid
from typing import Any

from .check import _count
from .limits import (
    _BYTES_PER_UNIT,
    _EXAMPLE_BYTES,
    _EXAMPLES,
    _HARD_DEPTH_SLACK,
    _JSON_TYPES,
    _MAX_FLATTEN_STEPS,
    _MINIMAL_TYPE_ORDER,
    _NODE_BUDGET,
    _NODE_COST,
    _ONEOF_ATTEMPTS,
    _RICH_SHARE,
    _TOP_LEVEL_ATTEMPTS,
    _WORDS,
)
from .merge import _merge, _merge_sub, _normalise
from .regex import _pattern_search, _string_from_pattern
from .util import (
    _canon,
    _copy_json,
    _CostEstimator,
    _dict_at,
    _implied_type,
    _is_multiple,
    _is_number,
    _json_size,
    _num_at,
    _number_bounds,
    _type_list,
)
from .validate import _Validator
from .work import Work, _budget_error, _OverBudget

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
