"""SQL CAST between the contract's types, with PostgreSQL's rules, on Python-form values.

Used when a column changes type: rows that exist at the change read their old
value cast to the new type, and a value that cannot be cast is an error at
ingest (never at query time).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import struct
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import Any

from history_pipeline.errors import ValueTypeError
from history_pipeline.types import (
    DataType,
    Interval,
    TypeKind,
    array_base,
    canonical_json,
    decode_value,
    encode_value,
    map_leaves,
)

_INTEGERS = (TypeKind.SMALLINT, TypeKind.INTEGER, TypeKind.BIGINT)
_FLOATS = (TypeKind.REAL, TypeKind.DOUBLE)
#: the string types: a value of one reads as its text in another
_STRINGS = (TypeKind.TEXT, TypeKind.VARCHAR, TypeKind.CHAR)


class CastFailure(ValueError):
    """A value cannot be cast; the message says why."""


def cast_value(value: Any, source: DataType, target: DataType) -> Any:
    """CAST(value AS target) for a Python-form ``value`` of type ``source``."""
    if value is None:
        return None
    s, t = source.kind, target.kind
    if s is TypeKind.NUMERIC and value == 0:
        value = abs(value)  # PostgreSQL's numeric has no negative zero: -0.00 is 0.00
    try:
        if t in _STRINGS:
            # a CHAR(n) value's padding is no part of its text: PostgreSQL's casts of bpchar to text and
            # varchar strip trailing blanks (and so does reading it into CHAR(m), which pads again)
            text = value.rstrip(" ") if s is TypeKind.CHAR else to_text(value, source)
            if target.length is not None:  # an explicit cast to VARCHAR(n) or CHAR(n) truncates, as in PostgreSQL
                text = text[: target.length]
            return _check(target, text)
        if s in _STRINGS:  # input functions ignore surrounding blanks, except bytea's
            return _from_text(value.strip() if t is not TypeKind.BYTEA else value, target)
        if s is TypeKind.REAL and t is not TypeKind.REAL:
            # the Python form of a REAL is its shortest decimal; PostgreSQL casts the float32 itself
            value = struct.unpack("<f", struct.pack("<f", value))[0]
        if s is TypeKind.JSONB and t is not TypeKind.JSONB:
            return _from_jsonb(value, target)
        if s == t and s is not TypeKind.ARRAY:
            return _check(target, encode_value(source, value))
        if t in _INTEGERS:
            return _to_integer(value, s, target)
        if t in _FLOATS:
            if s is TypeKind.NUMERIC:
                _check_numeric_fits_double(value, target)
            if s in _INTEGERS or s in _FLOATS or s is TypeKind.NUMERIC:
                return _check(target, encode_value(_DOUBLE, float(value)))
        if t is TypeKind.NUMERIC and (s in _INTEGERS or s in _FLOATS):
            if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
                raise CastFailure(f"cannot cast {value} to NUMERIC")
            if isinstance(value, float):  # PostgreSQL keeps DBL_DIG (15) or FLT_DIG (6) significant digits
                return _check(target, f"{value:.{15 if s is TypeKind.DOUBLE else 6}g}")
            return _check(target, str(Decimal(value)))
        if t is TypeKind.BOOLEAN and s is TypeKind.INTEGER:
            return value != 0
        if t is TypeKind.INTEGER and s is TypeKind.BOOLEAN:  # pragma: no cover - handled in _to_integer
            return int(value)
        if t is TypeKind.DATE and s in (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
            return value.date()
        if t is TypeKind.TIMESTAMP and s is TypeKind.DATE:
            return dt.datetime.combine(value, dt.time())
        if t is TypeKind.TIMESTAMPTZ and s is TypeKind.DATE:
            return dt.datetime.combine(value, dt.time(), dt.UTC)
        if t is TypeKind.TIMESTAMPTZ and s is TypeKind.TIMESTAMP:
            return value.replace(tzinfo=dt.UTC)  # session time zone: UTC
        if t is TypeKind.TIMESTAMP and s is TypeKind.TIMESTAMPTZ:
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        if t is TypeKind.TIME and s in (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
            return value.time().replace(tzinfo=None)
        if t is TypeKind.TIME and s is TypeKind.INTERVAL:  # the time part within a day; months and days go
            micros = value.micros % 86_400_000_000
            return (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
        if t is TypeKind.INTERVAL and s is TypeKind.TIME:
            micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
            return Interval(0, 0, micros)
        if t is TypeKind.ARRAY and s is TypeKind.ARRAY:
            low, high = array_base(source), array_base(target)  # element-wise, whatever the depth
            return map_leaves(value, lambda v: cast_value(v, low, high))
        if t is TypeKind.JSONB and s is not TypeKind.JSONB:
            raise CastFailure(f"no cast from {source} to JSONB (cast through TEXT)")
    except ValueTypeError as exc:
        raise CastFailure(str(exc)) from None
    raise CastFailure(f"no cast from {source} to {target}")


_DOUBLE = DataType(TypeKind.DOUBLE)


def _check_numeric_fits_double(value: Any, target: DataType) -> None:
    """PostgreSQL refuses a NUMERIC whose float is infinite or a nonzero one that underflows to 0
    (float() gives inf or 0.0 silently)."""
    exact = Decimal(value)
    as_float = float(exact)
    if math.isinf(as_float) or (as_float == 0 and exact != 0):
        raise CastFailure(f"{value} is out of range for {target}")


def _check(target: DataType, wal_value: Any) -> Any:
    return decode_value(target, wal_value)


def _to_integer(value: Any, s: TypeKind, target: DataType) -> int:
    if s is TypeKind.BOOLEAN:
        if target.kind is not TypeKind.INTEGER:
            raise CastFailure(f"no cast from BOOLEAN to {target}")
        return int(value)
    if s in _FLOATS:
        if math.isnan(value) or math.isinf(value):
            raise CastFailure(f"{value} is out of range for {target}")
        rounded = round(value)  # PostgreSQL uses rint(): halves go to even
    elif s is TypeKind.NUMERIC:
        exact = Decimal(value)
        # 10^19 is past every integer type, and quantizing a larger exponent (1e30) overflows the
        # decimal context (decimal.InvalidOperation) instead of saying out of range
        if exact != 0 and exact.adjusted() >= 19:
            raise CastFailure(f"{value} is out of range for {target}")
        rounded = int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    elif s in _INTEGERS:
        rounded = value
    else:
        raise CastFailure(f"no cast to {target}")
    return _check(target, rounded)


def _from_jsonb(value: Any, target: DataType) -> Any:
    """PostgreSQL's casts of a jsonb scalar: a number to a numeric type, a boolean to BOOLEAN."""
    kind = target.kind
    if kind is TypeKind.BOOLEAN and isinstance(value, bool):
        return value
    if kind in (*_INTEGERS, *_FLOATS, TypeKind.NUMERIC) and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        return cast_value(number, _NUMERIC, target)
    raise CastFailure(f"cannot cast jsonb {canonical_json(value)} to {target}")


_NUMERIC = DataType(TypeKind.NUMERIC)


def _from_text(text: str, target: DataType) -> Any:
    kind = target.kind
    if kind in (*_INTEGERS, *_FLOATS, TypeKind.NUMERIC) and (not text.isascii() or "_" in text):
        # Python's int() and float() read other scripts' digits and "1_000"; PostgreSQL does not
        raise CastFailure(f'invalid input syntax for {target}: "{text}"')
    if kind in _INTEGERS:
        try:
            return _check(target, int(text.replace("_", "x")))
        except ValueError:
            raise CastFailure(f'invalid input syntax for {target}: "{text}"') from None
    if kind in _FLOATS:
        lowered = text.lower()
        words = {"nan": "NaN", "infinity": "Infinity", "inf": "Infinity", "-infinity": "-Infinity", "-inf": "-Infinity"}
        if lowered in words:
            return _check(target, words[lowered])
        try:
            return _check(target, float(text))
        except ValueError:
            raise CastFailure(f'invalid input syntax for {target}: "{text}"') from None
    if kind is TypeKind.NUMERIC:
        return _check(target, text)
    if kind is TypeKind.BOOLEAN:
        lowered = text.lower()  # PostgreSQL's parse_bool: any prefix of true/false/yes/no, on, of(f), 1, 0
        if lowered and (any(word.startswith(lowered) for word in ("true", "yes")) or lowered in ("on", "1")):
            return True
        if lowered and (any(word.startswith(lowered) for word in ("false", "no")) or lowered in ("of", "off", "0")):
            return False
        raise CastFailure(f'invalid input syntax for BOOLEAN: "{text}"')
    if kind is TypeKind.BYTEA:
        return _bytea_from_text(text)
    if kind is TypeKind.JSONB:
        try:  # checked as a WAL value: json.loads reads NaN and Infinity, and 1e500 as inf; jsonb does not
            return _check(target, json.loads(text))
        except ValueError:
            raise CastFailure(f'invalid input syntax for JSONB: "{text}"') from None
    if kind in (TypeKind.DATE, TypeKind.TIME, TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
        return _datetime_from_text(text, target)
    return _check(target, text)


#: the ISO forms of PostgreSQL's date/time input: a date, a time (seconds optional), an offset, each
#: where the type has use for it (a DATE ignores a time, a TIMESTAMP an offset, as PostgreSQL does)
_DATETIME_TEXT = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})?"
                            r"(?:(?(date)(?P<sep>[ T])|)(?P<time>\d{1,2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?))?"
                            r"\s*(?P<offset>Z|[+-]\d{2}(?::?\d{2}){0,2})?$", re.ASCII)


def _datetime_from_text(text: str, target: DataType) -> Any:
    match = _DATETIME_TEXT.match(text)
    if match is None or not (match["date"] or match["time"]):
        return _check(target, text)  # fails, saying what the type expects
    date, time, offset = match["date"], match["time"], match["offset"]
    if time is not None:
        hours, rest = time.split(":", 1)
        time = f"{int(hours):02d}:{rest}" + (":00" if rest.count(":") == 0 else "")
    kind = target.kind
    if kind is TypeKind.TIME:  # PostgreSQL's time reads a date before a blank, not before a T
        return _check(target, time if time is not None and match["sep"] != "T" else text)
    if date is None:
        return _check(target, text)
    if kind is TypeKind.DATE:
        return _check(target, date)
    stamp = f"{date}T{time or '00:00:00'}"
    if kind is TypeKind.TIMESTAMP:
        return _check(target, stamp)
    return _check(target, stamp + ("+00:00" if offset is None else offset))  # session time zone: UTC


def _bytea_from_text(text: str) -> bytes:
    """PostgreSQL's byteain: ``\\x`` then hex digits (blanks between pairs allowed), or the escape
    format (``\\\\`` is a backslash, ``\\ooo`` an octal byte, anything else its UTF-8 bytes)."""
    if text.startswith("\\x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError:
            raise CastFailure(f'invalid hex in "{text}"') from None
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] != "\\":
            out += text[i].encode()
            i += 1
        elif text[i + 1: i + 2] == "\\":
            out.append(0x5C)
            i += 2
        elif len(text) >= i + 4 and text[i + 1] in "0123" and all(c in "01234567" for c in text[i + 2: i + 4]):
            out.append(int(text[i + 1: i + 4], 8))
            i += 4
        else:
            raise CastFailure(f'invalid input syntax for type bytea: "{text}"')
    return bytes(out)


def _array_element_text(text: str) -> str:
    """An element as PostgreSQL's array_out writes it: quoted when empty, NULL, or holding a blank or
    one of ``{}",\\``, with ``"`` and ``\\`` escaped."""
    if text == "" or text.upper() == "NULL" or any(c in '{}",\\ \t\n\r\v\f' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _jsonb_text(value: Any) -> str:
    """jsonb's output: canonical_json, but numbers as PostgreSQL's numeric prints them (1e+20 is
    100000000000000000000, 1.5e-07 is 0.00000015)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_jsonb_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb_text(v) for v in value) + "]"
    if isinstance(value, float):
        return format(abs(Decimal(repr(value))) if value == 0 else Decimal(repr(value)), "f")
    return json.dumps(value, ensure_ascii=False)


def to_text(value: Any, source: DataType) -> str:
    """PostgreSQL's text output of a value (session time zone UTC)."""
    kind = source.kind
    if kind is TypeKind.BOOLEAN:
        return "true" if value else "false"
    if kind in _FLOATS:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return _float_text(float(value), 15 if kind is TypeKind.DOUBLE else 6)
    if kind is TypeKind.BYTEA:
        return "\\x" + bytes(value).hex()
    if kind is TypeKind.TIMESTAMP:
        return _trim_fraction(value.isoformat(sep=" "))
    if kind is TypeKind.TIMESTAMPTZ:
        return _trim_fraction(value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ")) + "+00"
    if kind is TypeKind.TIME:
        return _trim_fraction(value.isoformat())
    if kind is TypeKind.JSONB:
        return _jsonb_text(json.loads(canonical_json(value)))
    if kind is TypeKind.INTERVAL:
        return _interval_text(value)
    if kind is TypeKind.ARRAY:
        base = array_base(source)
        return "{" + ",".join("NULL" if v is None else to_text(v, source) if isinstance(v, list)
                              else _array_element_text(to_text(v, base)) for v in value) + "}"
    if kind is TypeKind.NUMERIC:
        with localcontext() as ctx:
            ctx.prec = 2000
            try:
                return format(abs(Decimal(value)) if value == 0 else Decimal(value), "f")
            except InvalidOperation:  # pragma: no cover
                return str(value)
    if kind is TypeKind.UUID or kind is TypeKind.DATE or kind is TypeKind.TIME:
        return str(value)
    return str(value)


def _float_text(value: float, exponent_from: int) -> str:
    """PostgreSQL's shortest float output: exponential below 1e-4 or from 10^exponent_from on."""
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    shortest = Decimal(repr(value)).normalize()
    sign, digits, exponent = shortest.as_tuple()
    assert isinstance(exponent, int)
    magnitude = len(digits) - 1 + exponent
    if magnitude < -4 or magnitude >= exponent_from:
        mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'+' if magnitude >= 0 else '-'}{abs(magnitude):02d}"
    return format(shortest, "f")


def _trim_fraction(text: str) -> str:
    """Drop trailing zeros of fractional seconds, as PostgreSQL prints them."""
    if "." not in text:
        return text
    head, _, fraction = text.rpartition(".")
    fraction = fraction.rstrip("0")
    return f"{head}.{fraction}" if fraction else head


def _interval_text(value: Interval) -> str:
    """PostgreSQL's interval output (IntervalStyle postgres), e.g. '1 year 2 mons 3 days 04:05:06.5'."""
    parts = []
    years, months = int(value.months / 12), value.months - 12 * int(value.months / 12)
    negative = False  # a positive part after a negative one is written with "+" ('-1 days +01:00:00')
    for amount, unit in ((years, "year"), (months, "mon"), (value.days, "day")):
        if amount:
            parts.append(f"{'+' if negative and amount > 0 else ''}{amount} {unit}{'' if amount == 1 else 's'}")
            negative = amount < 0
    micros = value.micros
    if micros or not parts:
        sign = "-" if micros < 0 else "+" if negative else ""
        micros = abs(micros)
        seconds, fraction = divmod(micros, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        minutes, secs = divmod(rest, 60)
        text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}" + (f".{fraction:06d}".rstrip("0") if fraction else "")
        parts.append(text)
    return " ".join(parts)
