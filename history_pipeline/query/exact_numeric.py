"""Exact NUMERIC division and ``AVG``, as PostgreSQL computes them.

DuckDB divides a DECIMAL (``/``) and averages it (``avg``) in DOUBLE: ``1.0 / 3`` is
0.3333333333333333 and ``avg`` of 0.1 and 0.2 is 0.15000000000000002. PostgreSQL's ``numeric``
division and ``avg(numeric)``/``avg(integer)`` are exact decimals whose scale (digits after the
point) depends on the values (``select_div_scale``): at least 16 significant digits, at least
either operand's scale, at most 1000. Before a query runs, each such expression is rewritten:

- ``a / b`` where one operand is a DECIMAL and the other a DECIMAL or an integer (integer /
  integer stays integer division, as in PostgreSQL; a DOUBLE operand keeps DuckDB's DOUBLE);
- ``avg``/``mean`` (plain, DISTINCT, FILTER or window) of a DECIMAL or an integer, as
  ``sum / count`` divided the same way (the average of no rows is NULL).

The quotient is computed on the operands' unscaled digits as HUGEINT, at PostgreSQL's scale for
that row, rounded half away from zero. Inside an expression it is a ``DECIMAL(38, S)`` (DuckDB's
widest exact type; ``S`` from the operands' types, see :func:`result_scale`); a row whose
PostgreSQL scale exceeds ``S`` or whose digits exceed 38 is a typed error, never a rounded value.
A quotient that is itself a column of the result also comes back as text with PostgreSQL's own
digits (any scale), which the engine hands back as the exact NUMERIC of each row.

Operand types are known only once the query is bound, so each operand is probed first: it is
handed to a function that accepts only UUIDs, and DuckDB's binder error names its type. Only
SELECT statements reach this module (the engine refuses others before).
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

#: PostgreSQL's NUMERIC_MIN_SIG_DIGITS: a quotient keeps at least this many significant digits
MIN_SIG_DIGITS = 16
#: the scale a quotient inside an expression gets at least (PostgreSQL's scale of any quotient
#: between 0.0001 and 10^16 when its operands' scales are at most 20)
MIN_RESULT_SCALE = 20
MAX_PRECISION = 38
#: where the hidden text column of a quotient in the result is named (then dropped)
TEXT_COLUMN = "__hp_exact_text_"

_INTEGER_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19, "HUGEINT": 39,
                   "UTINYINT": 3, "USMALLINT": 5, "UINTEGER": 10, "UBIGINT": 20, "UHUGEINT": 39}
_MENTIONS = re.compile(r"\b(avg|mean)\s*\(|/", re.IGNORECASE)
_PROBE_FUNCTION = "uuid_extract_version"
_PROBED_TYPE = re.compile(_PROBE_FUNCTION + r"\((.+?)\[\]\)'")
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")
_POWERS = "[" + ", ".join(f"CAST('{10 ** k}' AS HUGEINT)" for k in range(39)) + "]"


@dataclass(frozen=True)
class Exact:
    """A DuckDB type as an exact number: its precision and scale (an integer has scale 0)."""

    precision: int
    scale: int
    integer: bool


def exact_type(type_name: str) -> Exact | None:
    """The precision and scale of a DuckDB DECIMAL or integer type; None for any other type."""
    if type_name in _INTEGER_DIGITS:
        return Exact(_INTEGER_DIGITS[type_name], 0, True)
    match = _DECIMAL.fullmatch(type_name)
    return Exact(int(match.group(1)), int(match.group(2)), False) if match else None


def result_scale(left: Exact, right: Exact, average: bool = False) -> int:
    """``S``, the scale of the DECIMAL(38, S) a quotient is inside an expression.

    At least either operand's scale and ``MIN_RESULT_SCALE``; an average keeps room for the integer
    digits of its argument (``left`` is the argument: the mean never exceeds it).
    """
    wanted = max(MIN_RESULT_SCALE, left.scale, right.scale)
    if average:
        wanted = max(left.scale, min(wanted, MAX_PRECISION - (left.precision - left.scale)))
    return min(MAX_PRECISION, wanted)


# --- the SQL of an exact quotient ------------------------------------------------------------------


def _unscaled(expr: str, t: Exact) -> str:
    """The operand's unscaled digits as HUGEINT (``1.50`` of scale 2 is 150)."""
    if t.integer or t.scale == 0:
        return f"CAST({expr} AS HUGEINT)"
    if t.precision + t.scale + 1 <= MAX_PRECISION:  # an exact DECIMAL product, no text
        # widened first: DuckDB may type a product of DECIMALs narrower than its digits need
        return (f"CAST(CAST({expr} AS DECIMAL(38, {t.scale})) * CAST({10 ** t.scale} AS DECIMAL({t.scale + 1}, 0)) "
                "AS HUGEINT)")
    return f"CAST(replace(CAST({expr} AS VARCHAR), '.', '') AS HUGEINT)"


def _weight_and_digit(u: str, scale: int) -> tuple[str, str]:
    """PostgreSQL's weight (position of the first base-10000 digit) and that digit's value, of the
    number whose unscaled digits are ``u`` at ``scale`` (0 and 0 for zero)."""
    digits = f"CAST(abs({u}) AS VARCHAR)"
    exponent = f"(length({digits}) - {1 + scale})"  # the decimal exponent of the leading digit
    weight = f"(({exponent} + 4000) // 4 - 1000)"  # floor(exponent / 4), exponent may be negative
    width = f"({exponent} - 4 * {weight} + 1)"  # 1 to 4 decimal digits make the first base-10000 digit
    first = f"CAST(left(rpad({digits}, CAST(greatest({width}, length({digits})) AS INTEGER), '0'), " \
            f"CAST({width} AS INTEGER)) AS INTEGER)"
    return f"(CASE WHEN {u} = 0 THEN 0 ELSE {weight} END)", f"(CASE WHEN {u} = 0 THEN 0 ELSE {first} END)"


def _pg_scale(ua: str, sa: int, ub: str, sb: int) -> str:
    """PostgreSQL's select_div_scale for one row."""
    wa, fa = _weight_and_digit(ua, sa)
    wb, fb = _weight_and_digit(ub, sb)
    qweight = f"({wa} - {wb} - CASE WHEN {fa} <= {fb} THEN 1 ELSE 0 END)"
    return f"least(1000, greatest({MIN_SIG_DIGITS} - 4 * {qweight}, {sa}, {sb}, 0))"


def _rounded(ua: str, ub: str, shift: str) -> str:
    """round(|ua| * 10^shift / |ub|) half away from zero, signed: quotient and remainder apart, so
    that the scaled remainder (< |ub| * 10^shift) is all that must fit a HUGEINT."""
    a, b, ten = f"abs({ua})", f"abs({ub})", f"{_POWERS}[{shift} + 1]"
    magnitude = f"(({a}) // ({b}) * {ten} + (2 * ((({a}) % ({b})) * {ten}) + ({b})) // (2 * ({b})))"
    return f"(CASE WHEN ({ua} < 0) <> ({ub} < 0) THEN -{magnitude} ELSE {magnitude} END)"


def quotient_macros(left: Exact, right: Exact, s: int, average: bool,
                    in_result: bool = False) -> tuple[tuple[str, str], tuple[str, str]]:
    """((name, CREATE MACRO) of the DECIMAL(38, s) quotient, (name, CREATE MACRO) of its text at
    PostgreSQL's own scale) of ``a / b`` for operands of these types; ``average`` divides a sum by
    a count, and no rows (a count of 0) give NULL rather than a division by zero. ``in_result``:
    the quotient is a column of the result, whose exact value is its text, so its DECIMAL (what
    ORDER BY sees) rounds at ``s`` a row that PostgreSQL gives more digits."""
    ua, ub = _unscaled("a", left), _unscaled("b", right)
    sa, sb = left.scale, right.scale
    r = _pg_scale(ua, sa, ub, sb)
    kind = ("avg" if average else "div") + ("_r" if in_result else "")
    tag = f"{kind}_{left.precision}_{sa}_{int(left.integer)}_{right.precision}_{sb}_{int(right.integer)}_{s}"
    zero = "NULL" if average else "error('division by zero')"
    # the scale is never above s here: a row that needs more digits than the type holds is refused
    too_fine = (f"error('an exact NUMERIC quotient needs ' || CAST({r} AS VARCHAR) || ' digits after the point, "
                f"more than the {s} a DECIMAL(38) quotient keeps here; cast an operand to DOUBLE to divide "
                "approximately')")
    at = f"least({r}, {s})" if in_result else r
    exact = _rounded(ua, ub, f"({at} - {sa} + {sb})")
    scaled = f"CAST({exact} * {_POWERS}[{s} - {at} + 1] AS DECIMAL(38, 0))"
    unit = f"CAST('1E-{s}' AS DECIMAL(38, {s}))"
    refuse = "" if in_result else f"WHEN {r} > {s} THEN {too_fine} "
    body = (f"CASE WHEN b = 0 THEN {zero} {refuse}"
            f"ELSE CAST({scaled} * {unit} AS DECIMAL(38, {s})) END")
    name = f"__hp_{tag}"
    text_name = f"__hp_{tag}_text"
    q = _rounded(ua, ub, f"({r} - {sa} + {sb})")
    plain = f"CAST(abs({q}) AS VARCHAR)"
    padded = f"lpad({plain}, CAST(greatest(length({plain}), {r} + 1) AS INTEGER), '0')"
    text = (f"(CASE WHEN {q} < 0 THEN '-' ELSE '' END) || CASE WHEN {r} = 0 THEN {padded} ELSE "
            f"left({padded}, CAST(length({padded}) - {r} AS INTEGER)) || '.' || "
            f"right({padded}, CAST({r} AS INTEGER)) END")
    text_body = f"CASE WHEN b = 0 THEN {zero} ELSE {text} END"
    return ((name, f"CREATE OR REPLACE TEMP MACRO {name}(a, b) AS {body}"),
            (text_name, f"CREATE OR REPLACE TEMP MACRO {text_name}(a, b) AS {text_body}"))


# --- the rewrite -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExactRewrite:
    """A query with its divisions and averages made exact; the TEMP macros it calls (already created
    on the cursor that probed it: another cursor runs ``macros`` first); and for each quotient that
    is a column of the result, (its column, the hidden text column of its exact digits)."""

    query: str
    macros: tuple[str, ...] = ()
    texts: tuple[tuple[int, int], ...] = ()


def exact_numeric_rewrite(con: duckdb.DuckDBPyConnection, query: str) -> ExactRewrite:
    """Probe and rewrite ``query``'s NUMERIC divisions and averages on ``con``; a query with no
    ``/``, avg or mean costs nothing."""
    if not _MENTIONS.search(query):
        return ExactRewrite(query)
    tree = _serialize(con, query)
    if tree is None:
        return ExactRewrite(query)
    macros: dict[str, str] = {}
    top = _top_select(tree)
    texts: list[tuple[int, dict[str, Any]]] = []
    changed = False
    # innermost first: an outer quotient's operand is probed once the inner one is exact
    for path in list(_candidates(tree)):
        node = _at(tree, path)
        position = next((i for i, item in enumerate(top["select_list"]) if item is node), None) if top else None
        rewritten = _rewrite_node(con, tree, path, node, macros, position is not None)
        if rewritten is None:
            continue
        changed = True
        exact_call, text_call = rewritten
        if position is not None:
            texts.append((position, text_call))
        _replace_in_place(node, exact_call)
    if not changed:
        return ExactRewrite(query)
    pairs: list[tuple[int, int]] = []
    if top is not None and texts:
        width = len(top["select_list"])
        for n, (position, text_call) in enumerate(texts):
            text_call["alias"] = f"{TEXT_COLUMN}{n}"
            top["select_list"].append(text_call)
            pairs.append((position, width + n))
    rewritten_query = _deserialize(con, tree)
    if rewritten_query is None:
        return ExactRewrite(query)
    return ExactRewrite(rewritten_query, tuple(macros.values()), tuple(pairs))


def _rewrite_node(con: duckdb.DuckDBPyConnection, tree: dict[str, Any], path: tuple[Any, ...],
                  node: dict[str, Any], macros: dict[str, str],
                  in_result: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the exact call, the text call) replacing ``node``, with their macros made; None to keep it."""
    average = node.get("function_name", "").lower() in AVERAGES
    if average:
        argument = exact_type(_probe(con, tree, path, [_renamed(node, "any_value")]) or "")
        if argument is None:
            return None
        left = Exact(MAX_PRECISION, argument.scale, argument.integer)  # the sum's type
        right = Exact(19, 0, True)  # the count
        s = result_scale(argument, right, average=True)
        operands = [_renamed(node, "sum"), _renamed(node, "count")]
    else:
        operands = [a["expression"] for a in node["arguments"]]
        left = exact_type(_probe(con, tree, path, [copy.deepcopy(operands[0])]) or "")
        right = exact_type(_probe(con, tree, path, [copy.deepcopy(operands[1])]) or "")
        if left is None or right is None or (left.integer and right.integer):
            return None  # a DOUBLE keeps DuckDB's division; integer / integer is integer division
        s = result_scale(left, right)
    (name, statement), (text_name, text_statement) = quotient_macros(left, right, s, average, in_result)
    made_here = ((name, statement), (text_name, text_statement)) if in_result else ((name, statement),)
    for made, sql in made_here:
        if made not in macros:
            con.execute(sql)
            macros[made] = sql
    return (_call(name, copy.deepcopy(operands), alias=node.get("alias", "")),
            _call(text_name, copy.deepcopy(operands)))


def _candidates(tree: Any) -> Iterator[tuple[Any, ...]]:
    """Paths of every division and one-argument avg/mean call, innermost first."""
    def walk(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, (*path, key))
            if _is_division(node) or _is_average(node):
                yield path
        elif isinstance(node, list):
            for index, item in enumerate(node):
                yield from walk(item, (*path, index))
    yield from walk(tree, ())


def _is_division(node: dict[str, Any]) -> bool:
    return (node.get("class") == "FUNCTION" and node.get("function_name") in ("/", "//") and not node.get("schema")
            and len(node.get("arguments") or []) == 2)


def _is_average(node: dict[str, Any]) -> bool:
    return (node.get("class") in ("FUNCTION", "WINDOW") and str(node.get("function_name", "")).lower() in AVERAGES
            and not node.get("schema") and len(node.get("arguments") or node.get("children") or []) == 1)


def _top_select(tree: dict[str, Any]) -> dict[str, Any] | None:
    """The outermost SELECT whose list maps one to one onto the result's columns (no ``*``, no
    DISTINCT, no GROUP BY ALL): where a quotient's exact text can ride along as a hidden column."""
    statements = tree.get("statements") or []
    if len(statements) != 1:
        return None
    node = statements[0].get("node") or {}
    if node.get("type") != "SELECT_NODE" or node.get("aggregate_handling", "STANDARD_HANDLING") != "STANDARD_HANDLING":
        return None
    if any(m.get("type") == "DISTINCT_MODIFIER" for m in node.get("modifiers") or []):
        return None
    if any(item.get("class") == "STAR" or item.get("type") == "STAR" for item in node.get("select_list") or []):
        return None
    return node


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        tree = tree[step]
    return tree


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


def _probe(con: duckdb.DuckDBPyConnection, tree: dict[str, Any], path: tuple[Any, ...],
           arguments: list[dict[str, Any]]) -> str | None:
    """DuckDB's type of an expression put where the node at ``path`` is: bound inside a UUID-only
    function (in a one-element list), whose binder error names it (no error: a UUID or NULL, nothing to make exact)."""
    probe = copy.deepcopy(tree)
    # inside a list: a bare literal binds as INTEGER_LITERAL, a list of it as INTEGER[]
    _replace_in_place(_at(probe, path), _call(_PROBE_FUNCTION, [_call("list_value", arguments)]))
    text = _deserialize(con, probe)
    if text is None:
        return None
    try:
        con.sql(text).types  # noqa: B018 (binding is the point)
    except duckdb.BinderException as exc:
        match = _PROBED_TYPE.search(str(exc))
        return match.group(1) if match else None
    except duckdb.Error:
        return None
    return None


def _replace_in_place(node: dict[str, Any], replacement: dict[str, Any]) -> None:
    node.clear()
    node.update(replacement)
