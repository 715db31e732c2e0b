"""JSON Schema driven value generation and validation (a package: limits, the work meter,
helpers, merging, regular expressions, the validator, the check and the generator, each a
module, importing only the ones before it).

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

from ... import errors
from .check import check
from .generate import generate, generate_tool_arguments
from .limits import (
           MAX_ENUM_VALUES,
           MAX_PATTERN_CHARS,
           MAX_REF_EXPANSIONS,
           MAX_REGEX_STATES,
           MAX_SCHEMA_DEPTH,
           MAX_SCHEMA_NODES,
           MAX_SCHEMA_WORK,
           MAX_VALUE_BYTES,
           MAX_VALUE_NODES,
)
from .regex import _pattern_search, _regex
from .validate import validate
from .work import Work, _OverBudget

# (_regex, _pattern_search and _OverBudget: for the script matcher, llmsim.sim.script)
__all__ = ["_regex", "_pattern_search", "_OverBudget", "errors", "Work", "check", "generate", "generate_tool_arguments", "validate",
           "MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES", "MAX_ENUM_VALUES", "MAX_VALUE_BYTES",
           "MAX_VALUE_NODES",
           "MAX_PATTERN_CHARS", "MAX_REGEX_STATES", "MAX_SCHEMA_WORK", "MAX_REF_EXPANSIONS"]
