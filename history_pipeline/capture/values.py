"""PostgreSQL types and text values -> the WAL contract's types and values (pure).

Logical decoding hands over each value as its type's text output, printed with the capturing
session's settings (``DateStyle=ISO``, ``IntervalStyle=iso_8601``, ``TimeZone=UTC``,
``extra_float_digits=1``, ``bytea_output=hex``: see :data:`SESSION_SETTINGS`). A type is identified
by its OID and type modifier, as in the ``pgoutput`` relation message and in ``pg_attribute``.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable
from typing import Any

from history_pipeline.errors import HistoryError

#: What the capturing session sets so that text output is what these parsers read.
SESSION_SETTINGS = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
}


class UnsupportedTypeError(HistoryError):
    """A captured column has a PostgreSQL type the WAL contract has no value form for."""


class CaptureValueError(HistoryError):
    """A captured value cannot be written in its column's WAL form."""


# scalar type OID -> contract type name; arrays are looked up through _ARRAYS
_SCALARS: dict[int, str] = {
    16: "BOOLEAN",
    21: "SMALLINT",
    23: "INTEGER",
    20: "BIGINT",
    700: "REAL",
    701: "DOUBLE PRECISION",
    1700: "NUMERIC",
    25: "TEXT",
    1043: "VARCHAR",
    1042: "CHAR",  # bpchar: its text output is blank-padded to the length, as the contract stores it
    17: "BYTEA",
    2950: "UUID",
    1082: "DATE",
    1083: "TIME",
    1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ",
    1186: "INTERVAL",
    3802: "JSONB",
    114: "JSONB",  # json: its values are JSON values too (whitespace and key order are not kept)
}
# array type OID -> element type OID
_ARRAYS: dict[int, int] = {
    1000: 16, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1231: 1700, 1009: 25, 1015: 1043, 1014: 1042,
    1001: 17, 2951: 2950, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186, 3807: 3802, 199: 114,
}

TEXT_FALLBACK = "TEXT"


def contract_type(type_oid: int, typmod: int, *, text_fallback: bool = False, where: str = "") -> str:
    """The contract's type string for a PostgreSQL type (OID and modifier), e.g. ``NUMERIC(10,2)``."""
    if type_oid in _ARRAYS:
        try:
            return contract_type(_ARRAYS[type_oid], typmod, where=where) + "[]"
        except UnsupportedTypeError:
            if text_fallback:  # the whole array as its text
                return TEXT_FALLBACK
            raise
    name = _SCALARS.get(type_oid)
    if name is None:
        if text_fallback:
            return TEXT_FALLBACK
        raise UnsupportedTypeError(
            f"{where or 'a column'} has PostgreSQL type oid {type_oid}, which the WAL contract has no form "
            "for; change the column to a contract type, or capture with --text-fallback to keep its text"
        )
    if name == "NUMERIC" and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if scale > precision:  # PostgreSQL 15 allows a negative or larger scale: the contract does not
            if text_fallback:
                return TEXT_FALLBACK
            raise UnsupportedTypeError(f"{where or 'a column'} has a NUMERIC scale the contract cannot hold")
        return f"NUMERIC({precision},{scale})"
    if name == "VARCHAR" and typmod >= 4:
        return f"VARCHAR({typmod - 4})"
    if name == "CHAR":  # bpchar without a modifier (an expression's type) has no length: no padding
        return f"CHAR({typmod - 4})" if typmod >= 4 else "BPCHAR"
    return name


def _bool(text: str) -> bool:
    return {"t": True, "f": False}[text]


def _float(text: str) -> Any:
    if text in ("NaN", "Infinity", "-Infinity"):
        return text
    return float(text)


def _numeric(text: str) -> str:
    if not re.fullmatch(r"-?\d+(\.\d+)?", text):
        raise ValueError(f"NUMERIC value {text!r} (NaN and infinities have no WAL form)")
    return text


def _bytea(text: str) -> str:
    if not text.startswith("\\x"):
        raise ValueError("bytea not in hex output (the session sets bytea_output=hex)")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


def _date(text: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ValueError(f"DATE {text!r} outside the contract's range (infinity, BC or 5-digit years)")
    return text


def _time(text: str) -> str:
    if not re.fullmatch(r"\d{2}:\d{2}:\d{2}(\.\d{1,6})?", text) or text.startswith("24"):
        raise ValueError(f"TIME {text!r}")
    return text


def _timestamp(text: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?", text):
        raise ValueError(f"TIMESTAMP {text!r} outside the contract's range (infinity, BC or 5-digit years)")
    return text.replace(" ", "T", 1)


_TZ_RE = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)([+-]\d{2})(?::(\d{2}))?(?::(\d{2}))?")


def _timestamptz(text: str) -> str:
    match = _TZ_RE.fullmatch(text)
    if not match or match.group(5):
        raise ValueError(f"TIMESTAMPTZ {text!r} outside the contract's range (infinity, BC or 5-digit years)")
    date, time, hours, minutes = match.group(1), match.group(2), match.group(3), match.group(4) or "00"
    return f"{date}T{time}{hours}:{minutes}"


_INTERVAL_RE = re.compile(
    r"P(?:(?P<y>-?\d+)Y)?(?:(?P<mo>-?\d+)M)?(?:(?P<d>-?\d+)D)?"
    r"(?:T(?:(?P<h>-?\d+)H)?(?:(?P<mi>-?\d+)M)?(?:(?P<s>-?\d+(?:\.\d{1,6})?)S)?)?"
)


def _interval(text: str) -> dict[str, int]:
    match = _INTERVAL_RE.fullmatch(text)
    if not match or text in ("P", "PT"):
        raise ValueError(f"INTERVAL {text!r} not in iso_8601 style (the session sets IntervalStyle=iso_8601)")
    part = {k: v for k, v in match.groupdict().items() if v is not None}
    seconds = part.get("s", "0")
    negative = seconds.startswith("-")
    whole, _, fraction = seconds.lstrip("-").partition(".")
    micros = int(whole) * 1_000_000 + int((fraction + "000000")[:6])
    micros = -micros if negative else micros
    micros += (int(part.get("h", 0)) * 3600 + int(part.get("mi", 0)) * 60) * 1_000_000
    months = int(part.get("y", 0)) * 12 + int(part.get("mo", 0))
    return {"months": months, "days": int(part.get("d", 0)), "micros": micros}


def _identity(text: str) -> str:
    return text


_PARSERS: dict[str, Callable[[str], Any]] = {
    "BOOLEAN": _bool,
    "SMALLINT": int,
    "INTEGER": int,
    "BIGINT": int,
    "REAL": _float,
    "DOUBLE PRECISION": _float,
    "NUMERIC": _numeric,
    "TEXT": _identity,
    "VARCHAR": _identity,
    "CHAR": _identity,
    "BPCHAR": _identity,
    "BYTEA": _bytea,
    "UUID": _identity,
    "DATE": _date,
    "TIME": _time,
    "TIMESTAMP": _timestamp,
    "TIMESTAMPTZ": _timestamptz,
    "INTERVAL": _interval,
    "JSONB": json.loads,
}


def _base_name(data_type: str) -> str:
    return data_type.split("(")[0]


@functools.cache
def converter(data_type: str) -> Callable[[str], Any]:
    """The function from a non-NULL text output to the WAL value for the contract type ``data_type``,
    chosen once per type (a capture calls it per value)."""
    if data_type.endswith("[]"):
        # a T[] column holds arrays of any depth, in PostgreSQL and in the WAL format (docs/wal-format.md)
        element = converter(data_type.rstrip("[]"))

        def item(text: str | None) -> Any:
            return None if text is None else element(text)

        return lambda text: _map_nested(parse_array(text), item)
    return _PARSERS[_base_name(data_type)]


def wal_value(data_type: str, text: str | None) -> Any:
    """The WAL (JSON) value of a PostgreSQL text output ``text`` for the contract type ``data_type``."""
    return None if text is None else converter(data_type)(text)


def _map_nested(items: list[Any], convert: Callable[[str | None], Any]) -> list[Any]:
    return [_map_nested(i, convert) if isinstance(i, list) else convert(i) for i in items]


# one element of a one-dimensional array literal: a quoted string (backslash escapes) or a bare word
_ELEMENT_RE = re.compile(r'"((?:[^"\\]|\\.)*)"|([^,{}"]*)', re.DOTALL)
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def parse_array(text: str) -> list[Any]:
    """A PostgreSQL array literal (``{1,NULL,"a b"}``, nested, optional ``[l:u]=`` bounds) as nested
    lists of element texts (None for NULL)."""
    if text.startswith("["):  # explicit bounds: the values are what matters here
        text = text[text.index("=") + 1 :]
    value, end = _parse_level(text, 0)
    if end != len(text):
        raise ValueError(f"array literal {text!r} has trailing characters")
    return value


def _parse_level(text: str, pos: int) -> tuple[list[Any], int]:
    if text[pos] != "{":
        raise ValueError(f"array literal expected '{{' at {pos} in {text!r}")
    if text[pos + 1] != "{":  # the innermost level: element by element with a regular expression
        return _parse_flat(text, pos)
    pos += 1
    items: list[Any] = []
    while True:
        item, pos = _parse_level(text, pos)
        items.append(item)
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != ",":
            raise ValueError(f"array literal expected ',' at {pos} in {text!r}")
        pos += 1


def _parse_flat(text: str, pos: int) -> tuple[list[Any], int]:
    """The one-dimensional array literal at ``pos`` (its ``{``) and the position after its ``}``."""
    if text[pos + 1] == "}":
        return [], pos + 2
    items: list[Any] = []
    pos, size, match = pos + 1, len(text), _ELEMENT_RE.match
    while True:
        found = match(text, pos)
        assert found is not None  # the pattern also matches the empty string
        quoted, bare = found.groups()
        if quoted is not None:
            items.append(_ESCAPE_RE.sub(r"\1", quoted) if "\\" in quoted else quoted)
        else:
            raw = bare.strip()
            items.append(None if raw.upper() == "NULL" else raw)
        pos = found.end()
        if pos >= size:
            raise ValueError(f"array literal {text!r} ends early")
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != ",":
            raise ValueError(f"array literal expected ',' at {pos} in {text!r}")
        pos += 1


def convert(data_type: str, text: str | None, *, where: str) -> Any:
    """:func:`wal_value` whose failure is a :class:`CaptureValueError` naming ``where`` (table.column)."""
    try:
        return wal_value(data_type, text)
    except (ValueError, KeyError, IndexError) as exc:
        raise CaptureValueError(f"{where}: value {text!r} of type {data_type} has no WAL form: {exc}") from None
