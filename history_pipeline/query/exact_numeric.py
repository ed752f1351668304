"""Exact NUMERIC division, ``AVG`` and functions, as PostgreSQL computes them.

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

The same holds for PostgreSQL's NUMERIC functions (``sqrt``, ``exp``, ``ln``, ``log``, ``power``):
a column of the result is computed from its operands' hidden columns by
:mod:`history_pipeline.query.numeric_functions`; inside an expression it has no exact DuckDB type
and is a typed error. ``ORDER BY`` such a column sorts by an exact key, ``GROUP BY`` it groups by
the exact quotient. ``div`` and ``round``/``trunc`` to more places are exact in SQL.

Operand types are known only once the query is bound, so each operand is probed first: it is
handed to a function that accepts only UUIDs, and DuckDB's binder error names its type. Only
SELECT statements reach this module (the engine refuses others before).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb

from history_pipeline.errors import QueryError
from history_pipeline.query.numeric_functions import (
    numeric_exp,
    numeric_ln,
    numeric_log,
    numeric_power,
    numeric_sqrt,
)

AVERAGES = frozenset({"avg", "mean"})
#: NUMERIC functions PostgreSQL answers as numeric, by DuckDB name: (what they compute, arities)
FUNCTIONS = {"sqrt": ("sqrt", (1,)), "exp": ("exp", (1,)), "ln": ("ln", (1,)), "log10": ("log10", (1,)),
             "log2": ("log2", (1,)), "log": ("log", (1, 2)), "pow": ("power", (2,)), "power": ("power", (2,)),
             "^": ("power", (2,)), "**": ("power", (2,)), "div": ("div", (2,))}
#: the ones that grow with their one argument: a column of them sorts as the argument does
INCREASING = frozenset({"sqrt", "exp", "ln", "log10", "log2"})
#: functions whose second argument is a number of decimal places (PostgreSQL's result has that scale)
PLACES = frozenset({"round", "trunc"})
#: PostgreSQL's NUMERIC functions DuckDB has no counterpart of, and what to write instead
MISSING = {"scale": "the column's declared scale",
           "min_scale": "the column's declared scale", "trim_scale": "CAST(x AS VARCHAR) and trim its zeros"}

#: PostgreSQL's NUMERIC_MIN_SIG_DIGITS: a quotient keeps at least this many significant digits
MIN_SIG_DIGITS = 16
#: the scale a quotient inside an expression gets at least (PostgreSQL's scale of any quotient
#: between 0.0001 and 10^16 when its operands' scales are at most 20)
MIN_RESULT_SCALE = 20
MAX_PRECISION = 38
#: where the hidden operand columns of a quotient in the result are named (then dropped)
OPERAND_COLUMN = "__hp_operand_"

_INTEGER_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19, "HUGEINT": 39,
                   "UTINYINT": 3, "USMALLINT": 5, "UINTEGER": 10, "UBIGINT": 20, "UHUGEINT": 39}
_MENTIONS = re.compile(r"\b(avg|mean|sqrt|exp|ln|log|log10|log2|pow|power|round|trunc|sign|div|scale|min_scale|"
                       r"trim_scale)\s*\(|/|\^|\*\*", re.IGNORECASE)
_PROBE_FUNCTION = "uuid_extract_version"
_PROBED_TYPE = re.compile(_PROBE_FUNCTION + r"\((.+?)\[\]\)'")
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def _power(exponent: str) -> str:
    """10 ** exponent as HUGEINT (exponent 0 to 38): its digits, a small expression to bind."""
    return f"CAST(rpad('1', CAST({exponent} + 1 AS INTEGER), '0') AS HUGEINT)"


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


def _weight_and_digit(u: str, digits: str, scale: int) -> tuple[str, str]:
    """PostgreSQL's weight (position of the first base-10000 digit) and that digit's value, of the
    number whose unscaled digits are ``u`` (``digits``: their text, unsigned) at ``scale`` (0 and 0
    for zero)."""
    exponent = f"(length({digits}) - {1 + scale})"  # the decimal exponent of the leading digit
    weight = f"(({exponent} + 4000) // 4 - 1000)"  # floor(exponent / 4), exponent may be negative
    width = f"CAST({exponent} - 4 * {weight} + 1 AS INTEGER)"  # 1 to 4 decimal digits make the first one
    first = (f"CAST(left(rpad({digits}, CAST(greatest({width}, length({digits})) AS INTEGER), '0'), {width}) "
             "AS INTEGER)")
    return f"(CASE WHEN {u} = 0 THEN 0 ELSE {weight} END)", f"(CASE WHEN {u} = 0 THEN 0 ELSE {first} END)"


def _field(stage: str, name: str) -> str:
    return f"struct_extract({stage}, '{name}')"


def _let(value: str, body: str, name: str) -> str:
    """``body`` with ``name`` bound to ``value`` computed once: a macro inlines its arguments' text,
    so without this each use of an intermediate would repeat (and bind) its whole expression.
    (Fields are read with struct_extract: ``name.field`` in a HAVING clause binds as a column.)"""
    return f"list_transform([{value}], lambda {name}: {body})[1]"


def quotient_macro(left: Exact, right: Exact, s: int, average: bool, key: bool = False) -> tuple[str, str]:
    """(name, CREATE MACRO) of the DECIMAL(38, s) quotient ``a / b`` of operands of these types
    inside an expression; ``average`` divides a sum by a count, and no rows (a count of 0) give
    NULL rather than a division by zero. A row PostgreSQL gives more than ``s`` places is an error;
    as a sort ``key`` it is rounded to ``s`` places instead (PostgreSQL's value whenever that has at
    most ``s`` places, and in the same order as PostgreSQL's values otherwise)."""
    sa, sb = left.scale, right.scale
    kind = ("avgkey" if key else "avg") if average else ("divkey" if key else "div")
    tag = f"{kind}_{left.precision}_{sa}_{int(left.integer)}_{right.precision}_{sb}_{int(right.integer)}_{s}"
    zero = "NULL" if average else "error('division by zero')"
    u, t, r, q = (functools.partial(_field, stage) for stage in ("__hp_u", "__hp_t", "__hp_r", "__hp_q"))
    # stage 1: the unscaled digits; 2: their text; 3: PostgreSQL's scale; 4: the rounded quotient
    summed = Exact(MAX_PRECISION, sa, left.integer) if average else left  # a sum has DuckDB's widest type
    unscaled = f"{{'ua': {_unscaled('__hp_dividend', summed)}, 'ub': {_unscaled('__hp_divisor', right)}}}"
    texts = (f"{{'ua': {u('ua')}, 'ub': {u('ub')}, 'da': CAST(abs({u('ua')}) AS VARCHAR), "
             f"'db': CAST(abs({u('ub')}) AS VARCHAR)}}")
    wa, fa = _weight_and_digit(t("ua"), t("da"), sa)
    wb, fb = _weight_and_digit(t("ub"), t("db"), sb)
    qweight = f"({wa} - {wb} - CASE WHEN {fa} <= {fb} THEN 1 ELSE 0 END)"
    scale = f"CAST(least({s if key else 1000}, greatest({MIN_SIG_DIGITS} - 4 * {qweight}, {sa}, {sb}, 0)) AS INTEGER)"
    with_scale = f"{{'ua': {t('ua')}, 'ub': {t('ub')}, 'r': {scale}}}"
    # round(|a| * 10^shift / |b|) half away from zero, signed: quotient and remainder apart, so
    # that the scaled remainder (< |b| * 10^shift) is all that must fit a HUGEINT
    ten = _power(f"{r('r')} - {sa} + {sb}")
    a, b = f"abs({r('ua')})", f"abs({r('ub')})"
    magnitude = f"({a} // {b} * {ten} + (2 * (({a} % {b}) * {ten}) + {b}) // (2 * {b}))"
    signed = f"CASE WHEN ({r('ua')} < 0) <> ({r('ub')} < 0) THEN -{magnitude} ELSE {magnitude} END"
    quotient = f"{{'q': {signed}, 'r': {r('r')}}}"
    too_fine = (f"error('an exact NUMERIC quotient needs ' || CAST({q('r')} AS VARCHAR) || ' digits after the "
                f"point, more than the {s} a DECIMAL(38) quotient keeps here; cast an operand to DOUBLE to "
                "divide approximately')")
    unit = f"CAST('1E-{s}' AS DECIMAL(38, {s}))"
    decimal = f"CAST(CAST({q('q')} * {_power(f'{s} - ' + q('r'))} AS DECIMAL(38, 0)) * {unit} AS DECIMAL(38, {s}))"
    decimal = f"CASE WHEN {q('r')} > {s} THEN {too_fine} ELSE {decimal} END"
    inner = _let(with_scale, _let(quotient, decimal, "__hp_q"), "__hp_r")
    quotient_at = _let(unscaled, _let(texts, inner, "__hp_t"), "__hp_u")
    body = f"CASE WHEN __hp_divisor = 0 THEN {zero} ELSE {quotient_at} END"
    name = f"__hp_{tag}"
    return name, f"CREATE OR REPLACE TEMP MACRO {name}(__hp_dividend, __hp_divisor) AS {body}"


def integer_quotient_macro(left: Exact, right: Exact) -> tuple[str, str]:
    """(name, CREATE MACRO) of PostgreSQL's ``div(a, b)``: the quotient truncated toward zero, a
    NUMERIC of scale 0, from the operands' digits at their common scale."""
    common = max(left.scale, right.scale)
    a = f"({_unscaled('__hp_dividend', left)} * {10 ** (common - left.scale)})"
    b = f"({_unscaled('__hp_divisor', right)} * {10 ** (common - right.scale)})"
    quotient = f"(CASE WHEN ({a} < 0) <> ({b} < 0) THEN -1 ELSE 1 END) * (abs({a}) // abs({b}))"
    name = "__hp_intdiv_" + "_".join(f"{t.precision}_{t.scale}_{int(t.integer)}" for t in (left, right))
    body = f"CASE WHEN __hp_divisor = 0 THEN error('division by zero') ELSE CAST({quotient} AS DECIMAL(38, 0)) END"
    return name, f"CREATE OR REPLACE TEMP MACRO {name}(__hp_dividend, __hp_divisor) AS {body}"


# --- the rewrite -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """Where an operand of a result column's quotient or function comes from: one hidden column
    at a scale, or two (a dividend and a divisor at their scales) when it is itself a quotient or
    an average, which PostgreSQL hands on at its own per-value scale (``divided``: ``/`` or ``avg``)."""

    columns: tuple[int, ...]
    scales: tuple[int, ...]
    divided: str = ""


@dataclass(frozen=True)
class ResultQuotient:
    """A quotient, average or NUMERIC function that is a column of the result: DuckDB answers it
    as it would, and hidden columns carry its operands, from which :func:`quotient_texts` gives back
    PostgreSQL's exact digits row by row (any scale, no DuckDB type to fit). ``function`` is ``/``,
    ``avg`` (a sum and a count) or a name of :data:`FUNCTIONS`' values."""

    shown: int
    operands: tuple[Operand, ...]
    function: str

    @property
    def columns(self) -> tuple[int, ...]:
        """The columns it reads (hidden, or the user's own when it shows an operand as is), in order."""
        return tuple(c for operand in self.operands for c in operand.columns)


@dataclass(frozen=True)
class ExactRewrite:
    """A query with its divisions and averages made exact; the TEMP macros it calls (already created
    on the cursor that probed it: another cursor runs ``macros`` first); the quotients the result
    shows, whose operands ride along in hidden columns after the user's."""

    query: str
    macros: tuple[str, ...] = ()
    quotients: tuple[ResultQuotient, ...] = ()
    shown_columns: int = 0  # the user's columns (before the hidden ones) when there are quotients


def exact_numeric_rewrite(con: duckdb.DuckDBPyConnection, query: str) -> ExactRewrite:
    """Probe and rewrite ``query``'s NUMERIC divisions and averages on ``con``; a query with no
    ``/``, avg or mean costs nothing."""
    if not _MENTIONS.search(query):
        return ExactRewrite(query)
    tree = _serialize(con, query)
    if tree is None:
        return ExactRewrite(query)
    _refuse_missing(tree)
    macros: dict[str, str] = {}
    top = _top_select(tree)
    grouped = _grouped(top) if top else set()
    shown: list[tuple[int, list[dict[str, Any]], tuple[Exact, ...], str]] = []
    changed = False

    #: each exact quotient made inside the query (by its macro call): its operands' types, and ``/`` or ``avg``
    made: dict[str, tuple[tuple[Exact, ...], str]] = {}

    def macro(left: Exact, right: Exact, average: bool, key: bool = False) -> str:
        name, statement = quotient_macro(left, right, result_scale(left, right, average), average, key)
        if name not in macros:
            con.execute(statement)
            macros[name] = statement
        return name

    # innermost first: an outer quotient's operand is probed once the inner one is exact
    for path in list(_candidates(tree)):
        node = _at(tree, path)
        position = next((i for i, item in enumerate(top["select_list"]) if item is node), None) if top else None
        # a column the result is grouped by is grouped by its exact value, not by its operands
        if position is not None and _references(node, position) & grouped:
            position = None
        if _is_places(node):
            changed |= _pad_places(con, tree, path, node)
            continue
        if _is_sign(node):
            changed |= _numeric_sign(con, tree, path, node)
            continue
        typed = _operand_types(con, tree, path, node)
        if typed is None:
            continue
        changed = True
        operands, types, function = typed
        if function not in ("/", "avg", "div") and any(_quotient_inside(o, made) for o in operands):
            # PostgreSQL hands a quotient on at a scale of its own per value, which such an operand does not keep
            raise QueryError(_inexact(node, function))
        if function == "div":  # exact in SQL wherever it is
            name, statement = integer_quotient_macro(*types)
            if name not in macros:
                con.execute(statement)
                macros[name] = statement
            # unnamed, it is named as PostgreSQL names it (the original call does not bind in DuckDB)
            _replace_in_place(node, _call(name, operands, alias=node.get("alias") or "div"))
        elif position is not None:  # kept as DuckDB answers it; its operands go along
            shown.append((position, operands, types, function))
        elif function in ("/", "avg"):
            left, right = types
            _replace_in_place(node, _call(macro(left, right, function == "avg"), operands,
                                          alias=node.get("alias", "")))
            made[_fingerprint(node)] = (types, function)
        elif function in INCREASING and top is not None and _is_order_item(top, node):
            _replace_in_place(node, copy.deepcopy(operands[0]))  # sorts as its argument does
        else:
            raise QueryError(_inexact(node, function))
    if not changed:
        return ExactRewrite(query)
    if top is not None:
        for position, operands, types, function in shown:
            if function in ("/", "avg"):
                key = _call(macro(*types, function == "avg", key=True), copy.deepcopy(operands))
            else:
                key = copy.deepcopy(operands[0]) if function in INCREASING else None
            _order_exactly(top, position, key, function)
    quotients: list[ResultQuotient] = []
    width = len(top["select_list"]) if top is not None else 0
    # an operand the user's select list shows as is (Q1's sum beside its avg) is read from that
    # column: the same expression in the same SELECT, so the same value and type
    items = list(enumerate(top["select_list"])) if top is not None else []
    visible = {_fingerprint(item): i for i, item in reversed(items)}  # the first of equal items
    if top is not None:
        for n, (position, operands, types, function) in enumerate(shown):
            specs = []
            for operand, exact in zip(operands, types, strict=True):
                inner = None if _quotient_inside(operand, made) else made.get(_fingerprint(operand))
                parts = [a["expression"] for a in operand["arguments"]] if inner else [operand]
                columns = []
                for part in parts:
                    same = visible.get(_fingerprint(part))
                    if same is not None and same < width:
                        columns.append(same)
                        continue
                    columns.append(len(top["select_list"]))
                    top["select_list"].append({**copy.deepcopy(part),
                                               "alias": f"{OPERAND_COLUMN}{n}_{len(top['select_list'])}"})
                if inner:
                    specs.append(Operand(tuple(columns), tuple(t.scale for t in inner[0]), inner[1]))
                else:
                    specs.append(Operand(tuple(columns), (exact.scale,)))
            quotients.append(ResultQuotient(position, tuple(specs), function))
    rewritten_query = _deserialize(con, tree)
    if rewritten_query is None:
        return ExactRewrite(query)
    return ExactRewrite(rewritten_query, tuple(macros.values()), tuple(quotients), width)


def _refuse_missing(tree: Any) -> None:
    """A typed error for a call of a PostgreSQL NUMERIC function DuckDB does not have (rather than
    DuckDB's "does not exist", which reads as a missing table)."""
    if isinstance(tree, list):
        for item in tree:
            _refuse_missing(item)
    elif isinstance(tree, dict):
        name = str(tree.get("function_name", "")).lower()
        if tree.get("class") == "FUNCTION" and name in MISSING and not tree.get("schema"):
            raise QueryError(f"{name}() is PostgreSQL's and not available in this SQL; use {MISSING[name]}")
        for value in tree.values():
            _refuse_missing(value)


def _fingerprint(node: Any) -> str:
    """An expression's serialized form without its place in the query text (two spellings of
    the same expression at different places compare equal)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not k.startswith("query_location") and k != "alias"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return json.dumps(strip(value=node), sort_keys=True)


def _references(node: dict[str, Any], position: int) -> set[str]:
    """How a GROUP BY or ORDER BY can name the select item ``node`` at ``position``: by its
    alias, its 1-based position, or the same expression."""
    names = {f"#{position + 1}", _fingerprint(node)}
    if node.get("alias"):
        names.add(f"@{node['alias'].lower()}")
    return names


def _reference(expression: dict[str, Any]) -> str:
    """The way ``expression`` (a GROUP BY or ORDER BY item) names a select item, in the form
    :func:`_references` gives."""
    if expression.get("class") == "COLUMN_REF" and len(expression.get("column_names") or []) == 1:
        return f"@{expression['column_names'][0].lower()}"
    literal = expression.get("literal") or {}
    if expression.get("class") == "CONSTANT" and literal.get("kind") in ("INTEGER", "BIGINT"):
        return f"#{literal.get('text', literal.get('value'))}"
    return _fingerprint(expression)


def _grouped(top: dict[str, Any]) -> set[str]:
    return {_reference(e) for e in top.get("group_expressions") or []}


def _order_exactly(top: dict[str, Any], position: int, key: dict[str, Any] | None, function: str) -> None:
    """An ORDER BY item naming the shown column at ``position`` (by alias or position) sorts by
    its exact value: the exact ``key`` first, DuckDB's own value after it only to order rows whose
    PostgreSQL quotients have more places than the key keeps. No key: such an ORDER BY is an error."""
    item = top["select_list"][position]
    names = _references(item, position) - {_fingerprint(item)}  # the same expression is made exact anyway
    for modifier in top.get("modifiers") or []:
        if modifier.get("type") != "ORDER_MODIFIER":
            continue
        orders = []
        for order in modifier["orders"]:
            if _reference(order["expression"]) in names:
                if key is None:
                    raise QueryError(f"ORDER BY a {function}() column of NUMERIC values cannot sort by its exact "
                                     "value here; order by its arguments, or cast them to DOUBLE to sort "
                                     "approximately")
                orders.append({**order, "expression": copy.deepcopy(key)})
                orders.append({**order, "expression": {**copy.deepcopy(item), "alias": ""}})
            else:
                orders.append(order)
        modifier["orders"] = orders


def _operand_types(con: duckdb.DuckDBPyConnection, tree: dict[str, Any], path: tuple[Any, ...],
                   node: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[Exact, ...], str] | None:
    """(operands, their exact types, what is computed: ``/``, ``avg`` or a function) of a division,
    average or NUMERIC function to make exact; None to keep DuckDB's (a DOUBLE operand, integer /
    integer, a function of integers only: PostgreSQL computes those in double precision too)."""
    name = str(node.get("function_name", "")).lower()
    if name in AVERAGES:
        argument = exact_type(_probe(con, tree, path, [_renamed(node, "any_value")]) or "")
        if argument is None:
            return None
        # the sum's type, and the count's; the mean never exceeds the argument
        return [_renamed(node, "sum"), _renamed(node, "count")], (argument, Exact(19, 0, True)), "avg"
    operands = [a["expression"] for a in node["arguments"]]
    types = [exact_type(_probe(con, tree, path, [copy.deepcopy(o)]) or "") for o in operands]
    if any(t is None for t in types) or (all(t.integer for t in types if t is not None) and name != "div"):
        return None  # a DOUBLE keeps DuckDB's; integer / integer is integer division
    exact = tuple(t for t in types if t is not None)
    function = "/" if name in ("/", "//") else FUNCTIONS[name][0]
    if function == "log" and len(operands) == 1:
        function = "log10"
    return [copy.deepcopy(o) for o in operands], exact, function


def _quotient_inside(operand: dict[str, Any], made: dict[str, tuple[tuple[Exact, ...], str]]) -> bool:
    """``operand`` holds an exact quotient made by this rewrite whose PostgreSQL scale it does not
    keep: anywhere inside it, except when ``operand`` is itself such a quotient of plain operands
    (a result column then computes it from those operands, at PostgreSQL's scale)."""
    if _fingerprint(operand) in made:
        return any(_quotient_inside(a["expression"], {}) for a in operand["arguments"])
    text = json.dumps(operand)
    return '"function_name": "__hp_div_' in text or '"function_name": "__hp_avg_' in text


def _inexact(node: dict[str, Any], function: str) -> str:
    return (f"{node.get('function_name')}() of a NUMERIC value inside an expression (or a GROUP BY, DISTINCT or "
            "subquery) cannot be computed exactly here; select it as a column of the outermost SELECT "
            "(exact, with PostgreSQL's digits), or cast its argument to DOUBLE to compute approximately")


def _is_order_item(top: dict[str, Any], node: dict[str, Any]) -> bool:
    return any(order["expression"] is node for m in top.get("modifiers") or [] if m.get("type") == "ORDER_MODIFIER"
               for order in m["orders"])


def _is_places(node: dict[str, Any]) -> bool:
    """``round(x, n)`` or ``trunc(x, n)`` with a literal ``n``."""
    arguments = node.get("arguments") or []
    return (node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in PLACES
            and not node.get("schema") and len(arguments) == 2
            and arguments[1]["expression"].get("class") == "CONSTANT"
            and str((arguments[1]["expression"].get("literal") or {}).get("text", "")).isdigit())


def _pad_places(con: duckdb.DuckDBPyConnection, tree: dict[str, Any], path: tuple[Any, ...],
                node: dict[str, Any]) -> bool:
    """``round(x, n)``/``trunc(x, n)`` of a NUMERIC or integer ``x`` has scale ``n`` in PostgreSQL
    (``round(1.5, 3)`` is 1.500) where DuckDB keeps ``x``'s: the call is cast to that scale (the
    value does not change) when its digits fit DECIMAL(38). True when rewritten."""
    places = int(node["arguments"][1]["expression"]["literal"]["text"])
    argument = exact_type(_probe(con, tree, path, [copy.deepcopy(node["arguments"][0]["expression"])]) or "")
    if argument is None or places <= argument.scale or argument.precision - argument.scale + places > MAX_PRECISION:
        return False
    call = {**copy.deepcopy(node), "alias": ""}
    precision = argument.precision - argument.scale + places
    _replace_in_place(node, _cast(call, precision, places, alias=node.get("alias", "")))
    return True


def _is_sign(node: dict[str, Any]) -> bool:
    return (node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() == "sign"
            and not node.get("schema") and len(node.get("arguments") or []) == 1)


def _numeric_sign(con: duckdb.DuckDBPyConnection, tree: dict[str, Any], path: tuple[Any, ...],
                  node: dict[str, Any]) -> bool:
    """``sign`` of a NUMERIC is a NUMERIC in PostgreSQL (DuckDB answers a TINYINT): cast to one."""
    argument = exact_type(_probe(con, tree, path, [copy.deepcopy(node["arguments"][0]["expression"])]) or "")
    if argument is None or argument.integer:
        return False
    _replace_in_place(node, _cast({**copy.deepcopy(node), "alias": ""}, 1, 0, alias=node.get("alias", "")))
    return True


def _cast(child: dict[str, Any], precision: int, scale: int, alias: str) -> dict[str, Any]:
    def constant(value: int) -> dict[str, Any]:
        return {"class": "CONSTANT", "type": "VALUE_CONSTANT", "alias": "", "query_location": 18446744073709551615,
                "literal": {"kind": "INTEGER", "text": str(value)}}
    return {"class": "CAST", "type": "OPERATOR_CAST", "alias": alias, "query_location": 18446744073709551615,
            "child": child, "try_cast": False,
            "type_expr": {"class": "TYPE", "type": "TYPE", "alias": "", "query_location": 18446744073709551615,
                          "catalog": "", "schema": "", "type_name": "DECIMAL",
                          "children": [constant(precision), constant(scale)], "qualified_name": {"path": ["DECIMAL"]}}}


def _unscaled_int(value: Any, scale: int) -> int:
    """The digits of a Decimal (or int) at ``scale``, exactly (no decimal context involved)."""
    if isinstance(value, int):
        return value * 10**scale
    sign, digits, exponent = value.as_tuple()
    n = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    shift = exponent + scale
    return n * 10**shift if shift >= 0 else n // 10 ** (-shift)


def _weight_first(u: int, scale: int) -> tuple[int, int]:
    if u == 0:
        return 0, 0
    digits = str(abs(u))
    exponent = len(digits) - 1 - scale
    weight = exponent // 4
    width = exponent - 4 * weight + 1
    return weight, int(digits.ljust(width, "0")[:width])


def pg_divide_text(a: Any, b: Any, scale_a: int, scale_b: int) -> str:
    """PostgreSQL's numeric ``a / b`` as text (select_div_scale, rounded half away from zero)."""
    ua, ub = _unscaled_int(a, scale_a), _unscaled_int(b, scale_b)
    if ub == 0:
        raise ZeroDivisionError("division by zero")
    wa, fa = _weight_first(ua, scale_a)
    wb, fb = _weight_first(ub, scale_b)
    qweight = wa - wb - (1 if fa <= fb else 0)
    r = min(1000, max(MIN_SIG_DIGITS - 4 * qweight, scale_a, scale_b, 0))
    numerator, denominator = abs(ua) * 10 ** (r - scale_a + scale_b), abs(ub)
    q = (2 * numerator + denominator) // (2 * denominator)
    digits = str(q).rjust(r + 1, "0")
    text = f"{digits[:len(digits) - r]}.{digits[len(digits) - r:]}" if r else digits
    return ("-" if q and (ua < 0) != (ub < 0) else "") + text


def _function_text(function: str, values: list[Any], scales: tuple[int, ...]) -> str:
    if function == "sqrt":
        return numeric_sqrt(values[0], scales[0])
    if function == "exp":
        return numeric_exp(values[0], scales[0])
    if function == "ln":
        return numeric_ln(values[0], scales[0])
    if function in ("log10", "log2"):
        return numeric_log(10 if function == "log10" else 2, 0, values[0], scales[0])
    if function == "log":
        return numeric_log(values[0], scales[0], values[1], scales[1])
    return numeric_power(values[0], scales[0], values[1], scales[1])


def _operand_value(operand: Operand, values: list[Any]) -> tuple[Any, int]:
    """An operand's value and PostgreSQL's scale of it (None: NULL) from its hidden columns' values."""
    if not operand.divided:
        return values[0], operand.scales[0]
    if values[0] is None or values[1] is None or (operand.divided == "avg" and values[1] == 0):
        return None, 0
    text = pg_divide_text(values[0], values[1], *operand.scales)
    return Decimal(text), len(text.partition(".")[2])


def quotient_texts(columns: list[Any], quotient: ResultQuotient) -> list[str | None]:
    """PostgreSQL's exact text of each row's quotient, average or function from its operands'
    hidden ``columns`` (in :attr:`ResultQuotient.columns` order): NULL where an operand is NULL,
    and an average of no rows is NULL."""
    out: list[str | None] = []
    for row in zip(*(c.to_pylist() for c in columns), strict=True):
        values, scales, at = [], [], 0
        for operand in quotient.operands:
            value, scale = _operand_value(operand, list(row[at:at + len(operand.columns)]))
            values.append(value)
            scales.append(scale)
            at += len(operand.columns)
        if any(v is None for v in values) or (quotient.function == "avg" and values[1] == 0):
            out.append(None)
        elif quotient.function in ("/", "avg"):
            out.append(pg_divide_text(values[0], values[1], *scales))
        else:
            out.append(_function_text(quotient.function, values, tuple(scales)))
    return out


def _candidates(tree: Any) -> Iterator[tuple[Any, ...]]:
    """Paths of every division, one-argument avg/mean call, NUMERIC function and round/trunc with
    places, innermost first."""
    def walk(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, (*path, key))
            if _is_division(node) or _is_average(node) or _is_function(node) or _is_places(node) or _is_sign(node):
                yield path
        elif isinstance(node, list):
            for index, item in enumerate(node):
                yield from walk(item, (*path, index))
    yield from walk(tree, ())


def _is_division(node: dict[str, Any]) -> bool:
    return (node.get("class") == "FUNCTION" and node.get("function_name") in ("/", "//") and not node.get("schema")
            and len(node.get("arguments") or []) == 2)


def _is_function(node: dict[str, Any]) -> bool:
    name = str(node.get("function_name", "")).lower()
    return (node.get("class") == "FUNCTION" and name in FUNCTIONS and not node.get("schema")
            and len(node.get("arguments") or []) in FUNCTIONS[name][1])


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
    # the probe keeps the node's alias: a GROUP BY or ORDER BY may name it
    alias = _at(probe, path).get("alias", "")
    _replace_in_place(_at(probe, path), _call(_PROBE_FUNCTION, [_call("list_value", arguments)], alias=alias))
    _stand_in_for_div(probe)
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


def _stand_in_for_div(tree: Any) -> None:
    """Calls of ``div`` not yet made exact, renamed to a function DuckDB binds (``greatest`` of two
    numbers), so that a probe elsewhere in the query binds as far as the probed node."""
    if isinstance(tree, list):
        for item in tree:
            _stand_in_for_div(item)
    elif isinstance(tree, dict):
        if tree.get("class") == "FUNCTION" and str(tree.get("function_name", "")).lower() == "div" \
                and not tree.get("schema"):
            tree["function_name"] = "greatest"
            tree["qualified_name"] = {"path": ["greatest"]}
        for value in tree.values():
            _stand_in_for_div(value)


def _replace_in_place(node: dict[str, Any], replacement: dict[str, Any]) -> None:
    node.clear()
    node.update(replacement)
