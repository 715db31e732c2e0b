"""JSON Schema support, the work meter and the errors it raises (see the package doc, :mod:`llmsim.sim.schema`)."""

from __future__ import annotations

from ... import errors
from .limits import _VALIDATE_DEPTH, MAX_REF_EXPANSIONS, MAX_SCHEMA_NODES, MAX_SCHEMA_WORK

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
