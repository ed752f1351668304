"""Exact ``AVG`` of NUMERIC and integer arguments, as PostgreSQL computes it.

DuckDB averages a DECIMAL (and an integer) in DOUBLE: ``avg`` of 0.1 and 0.2 is
0.15000000000000002. PostgreSQL's ``avg(numeric)`` and ``avg(integer)`` are
``numeric``. Before a query runs, each ``avg``/``mean`` call (plain, DISTINCT,
FILTER, or as a window function) whose argument DuckDB types as a DECIMAL or an
integer is rewritten into an exact division of ``sum`` by ``count``: the sum's
unscaled digits are divided as HUGEINT and rounded half away from zero (as
PostgreSQL rounds numeric) to ``max(16, scale of the argument)`` decimal places
(PostgreSQL's minimum of 16 significant digits for a quotient), fewer only where
the argument's integer digits leave no room for them in DECIMAL(38). Other arguments
(DOUBLE, REAL, INTERVAL, ...) keep DuckDB's ``avg``.

The argument's type is known only once the query is bound against the views, so
each call is probed first: the call is replaced by a function that accepts only
UUIDs, and DuckDB's binder error names the argument's type. Only SELECT
statements reach this module (the engine refuses others before).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

AVERAGES = frozenset({"avg", "mean"})

#: the fewest decimal places of an exact average (PostgreSQL's NUMERIC_MIN_SIG_DIGITS)
MIN_SCALE = 16
_MAX_PRECISION = 38
_INTEGER_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19, "HUGEINT": 39}
_INTEGER_TYPES = frozenset(_INTEGER_DIGITS)
_MENTIONS_AVERAGE = re.compile(r"\b(avg|mean)\s*\(", re.IGNORECASE)
_PROBE_FUNCTION = "uuid_extract_version"
_PROBED_TYPE = re.compile(_PROBE_FUNCTION + r"\((.+?)\)'")
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def average_scales(type_name: str) -> tuple[int, int] | None:
    """(scale of the argument, scale of its exact average) for a DuckDB type; None keeps DuckDB's avg.

    The average keeps ``max(16, s)`` decimals where its integer digits (at most the argument's)
    leave room in DECIMAL(38), and at least the argument's own ``s``.
    """
    if type_name in _INTEGER_TYPES:
        precision, scale = _INTEGER_DIGITS[type_name], 0
    else:
        match = _DECIMAL.fullmatch(type_name)
        if not match:
            return None
        precision, scale = int(match.group(1)), int(match.group(2))
    room = _MAX_PRECISION - (precision - scale)
    return scale, max(scale, min(max(MIN_SCALE, scale), room))


def exact_average_macro(scale: int, result_scale: int) -> tuple[str, str]:
    """(name, CREATE MACRO statement) of the exact average of a sum with ``scale`` decimals.

    ``S`` is the sum (DECIMAL(38, scale) or HUGEINT), ``n`` the count; the result is
    DECIMAL(38, result_scale), rounded half away from zero. The average of no rows is NULL.
    """
    extra = result_scale - scale
    name = f"__hp_exact_avg_{scale}_{result_scale}"
    ten = f"CAST('{10 ** extra}' AS HUGEINT)"
    u = "CAST(replace(CAST(S AS VARCHAR), '.', '') AS HUGEINT)" if scale else "CAST(S AS HUGEINT)"
    # quotient and remainder first, so the scaled remainder (< n * 10^extra) never overflows
    r = f"(({u}) // n * {ten} + (2 * (({u}) % n) * {ten} + sign({u}) * n) // (2 * n))"
    plain = f"CAST(abs({r}) AS VARCHAR)"
    # lpad cuts a longer string: pad only up to the scale's width
    digits = f"lpad({plain}, CAST(greatest(length({plain}), {result_scale + 1}) AS INTEGER), '0')"
    text = (f"(CASE WHEN {r} < 0 THEN '-' ELSE '' END) || left({digits}, -{result_scale}) || '.' || "
            f"right({digits}, {result_scale})")
    body = f"CAST({text} AS DECIMAL({_MAX_PRECISION}, {result_scale}))"
    return name, f"CREATE OR REPLACE TEMP MACRO {name}(S, n) AS CASE WHEN n = 0 THEN NULL ELSE {body} END"


def rewrite_exact_averages(con: duckdb.DuckDBPyConnection, query: str) -> str:
    """``query`` with every exactly computable average made exact (macros created on ``con``)."""
    return exact_average_rewrite(con, query).query


@dataclass(frozen=True)
class ExactRewrite:
    """A query with its averages made exact, and the TEMP macros it calls (already created on the
    cursor that probed it; another cursor of the same views runs ``macros`` first)."""

    query: str
    macros: tuple[str, ...] = ()


def exact_average_rewrite(con: duckdb.DuckDBPyConnection, query: str) -> ExactRewrite:
    """Probe and rewrite ``query``'s averages on ``con``; a query naming no avg/mean costs nothing."""
    if not _MENTIONS_AVERAGE.search(query):
        return ExactRewrite(query)
    tree = _serialize(con, query)
    if tree is None:
        return ExactRewrite(query)
    calls = list(_average_calls(tree))
    if not calls:
        return ExactRewrite(query)
    scales: list[tuple[int, int] | None] = []
    for index in range(len(calls)):
        probe = copy.deepcopy(tree)
        node = list(_average_calls(probe))[index]
        scales.append(_probe_scale(con, probe, node))
    if all(s is None for s in scales):
        return ExactRewrite(query)
    created: dict[tuple[int, int], str] = {}
    for node, scale in zip(calls, scales, strict=True):
        if scale is None:
            continue
        name, statement = exact_average_macro(*scale)
        if scale not in created:
            con.execute(statement)
            created[scale] = statement
        _replace_in_place(node, _exact_call(node, name))
    rewritten = _deserialize(con, tree)
    return ExactRewrite(rewritten, tuple(created.values())) if rewritten is not None else ExactRewrite(query)


def _serialize(con: duckdb.DuckDBPyConnection, query: str) -> dict[str, Any] | None:
    try:
        row = con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0]
    except duckdb.Error:
        return None
    tree = json.loads(row)
    return None if tree.get("error") else tree


def _deserialize(con: duckdb.DuckDBPyConnection, tree: dict[str, Any]) -> str | None:
    try:
        return con.execute("SELECT json_deserialize_sql(?)", [json.dumps(tree)]).fetchall()[0][0]
    except duckdb.Error:
        return None


def _average_calls(node: Any) -> Iterator[dict[str, Any]]:
    """Every one-argument avg/mean call (aggregate or window), outermost first."""
    if isinstance(node, dict):
        if (node.get("class") in ("FUNCTION", "WINDOW") and str(node.get("function_name", "")).lower() in AVERAGES
                and not node.get("schema") and len(node.get("arguments") or node.get("children") or []) == 1):
            yield node
        for value in node.values():
            yield from _average_calls(value)
    elif isinstance(node, list):
        for item in node:
            yield from _average_calls(item)


def _renamed(node: dict[str, Any], function: str) -> dict[str, Any]:
    other = copy.deepcopy(node)
    other["function_name"] = function
    if "qualified_name" in other:
        other["qualified_name"] = {"path": [function]}
    other["alias"] = ""
    return other


def _call(function: str, arguments: list[dict[str, Any]], alias: str = "") -> dict[str, Any]:
    return {
        "class": "FUNCTION", "type": "FUNCTION", "alias": alias, "query_location": 18446744073709551615,
        "function_name": function, "schema": "", "filter": None,
        "order_bys": {"type": "ORDER_MODIFIER", "orders": []}, "distinct": False, "is_operator": False,
        "export_state": False, "catalog": "",
        "arguments": [{"name": "", "expression": a} for a in arguments],
        "qualified_name": {"path": [function]},
    }


def _probe_scale(
    con: duckdb.DuckDBPyConnection, tree: dict[str, Any], node: dict[str, Any]
) -> tuple[int, int] | None:
    """Bind the query with this average's argument handed to a UUID-only function: the binder's
    error names the argument's type (no error: a UUID or NULL argument, nothing to make exact)."""
    _replace_in_place(node, _call(_PROBE_FUNCTION, [_renamed(node, "any_value")]))
    probe = _deserialize(con, tree)
    if probe is None:
        return None
    try:
        con.sql(probe).types  # noqa: B018 (binding is the point)
    except duckdb.BinderException as exc:
        match = _PROBED_TYPE.search(str(exc))
        return average_scales(match.group(1)) if match else None
    except duckdb.Error:
        return None
    return None


def _exact_call(node: dict[str, Any], macro: str) -> dict[str, Any]:
    return _call(macro, [_renamed(node, "sum"), _renamed(node, "count")], alias=node.get("alias", ""))


def _replace_in_place(node: dict[str, Any], replacement: dict[str, Any]) -> None:
    node.clear()
    node.update(replacement)
