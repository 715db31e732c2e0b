"""Tests for llmsim.sim.schema (JSON Schema value generation + validation)."""

from __future__ import annotations

import copy
import datetime as dt
import ipaddress
import json
import re
import uuid
from random import Random
from typing import Any

import pytest

from llmsim.sim.schema import generate, generate_tool_arguments, validate

SEEDS = range(20)


def gen(schema: Any, seed: int = 0, **kwargs: Any) -> Any:
    return generate(schema, Random(seed), **kwargs)


def many(schema: Any, n: int = 20, **kwargs: Any) -> list[Any]:
    return [gen(schema, seed, **kwargs) for seed in range(n)]


def assert_valid(value: Any, schema: Any) -> None:
    errors = validate(value, schema)
    assert errors == [], f"{value!r} invalid against {schema!r}: {errors}"


# ---------------------------------------------------------------------------
# a corpus of varied schemas for the property-style tests
# ---------------------------------------------------------------------------

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name", "children"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

LINKED_LIST = {
    "definitions": {
        "item": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "next": {"anyOf": [{"$ref": "#/definitions/item"}, {"type": "null"}]},
            },
            "required": ["value", "next"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/definitions/item",
}

EXPR = {  # mutually recursive, oneOf with const discriminators
    "$defs": {
        "num": {
            "type": "object",
            "properties": {"kind": {"const": "num"}, "value": {"type": "number"}},
            "required": ["kind", "value"],
            "additionalProperties": False,
        },
        "binop": {
            "type": "object",
            "properties": {
                "kind": {"const": "binop"},
                "op": {"enum": ["+", "-", "*", "/"]},
                "left": {"$ref": "#/$defs/expr"},
                "right": {"$ref": "#/$defs/expr"},
            },
            "required": ["kind", "op", "left", "right"],
            "additionalProperties": False,
        },
        "expr": {"oneOf": [{"$ref": "#/$defs/binop"}, {"$ref": "#/$defs/num"}]},
    },
    "$ref": "#/$defs/expr",
}

OPENAI_STRICT = {  # the shape OpenAI strict structured outputs use
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City name"},
        "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "details": {
            "type": "object",
            "properties": {
                "humidity": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["humidity", "tags"],
            "additionalProperties": False,
        },
    },
    "required": ["location", "unit", "days", "details"],
    "additionalProperties": False,
}

PYDANTIC_LIKE = {
    "$defs": {
        "Address": {
            "properties": {
                "street": {"title": "Street", "type": "string"},
                "zip": {"title": "Zip", "type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "zip"],
            "title": "Address",
            "type": "object",
        },
        "Role": {"enum": ["admin", "user", "guest"], "title": "Role", "type": "string"},
    },
    "properties": {
        "name": {"title": "Name", "type": "string", "minLength": 2, "maxLength": 20},
        "age": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": None},
        "role": {"$ref": "#/$defs/Role"},
        "addresses": {"type": "array", "items": {"$ref": "#/$defs/Address"}, "maxItems": 3},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "role", "addresses"],
    "title": "User",
    "type": "object",
}

CORPUS: list[Any] = [
    {},
    {"type": "string"},
    {"type": "integer"},
    {"type": "number", "minimum": -5.5, "exclusiveMaximum": 2},
    {"type": "boolean"},
    {"type": "null"},
    {"type": ["string", "null"]},
    {"type": ["integer", "string", "boolean"]},
    {"enum": ["red", "green", "blue"]},
    {"enum": [1, "two", None, [3], {"four": 4}]},
    {"const": {"fixed": [1, 2, 3]}},
    {"type": "string", "minLength": 12, "maxLength": 15},
    {"type": "string", "maxLength": 3},
    {"type": "string", "pattern": r"^[A-Z]{2}-\d{3,5}$"},
    {"type": "string", "pattern": r"^(red|green|blue)(-[a-z]+)?$"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "integer", "minimum": 10, "maximum": 20, "multipleOf": 3},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.05},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    {"type": "array", "items": {"enum": [1, 2, 3, 4, 5, 6]}, "uniqueItems": True, "minItems": 3},
    {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": False,
    },
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"properties": {"x": {"type": "number"}}, "required": ["x"]},
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
            },
            "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["matrix", "meta"],
    },
    {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
    {"oneOf": [{"type": "integer", "maximum": -1}, {"type": "string", "maxLength": 4}]},
    {
        "allOf": [
            {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
            {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        ]
    },
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "boolean"}},
    TREE,
    LINKED_LIST,
    EXPR,
    OPENAI_STRICT,
    PYDANTIC_LIKE,
]


# ---------------------------------------------------------------------------
# property-style: every generated value validates
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("schema", CORPUS, ids=lambda s: json.dumps(s)[:60])
def test_generated_values_validate(schema: Any) -> None:
    for seed in SEEDS:
        value = gen(schema, seed)
        json.dumps(value)  # JSON-serialisable
        assert_valid(value, schema)


@pytest.mark.parametrize("max_depth", [0, 1, 3, 6])
@pytest.mark.parametrize("schema", [TREE, LINKED_LIST, EXPR], ids=["tree", "list", "expr"])
def test_recursive_schemas_terminate_at_any_depth(schema: Any, max_depth: int) -> None:
    for seed in SEEDS:
        assert_valid(gen(schema, seed, max_depth=max_depth), schema)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def test_max_depth_bounds_nesting() -> None:
    for seed in SEEDS:
        assert _depth(gen(TREE, seed, max_depth=2)) <= 4
        assert _depth(gen(LINKED_LIST, seed, max_depth=3)) <= 5


def test_jsonschema_agrees_generated_values_are_valid() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator_cls = jsonschema.Draft202012Validator
    for schema in CORPUS:
        validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
        for seed in SEEDS:
            value = gen(schema, seed)
            errors = [e.message for e in validator.iter_errors(value)]
            assert errors == [], f"{value!r} vs {schema!r}: {errors}"


# ---------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [OPENAI_STRICT, PYDANTIC_LIKE, TREE, EXPR])
def test_deterministic(schema: Any) -> None:
    for seed in range(5):
        assert gen(schema, seed) == gen(schema, seed)
    rng_a, rng_b = Random(7), Random(7)
    assert [generate(schema, rng_a) for _ in range(5)] == [
        generate(schema, rng_b) for _ in range(5)
    ]


def test_different_seeds_vary() -> None:
    values = {json.dumps(gen(OPENAI_STRICT, seed), sort_keys=True) for seed in SEEDS}
    assert len(values) > 10


def test_does_not_mutate_schema() -> None:
    for schema in CORPUS:
        before = copy.deepcopy(schema)
        gen(schema, 3)
        validate(gen(schema, 4), schema)
        assert schema == before


def test_does_not_touch_global_random() -> None:
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    gen(PYDANTIC_LIKE, 1)
    assert random.random() == expected


# ---------------------------------------------------------------------------
# keyword coverage: generation
# ---------------------------------------------------------------------------

WORD_STRING = re.compile(r"^[a-z]+( [a-z]+){0,3}$")


@pytest.mark.parametrize("schema", [{}, None, True, {"type": "string"}, {"description": "x"}])
def test_empty_and_plain_string_schema_gives_short_words(schema: Any) -> None:
    for value in many(schema):
        assert isinstance(value, str)
        assert WORD_STRING.match(value), value


def test_false_schema_gives_none_without_crashing() -> None:
    assert gen(False) is None


@pytest.mark.parametrize(
    ("type_name", "check"),
    [
        ("string", lambda v: isinstance(v, str)),
        ("integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
        ("number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
        ("boolean", lambda v: isinstance(v, bool)),
        ("null", lambda v: v is None),
        ("object", lambda v: isinstance(v, dict)),
        ("array", lambda v: isinstance(v, list)),
    ],
)
def test_single_types(type_name: str, check: Any) -> None:
    assert all(check(v) for v in many({"type": type_name}))


def test_boolean_takes_both_values() -> None:
    assert set(many({"type": "boolean"}, 30)) == {True, False}


def test_type_list_with_null_yields_both() -> None:
    values = many({"type": ["string", "null"]}, 60)
    assert None in values
    assert any(isinstance(v, str) for v in values)


def test_nullable_openapi_style() -> None:
    schema = {"type": "integer", "nullable": True}
    values = many(schema, 60)
    assert None in values
    assert any(isinstance(v, int) for v in values)
    assert all(validate(v, schema) == [] for v in values)


def test_properties_required_and_optional() -> None:
    schema = {
        "type": "object",
        "properties": {
            "req": {"type": "string"},
            "opt1": {"type": "integer"},
            "opt2": {"type": "boolean"},
        },
        "required": ["req"],
    }
    values = many(schema, 100)
    assert all("req" in v for v in values)
    with_opt = sum("opt1" in v for v in values)
    assert 85 <= with_opt < 100  # filled, as a real model does; left out now and then (5%)
    assert any(set(v) == {"req", "opt1", "opt2"} for v in values)
    # the omission chance is a parameter: 1.0 never fills an optional property
    assert all(set(v) == {"req"} for v in many(schema, 20, omit_optional=1.0))


def test_missing_type_with_properties_is_object() -> None:
    value = gen({"properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert isinstance(value, dict) and isinstance(value["a"], int)


def test_property_order_follows_schema() -> None:
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer"} for k in "zyxw"},
        "required": list("wxyz"),
    }
    assert list(gen(schema)) == list("zyxw")


def test_additional_properties_false_only_listed() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": False,
        "minProperties": 0,
    }
    for value in many(schema):
        assert set(value) <= {"a"}


def test_additional_properties_schema_used_for_extra_keys() -> None:
    schema = {"type": "object", "minProperties": 3, "additionalProperties": {"type": "integer"}}
    for value in many(schema):
        assert len(value) >= 3
        assert all(isinstance(v, int) for v in value.values())


def test_max_properties_drops_optional() -> None:
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer"} for k in "abcdef"},
        "required": ["a"],
        "maxProperties": 2,
    }
    for value in many(schema):
        assert "a" in value and len(value) <= 2


def test_enum_and_const() -> None:
    assert set(many({"enum": ["a", "b", "c"]}, 40)) == {"a", "b", "c"}
    assert gen({"const": [1, {"x": None}]}) == [1, {"x": None}]
    assert gen({"type": "string", "const": "fixed"}) == "fixed"


def test_enum_filtered_by_type() -> None:
    schema = {"type": "string", "enum": ["a", 1, None, "b"]}
    assert set(many(schema, 40)) == {"a", "b"}


def test_array_items_and_bounds() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5}
    lengths = set()
    for value in many(schema, 40):
        assert 2 <= len(value) <= 5
        assert all(isinstance(x, int) for x in value)
        lengths.add(len(value))
    assert len(lengths) > 1


def test_array_exact_length() -> None:
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 7, "maxItems": 7}
    assert all(len(v) == 7 for v in many(schema))


def test_prefix_items() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}],
        "items": False,
    }
    for value in many(schema):
        assert len(value) == 3
        assert [type(x) for x in value] == [str, int, bool]


def test_tuple_items_draft7_form() -> None:
    schema = {
        "type": "array",
        "items": [{"type": "integer"}, {"const": "x"}],
        "additionalItems": False,
    }
    for value in many(schema):
        assert_valid(value, schema)
        assert len(value) <= 2


def test_unique_items() -> None:
    schema = {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 3}
    for value in many(schema):
        assert sorted(value) == [1, 2, 3]


def test_contains() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 42}}
    for value in many(schema):
        assert 42 in value


def test_string_lengths() -> None:
    for lo, hi in [(0, 0), (1, 1), (5, 8), (30, 40), (100, None)]:
        schema: dict[str, Any] = {"type": "string", "minLength": lo}
        if hi is not None:
            schema["maxLength"] = hi
        for value in many(schema):
            assert len(value) >= lo
            assert hi is None or len(value) <= hi


@pytest.mark.parametrize(
    "pattern",
    [
        r"^[A-Z]{3}-\d{4}$",
        r"^\d{5}(-\d{4})?$",
        r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$",
        r"^(foo|bar|baz)+$",
        r"^#[0-9a-fA-F]{6}$",
        r"^\+?[1-9]\d{1,14}$",
        r"^[^\s]+$",
        r"^\w+\s\w+$",
        r"abc",
        r"^sk-[A-Za-z0-9]{20}$",
        r"^v\d+\.\d+\.\d+$",
        r"^(\w)\1$",
    ],
)
def test_pattern_generates_matching_strings(pattern: str) -> None:
    for value in many({"type": "string", "pattern": pattern}):
        assert re.search(pattern, value), (pattern, value)


@pytest.mark.parametrize("pattern", [r"\p{L}+", r"(?<=a", "[", r"^(?!x).*$"])
def test_odd_or_invalid_patterns_never_crash(pattern: str) -> None:
    for value in many({"type": "string", "pattern": pattern}, 5):
        assert isinstance(value, str)


def test_pattern_with_length() -> None:
    schema = {"type": "string", "pattern": r"^[a-z]+$", "minLength": 3, "maxLength": 4}
    for value in many(schema):
        assert_valid(value, schema)


def test_formats() -> None:
    for value in many({"type": "string", "format": "date-time"}):
        dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    for value in many({"type": "string", "format": "date"}):
        dt.date.fromisoformat(value)
    for value in many({"type": "string", "format": "time"}):
        assert re.match(r"^\d{2}:\d{2}:\d{2}(Z|[+-]\d{2}:\d{2})$", value)
    for value in many({"type": "string", "format": "email"}):
        assert re.match(r"^[^@\s]+@[^@\s]+\.[a-z]+$", value)
    for value in many({"type": "string", "format": "uri"}):
        assert value.startswith(("http://", "https://"))
    for value in many({"type": "string", "format": "uuid"}):
        assert uuid.UUID(value).version == 4
    for value in many({"type": "string", "format": "ipv4"}):
        ipaddress.IPv4Address(value)
    for value in many({"type": "string", "format": "ipv6"}):
        ipaddress.IPv6Address(value)


def test_unknown_format_is_plain_string() -> None:
    assert isinstance(gen({"type": "string", "format": "bogus"}), str)


def test_numeric_bounds() -> None:
    cases: list[dict[str, Any]] = [
        {"type": "integer", "minimum": 5, "maximum": 5},
        {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 7},
        {"type": "integer", "minimum": -1000, "maximum": -990},
        {"type": "integer", "minimum": 10**12},
        {"type": "integer", "maximum": -3},
        {"type": "number", "minimum": 0.1, "maximum": 0.2},
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.001},
        {"type": "number", "minimum": 1e6},
        {"type": "integer", "minimum": 1.5, "maximum": 3.5},
        {"type": "number", "minimum": 0, "maximum": 10, "exclusiveMinimum": True},  # draft-4
    ]
    for schema in cases:
        for value in many(schema):
            assert_valid(value, schema)
    assert set(many({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 7})) == {6}


def test_multiple_of() -> None:
    for value in many({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 100}):
        assert value % 7 == 0 and 1 <= value <= 100
    for value in many({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1}):
        assert abs(value * 100 - round(value * 100)) < 1e-9
    schema = {"type": "integer", "multipleOf": 2.5, "minimum": 0, "maximum": 50}
    for value in many(schema):
        assert isinstance(value, int) and value % 5 == 0


def test_any_of_picks_each_branch() -> None:
    schema = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
    kinds = {type(v).__name__ for v in many(schema, 60)}
    assert kinds == {"int", "str", "NoneType"}


def test_any_of_merges_with_sibling_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "required": ["kind"],
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    for value in many(schema):
        assert "kind" in value and ("a" in value or "b" in value)


def test_one_of_exclusive() -> None:
    schema = {"oneOf": [{"type": "number"}, {"type": "integer"}]}  # ints match both
    for value in many(schema):
        assert isinstance(value, float) and not float(value).is_integer()
        assert_valid(value, schema)


def test_all_of_merges() -> None:
    schema = {
        "allOf": [
            {"type": "integer", "minimum": 0, "maximum": 100},
            {"minimum": 50},
            {"multipleOf": 5},
        ]
    }
    for value in many(schema):
        assert 50 <= value <= 100 and value % 5 == 0


def test_all_of_with_refs_and_nested_any_of() -> None:
    schema = {
        "$defs": {
            "Base": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            },
            "Named": {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        },
        "allOf": [
            {"$ref": "#/$defs/Base"},
            {"$ref": "#/$defs/Named"},
            {"anyOf": [{"required": ["x"]}, {"required": ["y"]}]},
            {"anyOf": [{"required": ["p"]}, {"required": ["q"]}]},
        ],
    }
    for value in many(schema):
        assert_valid(value, schema)
        assert {"id", "name"} <= set(value)


def test_refs_definitions_and_defs() -> None:
    schema = {
        "$defs": {"A": {"type": "integer", "minimum": 3, "maximum": 3}},
        "definitions": {"B": {"type": "string", "const": "b"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/definitions/B"}},
        "required": ["a", "b"],
    }
    assert gen(schema) == {"a": 3, "b": "b"}


def test_ref_with_escaped_pointer_and_root_ref() -> None:
    schema = {
        "$defs": {"a/b": {"const": 1}, "c~d": {"const": 2}},
        "type": "object",
        "properties": {
            "x": {"$ref": "#/$defs/a~1b"},
            "y": {"$ref": "#/$defs/c~0d"},
            "self": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["x", "y"],
    }
    for value in many(schema):
        assert value["x"] == 1 and value["y"] == 2
        assert_valid(value, schema)


def test_unresolvable_ref_does_not_crash() -> None:
    assert isinstance(gen({"$ref": "#/$defs/missing"}), str)
    assert isinstance(gen({"$ref": "https://example.com/schema.json"}), str)


def test_recursive_tree_has_some_depth() -> None:
    depths = [_depth(gen(TREE, seed)) for seed in range(40)]
    assert max(depths) >= 3  # recursion actually happens
    assert all(d <= 2 * 6 + 2 for d in depths)


def test_default_and_examples_may_be_used() -> None:
    schema = {"type": "string", "examples": ["EXAMPLE"], "default": "DEFAULT"}
    values = many(schema, 80)
    assert "EXAMPLE" in values or "DEFAULT" in values
    assert any(v not in ("EXAMPLE", "DEFAULT") for v in values)


def test_invalid_default_is_not_used() -> None:
    schema = {"type": "integer", "minimum": 0, "default": "nope", "examples": [-5]}
    for value in many(schema, 60):
        assert isinstance(value, int) and value >= 0


def test_weird_schemas_never_crash() -> None:
    weird: list[Any] = [
        {"type": "frobnicate"},
        {"type": []},
        {"type": "array", "items": False, "minItems": 2},  # unsatisfiable
        {"type": "object", "required": ["a"], "properties": {"a": False}},
        {"type": "integer", "minimum": 10, "maximum": 1},
        {"type": "string", "minLength": 10, "maxLength": 2},
        {"enum": []},
        {"anyOf": []},
        {"anyOf": [False, {"type": "integer"}]},
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"$defs": {"loop": {"$ref": "#/$defs/loop"}}, "$ref": "#/$defs/loop"},
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"n": {"$ref": "#/$defs/n"}},
                    "required": ["n"],
                }
            },
            "$ref": "#/$defs/n",
        },
        {"type": "number", "multipleOf": 0.3, "minimum": 0.1, "maximum": 0.2},
        {"not": {"type": "string"}},
    ]
    for schema in weird:
        for value in many(schema, 5):
            json.dumps(value)


# ---------------------------------------------------------------------------
# generate_tool_arguments
# ---------------------------------------------------------------------------


def test_tool_arguments_empty() -> None:
    assert generate_tool_arguments(None, Random(0)) == {}
    assert generate_tool_arguments({}, Random(0)) == {}
    assert generate_tool_arguments({"type": "object", "properties": {}}, Random(0)) == {}


def test_tool_arguments_object() -> None:
    params = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    }
    for seed in SEEDS:
        args = generate_tool_arguments(params, Random(seed))
        assert isinstance(args, dict) and "city" in args
        assert_valid(args, params)


def test_tool_arguments_without_type_or_non_object() -> None:
    args = generate_tool_arguments(
        {"properties": {"q": {"type": "string"}}, "required": ["q"]}, Random(1)
    )
    assert isinstance(args, dict) and isinstance(args["q"], str)
    assert generate_tool_arguments({"type": "string"}, Random(1)) == {}


def test_tool_arguments_deterministic() -> None:
    a = generate_tool_arguments(PYDANTIC_LIKE, Random(9))
    b = generate_tool_arguments(PYDANTIC_LIKE, Random(9))
    assert a == b
    assert_valid(a, PYDANTIC_LIKE)


# ---------------------------------------------------------------------------
# validator honesty
# ---------------------------------------------------------------------------

INVALID_CASES: list[tuple[Any, Any]] = [
    (1, {"type": "string"}),
    (True, {"type": "integer"}),
    (True, {"type": "number"}),
    (1.5, {"type": "integer"}),
    ("x", {"type": ["integer", "null"]}),
    (None, {"type": "object"}),
    ({}, {"type": "object", "required": ["a"]}),
    ({"a": 1, "b": 2}, {"type": "object", "properties": {"a": {}}, "additionalProperties": False}),
    ({"a": "x"}, {"properties": {"a": {"type": "integer"}}}),
    ({"k": "x"}, {"type": "object", "additionalProperties": {"type": "integer"}}),
    ("d", {"enum": ["a", "b"]}),
    (1, {"enum": [True]}),
    (True, {"const": 1}),
    ({"a": 1}, {"const": {"a": 2}}),
    ("ab", {"type": "string", "minLength": 3}),
    ("abcd", {"type": "string", "maxLength": 3}),
    ("abc", {"type": "string", "pattern": "^[0-9]+$"}),
    (4, {"type": "integer", "minimum": 5}),
    (5, {"type": "integer", "exclusiveMinimum": 5}),
    (6, {"type": "number", "maximum": 5.5}),
    (5, {"type": "number", "exclusiveMaximum": 5}),
    (7, {"type": "integer", "multipleOf": 2}),
    ([], {"type": "array", "minItems": 1}),
    ([1, 2, 3], {"type": "array", "maxItems": 2}),
    ([1, "x"], {"type": "array", "items": {"type": "integer"}}),
    ([1, 1], {"type": "array", "uniqueItems": True}),
    (["a", "b", 3], {"prefixItems": [{"type": "string"}], "items": {"type": "string"}}),
    (["a", "b"], {"prefixItems": [{"type": "string"}], "items": False}),
    ([1, 2], {"type": "array", "contains": {"type": "string"}}),
    (1.5, {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
    (3, {"oneOf": [{"type": "integer"}, {"type": "number"}]}),
    ("x", {"oneOf": [{"type": "integer"}, {"type": "number"}]}),
    (3, {"allOf": [{"type": "integer"}, {"minimum": 4}]}),
    ("x", {"not": {"type": "string"}}),
    ("x", {"$defs": {"I": {"type": "integer"}}, "$ref": "#/$defs/I"}),
    (
        {"n": {"n": 1}},
        {
            "definitions": {
                "N": {"type": "object", "properties": {"n": {"$ref": "#/definitions/N"}}}
            },
            "$ref": "#/definitions/N",
        },
    ),
    ("not-a-date", {"type": "string", "format": "date"}),
    ("2024-13-45", {"type": "string", "format": "date"}),
    ("999.1.1.1", {"type": "string", "format": "ipv4"}),
    ("nope", {"type": "string", "format": "uuid"}),
    ({"a": 1}, {"type": "object", "minProperties": 2}),
    ({"a": 1, "b": 2}, {"type": "object", "maxProperties": 1}),
    (1, False),
]

VALID_CASES: list[tuple[Any, Any]] = [
    ("anything", {}),
    (None, None),
    ([1, {"a": None}], True),
    (1.0, {"type": "integer"}),
    (3, {"type": "number"}),
    (None, {"type": ["string", "null"]}),
    (None, {"type": "string", "nullable": True}),
    ({"a": 1, "zzz": "extra"}, {"type": "object", "properties": {"a": {"type": "integer"}}}),
    (1.0, {"enum": [1]}),
    (0.3, {"type": "number", "multipleOf": 0.1}),
    (5, {"type": "integer", "minimum": 5, "maximum": 5}),
    (["a", 1, True], {"prefixItems": [{"type": "string"}, {"type": "integer"}]}),
    ([1, "x"], {"type": "array", "contains": {"type": "string"}}),
    (3, {"oneOf": [{"type": "integer"}, {"type": "string"}]}),
    (
        {"n": {"n": {}}},
        {
            "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}},
            "$ref": "#/$defs/N",
        },
    ),
    ("2024-02-29T10:00:00Z", {"type": "string", "format": "date-time"}),
    ("whatever", {"type": "string", "format": "not-a-known-format"}),
    (
        {"p_1": 1},
        {
            "type": "object",
            "patternProperties": {"^p_": {"type": "integer"}},
            "additionalProperties": False,
        },
    ),
]


@pytest.mark.parametrize(("instance", "schema"), INVALID_CASES, ids=lambda x: json.dumps(x)[:40])
def test_validate_rejects(instance: Any, schema: Any) -> None:
    errors = validate(instance, schema)
    assert errors and all(isinstance(e, str) for e in errors)


@pytest.mark.parametrize(("instance", "schema"), VALID_CASES, ids=lambda x: json.dumps(x)[:40])
def test_validate_accepts(instance: Any, schema: Any) -> None:
    assert validate(instance, schema) == []


def test_validate_error_paths() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "object", "required": ["name"]}}
        },
    }
    errors = validate({"items": [{"name": "a"}, {}]}, schema)
    assert len(errors) == 1 and errors[0].startswith("$.items[1]") and "name" in errors[0]


def test_validate_unresolvable_ref_is_error() -> None:
    assert validate(1, {"$ref": "#/$defs/nope"})


def test_validate_ref_loop_terminates() -> None:
    schema = {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    }
    assert validate(1, schema) == []


def test_validator_agrees_with_jsonschema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    cls = jsonschema.Draft202012Validator
    skip_keywords = ("nullable", '"exclusiveMinimum": true', '"format"', "additionalItems")
    for instance, schema in INVALID_CASES + VALID_CASES:
        if any(k in json.dumps(schema) for k in skip_keywords):
            continue
        if isinstance(schema, dict) and isinstance(schema.get("items"), list):
            continue
        ours = validate(instance, schema) == []
        theirs = cls(schema if schema is not None else {}).is_valid(instance)
        if schema == {"type": "number", "multipleOf": 0.1}:
            continue  # we are deliberately lenient about binary float noise
        assert ours == theirs, (instance, schema)
