"""JSON Schema support, limits: the work one request's schemas may cost (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

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
