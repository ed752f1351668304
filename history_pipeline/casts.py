"""SQL CAST between the contract's types, with PostgreSQL's rules, on Python-form values.

Used when a column changes type: rows that exist at the change read their old
value cast to the new type, and a value that cannot be cast is an error at
ingest (never at query time).
"""

from __future__ import annotations

import datetime as dt
import json
import math
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
_TEXTS = (TypeKind.TEXT, TypeKind.VARCHAR)


class CastFailure(ValueError):
    """A value cannot be cast; the message says why."""


def cast_value(value: Any, source: DataType, target: DataType) -> Any:
    """CAST(value AS target) for a Python-form ``value`` of type ``source``."""
    if value is None:
        return None
    s, t = source.kind, target.kind
    try:
        if t in _TEXTS:
            return _check(target, to_text(value, source))
        if s in _TEXTS:
            return _from_text(value.strip() if t not in _TEXTS else value, target)
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


def _from_text(text: str, target: DataType) -> Any:
    kind = target.kind
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
        lowered = text.lower()
        if lowered in ("t", "true", "y", "yes", "on", "1"):
            return True
        if lowered in ("f", "false", "n", "no", "off", "0"):
            return False
        raise CastFailure(f'invalid input syntax for BOOLEAN: "{text}"')
    if kind is TypeKind.BYTEA:
        if text.startswith("\\x"):
            try:
                return bytes.fromhex(text[2:])
            except ValueError:
                raise CastFailure(f'invalid hex in "{text}"') from None
        return text.encode()
    if kind is TypeKind.JSONB:
        try:
            return json.loads(text)
        except ValueError:
            raise CastFailure(f'invalid input syntax for JSONB: "{text}"') from None
    if kind is TypeKind.TIMESTAMP:
        return _check(target, text.replace(" ", "T", 1))
    if kind is TypeKind.TIMESTAMPTZ:
        candidate = text.replace(" ", "T", 1)
        try:
            return _check(target, candidate)
        except ValueTypeError:
            return _check(target, candidate + "+00:00")
    return _check(target, text)


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
        return canonical_json(value)
    if kind is TypeKind.INTERVAL:
        return _interval_text(value)
    if kind is TypeKind.ARRAY:
        base = array_base(source)
        return "{" + ",".join("NULL" if v is None else to_text(v, source if isinstance(v, list) else base)
                              for v in value) + "}"
    if kind is TypeKind.NUMERIC:
        with localcontext() as ctx:
            ctx.prec = 2000
            try:
                return format(Decimal(value), "f")
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
    for amount, unit in ((years, "year"), (months, "mon"), (value.days, "day")):
        if amount:
            parts.append(f"{amount} {unit}{'' if amount == 1 else 's'}")
    micros = value.micros
    if micros or not parts:
        sign = "-" if micros < 0 else ""
        micros = abs(micros)
        seconds, fraction = divmod(micros, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        minutes, secs = divmod(rest, 60)
        text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}" + (f".{fraction:06d}".rstrip("0") if fraction else "")
        parts.append(text)
    return " ".join(parts)
