"""SQL data types of the contract, and how their values travel.

A value has three forms:

* its **WAL form**: the JSON value of docs/wal-format.md's type table (``"12.3400"``,
  ``{"months": 1, ...}``, base64 text ...);
* its **Python form**: what users get back (``Decimal``, ``datetime`` with UTC,
  ``uuid.UUID``, :class:`Interval`, lists, parsed JSON ...);
* its **Arrow form**: the richest lossless Arrow/Parquet type (``arrow_type``).

``decode_value`` turns the WAL form into the Python form and validates it;
``encode_value`` turns it back. Both are exact inverses on valid input.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import json
import math
import re
import struct
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import Any

import numpy as np
import pyarrow as pa

from history_pipeline.errors import DataTypeError, QueryError, ValueTypeError


class TypeKind(enum.Enum):
    BOOLEAN = "BOOLEAN"
    SMALLINT = "SMALLINT"
    INTEGER = "INTEGER"
    BIGINT = "BIGINT"
    REAL = "REAL"
    DOUBLE = "DOUBLE PRECISION"
    NUMERIC = "NUMERIC"
    TEXT = "TEXT"
    VARCHAR = "VARCHAR"
    CHAR = "CHAR"
    BYTEA = "BYTEA"
    UUID = "UUID"
    DATE = "DATE"
    TIME = "TIME"
    TIMESTAMP = "TIMESTAMP"
    TIMESTAMPTZ = "TIMESTAMPTZ"
    INTERVAL = "INTERVAL"
    JSONB = "JSONB"
    ARRAY = "ARRAY"


_ALIASES: dict[str, TypeKind] = {
    "BOOLEAN": TypeKind.BOOLEAN,
    "BOOL": TypeKind.BOOLEAN,
    "SMALLINT": TypeKind.SMALLINT,
    "INT2": TypeKind.SMALLINT,
    "INTEGER": TypeKind.INTEGER,
    "INT": TypeKind.INTEGER,
    "INT4": TypeKind.INTEGER,
    "BIGINT": TypeKind.BIGINT,
    "INT8": TypeKind.BIGINT,
    "REAL": TypeKind.REAL,
    "FLOAT4": TypeKind.REAL,
    "DOUBLE PRECISION": TypeKind.DOUBLE,
    "DOUBLE": TypeKind.DOUBLE,
    "FLOAT8": TypeKind.DOUBLE,
    "NUMERIC": TypeKind.NUMERIC,
    "DECIMAL": TypeKind.NUMERIC,
    "TEXT": TypeKind.TEXT,
    "VARCHAR": TypeKind.VARCHAR,
    "CHARACTER VARYING": TypeKind.VARCHAR,
    "CHAR VARYING": TypeKind.VARCHAR,
    "CHAR": TypeKind.CHAR,
    "CHARACTER": TypeKind.CHAR,
    "BPCHAR": TypeKind.CHAR,
    "BYTEA": TypeKind.BYTEA,
    "UUID": TypeKind.UUID,
    "DATE": TypeKind.DATE,
    "TIME": TypeKind.TIME,
    "TIME WITHOUT TIME ZONE": TypeKind.TIME,
    "TIMESTAMP": TypeKind.TIMESTAMP,
    "TIMESTAMP WITHOUT TIME ZONE": TypeKind.TIMESTAMP,
    "TIMESTAMPTZ": TypeKind.TIMESTAMPTZ,
    "TIMESTAMP WITH TIME ZONE": TypeKind.TIMESTAMPTZ,
    "INTERVAL": TypeKind.INTERVAL,
    "JSONB": TypeKind.JSONB,
    "JSON": TypeKind.JSONB,
}

_INT_RANGES = {
    TypeKind.SMALLINT: (-(2**15), 2**15 - 1),
    TypeKind.INTEGER: (-(2**31), 2**31 - 1),
    TypeKind.BIGINT: (-(2**63), 2**63 - 1),
}

#: PostgreSQL's largest length of a VARCHAR(n) or CHAR(n)
MAX_STRING_LENGTH = 10_485_760

#: Arrow's decimal128 holds at most 38 digits; wider or unconstrained NUMERIC is kept as text.
MAX_DECIMAL128_PRECISION = 38


@dataclass(frozen=True)
class DataType:
    """One SQL type of the contract. ``element`` is set for arrays only."""

    kind: TypeKind
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    element: DataType | None = None

    def __str__(self) -> str:
        if self.kind is TypeKind.ARRAY:
            assert self.element is not None
            return f"{self.element}[]"
        if self.kind is TypeKind.NUMERIC and self.precision is not None:
            return f"NUMERIC({self.precision},{self.scale or 0})"
        if self.kind is TypeKind.VARCHAR and self.length is not None:
            return f"VARCHAR({self.length})"
        if self.kind is TypeKind.CHAR:
            # PostgreSQL's bpchar without a length: no padding, no limit (CHAR alone is CHAR(1))
            return "BPCHAR" if self.length is None else f"CHAR({self.length})"
        return self.kind.value

    def __eq__(self, other: object) -> bool:
        """Equal to another DataType, or to any spelling of it (``"int"`` == INTEGER)."""
        if isinstance(other, str):
            try:
                other = parse_data_type(other)
            except DataTypeError:
                return False
        if not isinstance(other, DataType):
            return NotImplemented
        return (self.kind, self.precision, self.scale, self.length, self.element) == (
            other.kind,
            other.precision,
            other.scale,
            other.length,
            other.element,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.precision, self.scale, self.length, self.element))

    @property
    def is_exact_decimal(self) -> bool:
        """True when values fit Arrow's decimal128 exactly (NUMERIC(p,s) with p <= 38)."""
        return (
            self.kind is TypeKind.NUMERIC
            and self.precision is not None
            and self.precision <= MAX_DECIMAL128_PRECISION
        )


_TYPE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ]*?)\s*(?:\(\s*(\d+)\s*(?:,\s*(-?\d+)\s*)?\))?\s*$")


def parse_data_type(text: str) -> DataType:
    """Parse a type string such as ``NUMERIC(10,2)``, ``VARCHAR(20)`` or ``INTEGER[][]``."""
    if not isinstance(text, str) or not text.strip():
        raise DataTypeError(f"data type must be a non-empty string, got {text!r}")
    stripped = text.strip()
    if stripped.endswith("[]"):
        return DataType(TypeKind.ARRAY, element=parse_data_type(stripped[:-2]))
    match = _TYPE_RE.match(stripped)
    if not match:
        raise DataTypeError(f"unknown data type {text!r}")
    name = " ".join(match.group(1).upper().split())
    kind = _ALIASES.get(name)
    if kind is None:
        raise DataTypeError(f"unknown data type {text!r}; known: {sorted(set(_ALIASES))}")
    first, second = match.group(2), match.group(3)
    if kind is TypeKind.NUMERIC:
        if first is None:
            return DataType(kind)
        precision, scale = int(first), int(second or 0)
        if not 1 <= precision <= 1000 or not 0 <= scale <= precision:
            raise DataTypeError(f"invalid precision/scale in {text!r}")
        return DataType(kind, precision=precision, scale=scale)
    if kind in (TypeKind.VARCHAR, TypeKind.CHAR):
        if second is not None:
            raise DataTypeError(f"{name} takes one length, got {text!r}")
        if first is None:
            # as in PostgreSQL: CHAR and CHARACTER are CHAR(1); BPCHAR (and VARCHAR) alone have no length
            return DataType(kind, length=1 if kind is TypeKind.CHAR and name != "BPCHAR" else None)
        if not 1 <= int(first) <= MAX_STRING_LENGTH:
            raise DataTypeError(f"{name} length must be between 1 and {MAX_STRING_LENGTH} in {text!r}")
        return DataType(kind, length=int(first))
    if first is not None:
        raise DataTypeError(f"type {name} takes no parameters, got {text!r}")
    return DataType(kind)


@dataclass(frozen=True)
class Interval:
    """A SQL INTERVAL: months, days and microseconds kept apart, as in PostgreSQL."""

    months: int
    days: int
    micros: int


# --- WAL form -> Python form ------------------------------------------------------------


def decode_value(data_type: DataType, value: Any) -> Any:
    """Validate a WAL (JSON) value against ``data_type`` and return its Python form.

    Raises :class:`ValueTypeError` saying what is wrong; ``None`` is SQL NULL.
    """
    if value is None:
        return None
    decoder = _DECODERS[data_type.kind]
    return decoder(data_type, value)


def _fail(data_type: DataType, value: Any, why: str) -> ValueTypeError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueTypeError(f"value {shown} is not a valid {data_type}: {why}")


def _decode_bool(t: DataType, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(t, v, "expected true or false")
    return v


def _decode_int(t: DataType, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(t, v, "expected an integer")
    low, high = _INT_RANGES[t.kind]
    if not low <= v <= high:
        raise _fail(t, v, f"out of range [{low}, {high}]")
    return v


_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _decode_float(t: DataType, v: Any) -> float:
    if isinstance(v, str):
        if v not in _FLOAT_WORDS:
            raise _fail(t, v, 'expected a number or "NaN", "Infinity", "-Infinity"')
        return _FLOAT_WORDS[v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(t, v, "expected a number")
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float
        raise _fail(t, v, "out of range") from None
    if math.isinf(f) or math.isnan(f):
        raise _fail(t, v, 'non-finite numbers are written as strings ("NaN", "Infinity")')
    if t.kind is TypeKind.REAL:
        # PostgreSQL's float4in: out of range when the nearest float32 overflows or a nonzero value
        # underflows to zero (3.4028235e38, FLT_MAX as PostgreSQL prints it, is in range)
        try:
            single = struct.unpack("<f", struct.pack("<f", f))[0]
        except OverflowError:
            raise _fail(t, v, "out of range for REAL") from None
        if single == 0.0 and f != 0.0:
            raise _fail(t, v, "out of range for REAL (underflow)")
        f = real_from_float32(single)
    return f


def real_from_float32(f: float) -> float:
    """The shortest decimal reading of a float32, as PostgreSQL prints a REAL."""
    if math.isnan(f) or math.isinf(f):
        return f
    packed = struct.pack("<f", f)
    for digits in range(1, 10):
        candidate = float(f"{f:.{digits}g}")
        try:
            if struct.pack("<f", candidate) == packed:
                return candidate
        except OverflowError:  # a reading of FLT_MAX rounded up past it: not the shortest one
            continue
    return f


_DECIMAL_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$", re.ASCII)  # PostgreSQL reads ASCII digits only


#: PostgreSQL's numeric holds up to 131072 digits before the decimal point
_NUMERIC_MAX_INTEGER_DIGITS = 131072


def _decode_numeric(t: DataType, v: Any) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _fail(t, v, 'expected a decimal string such as "12.3400"')
    text = str(v)
    if text in ("NaN",):
        raise _fail(t, v, "NaN is not supported for NUMERIC")
    if not _DECIMAL_RE.match(text):
        raise _fail(t, v, "not a decimal number")
    try:
        d = Decimal(text)
    except InvalidOperation as exc:  # pragma: no cover - the regex already filters
        raise _fail(t, v, "not a decimal number") from exc
    if t.precision is not None:
        scale = t.scale or 0
        # too many integer digits already: quantizing an exponent such as 1e5000 to the scale
        # would need more digits than any context holds (decimal.InvalidOperation)
        if d != 0 and d.adjusted() >= t.precision - scale + 1:
            raise _fail(t, v, f"needs more than {t.precision} digits with scale {scale}")
        with localcontext() as ctx:
            ctx.prec = 2000
            d = d.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
        digits = len(d.as_tuple().digits) if d != 0 else 1
        integer_digits = digits + d.as_tuple().exponent  # type: ignore[operator]
        if integer_digits > t.precision - scale:
            raise _fail(t, v, f"needs more than {t.precision} digits with scale {scale}")
    if d.as_tuple().exponent > 0:  # type: ignore[operator]
        if d.adjusted() >= _NUMERIC_MAX_INTEGER_DIGITS:
            raise _fail(t, v, f"more than {_NUMERIC_MAX_INTEGER_DIGITS} digits before the decimal point "
                              "(PostgreSQL's numeric overflows)")
        with localcontext() as ctx:  # '1e3' is 1000 (scale 0), as PostgreSQL reads it
            ctx.prec = d.adjusted() + 1  # every digit of the integer, however large the exponent
            d = d.quantize(Decimal(1))
    # PostgreSQL's numeric has no negative zero: '-0.000' reads 0.000 (and so does a value rounded to 0)
    return d.copy_abs() if d.is_zero() else d


def _decode_text(t: DataType, v: Any) -> str:
    if not isinstance(v, str):
        raise _fail(t, v, "expected a string")
    if not _is_unicode(v):
        raise _fail(t, v, "not valid Unicode (a lone surrogate escape such as \\ud800)")
    if "\x00" in v:
        raise _fail(t, v, "text cannot contain NUL characters")
    if t.length is not None and len(v) > t.length:
        raise _fail(t, v, f"longer than {t.length} characters")
    return v


def _decode_char(t: DataType, v: Any) -> str:
    """PostgreSQL's bpchar input: blank-padded to the length; a longer value is an error unless
    what passes the length is blanks, which are cut."""
    if isinstance(v, str) and t.length is not None and len(v) > t.length and not v[t.length:].strip(" "):
        v = v[: t.length]
    text = _decode_text(t, v)
    return text if t.length is None else text.ljust(t.length)


def _decode_bytea(t: DataType, v: Any) -> bytes:
    if not isinstance(v, str):
        raise _fail(t, v, "expected a base64 string")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _fail(t, v, "not valid base64") from exc


def _decode_uuid(t: DataType, v: Any) -> uuid.UUID:
    if not isinstance(v, str):
        raise _fail(t, v, "expected a UUID string")
    try:
        return uuid.UUID(v)
    except ValueError as exc:
        raise _fail(t, v, "not a UUID") from exc


_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME_RE = re.compile(r"^\d{2}:\d{2}:\d{2}(\.\d{1,6})?$")
_TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?")
_OFFSET_RE = re.compile(r"(Z|[+-]\d{2}(:?\d{2})?(:?\d{2})?)$")


def _decode_date(t: DataType, v: Any) -> dt.date:
    if not isinstance(v, str) or not _DATE_RE.match(v):
        raise _fail(t, v, 'expected "YYYY-MM-DD"')
    try:
        return dt.date.fromisoformat(v)
    except ValueError as exc:
        raise _fail(t, v, str(exc)) from exc


def _decode_time(t: DataType, v: Any) -> dt.time:
    if not isinstance(v, str) or not _TIME_RE.match(v):
        raise _fail(t, v, 'expected "HH:MM:SS[.ffffff]"')
    try:
        return dt.time.fromisoformat(v)
    except ValueError as exc:
        raise _fail(t, v, str(exc)) from exc


def _decode_timestamp(t: DataType, v: Any) -> dt.datetime:
    if not isinstance(v, str) or not _TS_RE.match(v) or _has_offset(v):
        raise _fail(t, v, 'expected "YYYY-MM-DDTHH:MM:SS[.ffffff]" without an offset')
    try:
        return dt.datetime.fromisoformat(v)
    except ValueError as exc:
        raise _fail(t, v, str(exc)) from exc


def _has_offset(text: str) -> bool:
    time_part = text[10:]
    return bool(_OFFSET_RE.search(time_part)) and (
        time_part.endswith("Z") or "+" in time_part or time_part.count("-") > 0
    )


def _decode_timestamptz(t: DataType, v: Any) -> dt.datetime:
    if not isinstance(v, str) or not _TS_RE.match(v) or not _has_offset(v):
        raise _fail(t, v, "expected an ISO 8601 timestamp with an offset")
    try:
        parsed = dt.datetime.fromisoformat(v)
    except ValueError as exc:
        raise _fail(t, v, str(exc)) from exc
    if parsed.tzinfo is None:  # pragma: no cover - guarded by _has_offset
        raise _fail(t, v, "missing offset")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError as exc:
        raise _fail(t, v, "out of range once converted to UTC") from exc


def _decode_interval(t: DataType, v: Any) -> Interval:
    if not isinstance(v, dict) or set(v) != {"months", "days", "micros"}:
        raise _fail(t, v, 'expected {"months": int, "days": int, "micros": int}')
    parts = []
    for name, bits in (("months", 32), ("days", 32), ("micros", 64)):
        part = v[name]
        if isinstance(part, bool) or not isinstance(part, int):
            raise _fail(t, v, f"{name} must be an integer")
        if not -(2 ** (bits - 1)) <= part < 2 ** (bits - 1):
            raise _fail(t, v, f"{name} out of range")
        parts.append(part)
    return Interval(*parts)


def _decode_jsonb(t: DataType, v: Any) -> Any:
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(t, v, f"not a JSON value: {exc}") from exc
    if not _is_unicode(json.dumps(v, ensure_ascii=False)):
        raise _fail(t, v, "not valid Unicode (a lone surrogate escape such as \\ud800)")
    return v


def _is_unicode(text: str) -> bool:
    """False for text holding a lone surrogate (JSON allows the escape; UTF-8 and PostgreSQL do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: PostgreSQL's limit on array dimensions (MAXDIM)
MAX_ARRAY_DIMENSIONS = 6


def array_base(data_type: DataType) -> DataType:
    """The element type under every ``[]``: PostgreSQL's ``INTEGER[]`` and ``INTEGER[][]`` are one type."""
    while data_type.kind is TypeKind.ARRAY:
        assert data_type.element is not None
        data_type = data_type.element
    return data_type


def array_shape(value: list[Any]) -> tuple[int, ...]:
    """The dimensions of a rectangular nested list (``()`` for the empty array); ValueError otherwise."""
    if not value:
        return ()
    nested = [isinstance(item, list) for item in value]
    if not any(nested):
        return (len(value),)
    if not all(nested):
        raise ValueError("sub-arrays and elements are mixed at one level (or a sub-array is null)")
    shapes = {array_shape(item) for item in value}
    if len(shapes) != 1 or () in shapes:
        raise ValueError("multidimensional arrays must have sub-arrays with matching dimensions")
    return (len(value), *shapes.pop())


def map_leaves(value: list[Any], function: Any) -> list[Any]:
    """The nested list with ``function`` applied to every non-list element (nulls included)."""
    return [map_leaves(item, function) if isinstance(item, list) else function(item) for item in value]


def _decode_array(t: DataType, v: Any) -> list[Any]:
    # as in PostgreSQL, the declared number of [] does not bind: any rectangular array of the
    # element type is a value, up to six dimensions; an empty array has none
    if not isinstance(v, list):
        raise _fail(t, v, "expected a JSON array")
    try:
        shape = array_shape(v)
    except ValueError as exc:
        raise _fail(t, v, str(exc)) from None
    if len(shape) > MAX_ARRAY_DIMENSIONS:
        raise _fail(t, v, f"{len(shape)} dimensions exceed the maximum of {MAX_ARRAY_DIMENSIONS}")
    base = array_base(t)
    return map_leaves(v, lambda item: decode_value(base, item))


_DECODERS = {
    TypeKind.BOOLEAN: _decode_bool,
    TypeKind.SMALLINT: _decode_int,
    TypeKind.INTEGER: _decode_int,
    TypeKind.BIGINT: _decode_int,
    TypeKind.REAL: _decode_float,
    TypeKind.DOUBLE: _decode_float,
    TypeKind.NUMERIC: _decode_numeric,
    TypeKind.TEXT: _decode_text,
    TypeKind.VARCHAR: _decode_text,
    TypeKind.CHAR: _decode_char,
    TypeKind.BYTEA: _decode_bytea,
    TypeKind.UUID: _decode_uuid,
    TypeKind.DATE: _decode_date,
    TypeKind.TIME: _decode_time,
    TypeKind.TIMESTAMP: _decode_timestamp,
    TypeKind.TIMESTAMPTZ: _decode_timestamptz,
    TypeKind.INTERVAL: _decode_interval,
    TypeKind.JSONB: _decode_jsonb,
    TypeKind.ARRAY: _decode_array,
}


# --- Python form -> WAL form ------------------------------------------------------------


def encode_value(data_type: DataType, value: Any) -> Any:
    """Return the WAL (JSON) form of a Python value of ``data_type``."""
    if value is None:
        return None
    kind = data_type.kind
    if kind in (TypeKind.REAL, TypeKind.DOUBLE):
        f = float(value)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        return f
    if kind is TypeKind.NUMERIC:
        return str(value)
    if kind is TypeKind.BYTEA:
        return base64.b64encode(bytes(value)).decode("ascii")
    if kind is TypeKind.UUID:
        return str(value)
    if kind in (TypeKind.DATE, TypeKind.TIME, TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
        return value.isoformat()
    if kind is TypeKind.INTERVAL:
        return {"months": value.months, "days": value.days, "micros": value.micros}
    if kind is TypeKind.ARRAY:
        base = array_base(data_type)
        return map_leaves(value, lambda item: encode_value(base, item))
    return value


# --- Arrow form --------------------------------------------------------------------

class JsonbScalar(pa.ExtensionScalar):
    """A JSONB value that reads back as the JSON value itself (dict, list, number, ...)."""

    def as_py(self, *args: Any, **kwargs: Any) -> Any:
        text = self.value
        return None if text is None else json.loads(text.as_py())


class JsonbType(pa.ExtensionType):
    """JSONB in query results: JSON text whose values read back parsed (``to_pylist``, ``as_py``)."""

    def __init__(self) -> None:
        super().__init__(pa.string(), "history_pipeline.jsonb")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> JsonbType:
        return cls()

    def __arrow_ext_scalar_class__(self) -> type:
        return JsonbScalar


JSONB_RESULT = JsonbType()
pa.register_extension_type(JSONB_RESULT)


class NumericScalar(pa.ExtensionScalar):
    """An exact NUMERIC kept as decimal text, read back as ``Decimal``."""

    def as_py(self, *args: Any, **kwargs: Any) -> Any:
        text = self.value
        return None if text is None else Decimal(text.as_py())


class NumericTextType(pa.ExtensionType):
    """NUMERIC without a precision that fits Arrow's decimals: exact text that reads back as Decimal."""

    def __init__(self) -> None:
        super().__init__(pa.string(), "history_pipeline.numeric")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> NumericTextType:
        return cls()

    def __arrow_ext_scalar_class__(self) -> type:
        return NumericScalar


NUMERIC_RESULT = NumericTextType()
pa.register_extension_type(NUMERIC_RESULT)


def _as_extension(column: Any, ext: pa.ExtensionType) -> Any:
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    if isinstance(storage, pa.ChunkedArray):
        chunks = [c.storage if isinstance(c, pa.ExtensionArray) else c for c in storage.chunks]
        return pa.chunked_array([pa.ExtensionArray.from_storage(ext, c) for c in chunks], ext)
    return pa.ExtensionArray.from_storage(ext, storage)


def numeric_result_array(column: Any) -> Any:
    """A stored wide NUMERIC column (decimal text) as the result type whose values read back as Decimal."""
    return _as_extension(column, NUMERIC_RESULT)


def jsonb_result_array(column: Any) -> Any:
    """A stored JSONB column (``arrow.json``) as the result type whose values read back parsed."""
    return _as_extension(column, JSONB_RESULT)


INTERVAL_ARROW = pa.struct(
    [("months", pa.int32()), ("days", pa.int32()), ("micros", pa.int64())]
)

#: the largest time part (micros) whose nanoseconds fit month_day_nano's int64
_MAX_NANO_MICROS = (2**63 - 1) // 1000

#: Arrow's month_day_nano value as laid out in its data buffer
_MONTH_DAY_NANO = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])


def interval_values(column: Any) -> Any:
    """Stored intervals (``INTERVAL_ARROW``) as Arrow ``month_day_nano_interval`` values, the
    result type users see: built from the fields' buffers, not value by value."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([interval_values(c) for c in column.chunks], pa.month_day_nano_interval())
    months, days, micros = column.flatten()  # each field with the struct's offset and NULLs applied
    values = np.zeros(len(column), dtype=_MONTH_DAY_NANO)
    values["months"] = months.fill_null(0).to_numpy()
    values["days"] = days.fill_null(0).to_numpy()
    stored = micros.fill_null(0).to_numpy()
    if ((stored > _MAX_NANO_MICROS) | (stored < -_MAX_NANO_MICROS)).any():
        # int64 nanoseconds hold +-292 years of time: beyond, the product wrapped to another value
        raise QueryError("an INTERVAL's time part exceeds what Arrow's month_day_nano holds (+-292 years of "
                         "microseconds); read the row with fetch_row, which gives it exactly")
    values["nanos"] = stored * 1000
    validity = column.is_valid().buffers()[1] if column.null_count else None
    return pa.Array.from_buffers(pa.month_day_nano_interval(), len(column), [validity, pa.py_buffer(values)])


def interval_storage(column: Any) -> Any:
    """``interval_values`` undone: ``month_day_nano_interval`` values as stored (``INTERVAL_ARROW``),
    which Parquet can hold (an export writes them so)."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([interval_storage(c) for c in column.chunks], INTERVAL_ARROW)
    data = column.buffers()[1]
    values = np.frombuffer(data, dtype=_MONTH_DAY_NANO, count=column.offset + len(column))[column.offset:] \
        if data is not None else np.zeros(0, dtype=_MONTH_DAY_NANO)
    mask = column.is_null() if column.null_count else None
    return pa.StructArray.from_arrays(
        [pa.array(values["months"]), pa.array(values["days"]), pa.array(values["nanos"] // 1000)],
        fields=list(INTERVAL_ARROW), mask=mask)


def arrow_type(data_type: DataType) -> pa.DataType:
    """The lossless Arrow (and Parquet) storage type of ``data_type``."""
    kind = data_type.kind
    simple = {
        TypeKind.BOOLEAN: pa.bool_(),
        TypeKind.SMALLINT: pa.int16(),
        TypeKind.INTEGER: pa.int32(),
        TypeKind.BIGINT: pa.int64(),
        TypeKind.REAL: pa.float32(),
        TypeKind.DOUBLE: pa.float64(),
        TypeKind.TEXT: pa.string(),
        TypeKind.VARCHAR: pa.string(),
        TypeKind.CHAR: pa.string(),
        TypeKind.BYTEA: pa.binary(),
        TypeKind.UUID: pa.uuid(),
        TypeKind.DATE: pa.date32(),
        TypeKind.TIME: pa.time64("us"),
        TypeKind.TIMESTAMP: pa.timestamp("us"),
        TypeKind.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
        TypeKind.INTERVAL: INTERVAL_ARROW,
        TypeKind.JSONB: pa.json_(),
    }
    if kind in simple:
        return simple[kind]
    if kind is TypeKind.NUMERIC:
        if data_type.is_exact_decimal:
            return pa.decimal128(data_type.precision, data_type.scale or 0)
        return pa.string()  # exact decimal text: wider than any Arrow decimal DuckDB reads
    # an array column holds values of any depth row by row (as in PostgreSQL), which no Arrow
    # or DuckDB list type can: arrays are stored exactly as JSON of their WAL form
    return pa.json_()


_ARROW_NATIVE = {
    TypeKind.BOOLEAN, TypeKind.SMALLINT, TypeKind.INTEGER, TypeKind.BIGINT, TypeKind.REAL, TypeKind.DOUBLE,
    TypeKind.TEXT, TypeKind.VARCHAR, TypeKind.CHAR, TypeKind.BYTEA, TypeKind.DATE, TypeKind.TIME, TypeKind.TIMESTAMP,
    TypeKind.TIMESTAMPTZ,
}


def arrow_native(data_type: DataType) -> bool:
    """True when pyarrow takes the Python form as it is (no per-value conversion needed)."""
    return data_type.kind in _ARROW_NATIVE or data_type.is_exact_decimal


def to_arrow_value(data_type: DataType, value: Any) -> Any:
    """A Python-form value as pyarrow accepts it for ``arrow_type(data_type)``."""
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.UUID:
        return value.bytes
    if kind is TypeKind.INTERVAL:
        return {"months": value.months, "days": value.days, "micros": value.micros}
    if kind is TypeKind.JSONB:
        return canonical_json(value)
    if kind is TypeKind.NUMERIC and not data_type.is_exact_decimal:
        # positional notation ('0.0000001', not str()'s '1E-7'): SQL casts the stored text to DECIMAL,
        # and DuckDB does not read exponents there
        return format(value, "f")
    if kind is TypeKind.ARRAY:
        return array_json(data_type, value)
    return value


def array_json(data_type: DataType, value: list[Any]) -> str:
    """The stored form of an array: compact JSON of its WAL form."""
    return json.dumps(encode_value(data_type, value), separators=(",", ":"), ensure_ascii=False)


#: kinds whose ``to_pylist`` value is already the Python form (``from_arrow_value`` returns it as is)
_PYLIST_FORM = frozenset(TypeKind) - {
    TypeKind.UUID, TypeKind.INTERVAL, TypeKind.JSONB, TypeKind.NUMERIC, TypeKind.TIMESTAMPTZ, TypeKind.REAL,
    TypeKind.ARRAY,
}


def from_arrow_values(data_type: DataType, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The Python form of every value of an ``arrow_type`` column (``from_arrow_value`` of each).

    Most kinds need no per-value work: their ``to_pylist`` values are already the Python form.
    """
    values = column.to_pylist()
    if data_type.kind in _PYLIST_FORM or (data_type.kind is TypeKind.NUMERIC and data_type.is_exact_decimal):
        return values
    return [from_arrow_value(data_type, v) for v in values]


def from_arrow_value(data_type: DataType, value: Any) -> Any:
    """The Python form of a value read back with ``to_pylist`` from ``arrow_type``."""
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value))
    if kind is TypeKind.INTERVAL:
        if isinstance(value, dict):
            return Interval(value["months"], value["days"], value["micros"])
        return Interval(value.months, value.days, value.nanoseconds // 1000)
    if kind is TypeKind.JSONB:
        return json.loads(value) if isinstance(value, str) else value
    if kind is TypeKind.NUMERIC and not isinstance(value, Decimal):
        return Decimal(str(value))
    if kind is TypeKind.TIMESTAMPTZ and isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)
    if kind is TypeKind.REAL:
        return real_from_float32(value)
    if kind is TypeKind.ARRAY:
        if isinstance(value, str):
            return decode_value(data_type, json.loads(value))
        assert data_type.element is not None  # a result column already in list form
        return [from_arrow_value(data_type.element, item) for item in value]
    return value


#: element kinds whose Arrow storage type reads back equal inside a list result
_LIST_RESULT_KINDS = _ARROW_NATIVE - {TypeKind.REAL} | {TypeKind.UUID}


def array_result_array(column: Any, data_type: DataType, depths: set[int] | None = None) -> Any:
    """A stored array column (JSON) as query results give it.

    When every value has the same depth, an Arrow (and so DuckDB) nested list of the
    element type, which SQL indexes, unnests and compares naturally; otherwise (or for
    element types whose values a list cannot give back equal) a result type whose values
    read back as the nested lists. ``depths`` are those of the whole result when
    ``column`` is only a part of it (a stream's batch), so that every part has one type.
    """
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    if isinstance(storage, pa.ChunkedArray):
        storage = pa.concat_arrays([c.storage if isinstance(c, pa.ExtensionArray) else c for c in storage.chunks]) \
            if storage.num_chunks else pa.array([], pa.string())
    texts = storage.cast(pa.string()).to_pylist()
    values = [None if text is None else decode_value(data_type, json.loads(text)) for text in texts]
    base = array_base(data_type)
    if depths is None:
        depths = {len(array_shape(v)) for v in values if v}
    if len(depths) <= 1 and (base.kind in _LIST_RESULT_KINDS or base.is_exact_decimal or base.kind is TypeKind.REAL):
        leaf = pa.float64() if base.kind is TypeKind.REAL else arrow_type(base)
        # pa.array cannot build a list of an extension type (UUID) from Python values: build the
        # lists of its storage type, then cast them
        list_type, storage_type = leaf, leaf.storage_type if isinstance(leaf, pa.BaseExtensionType) else leaf
        for _ in range(max(depths, default=1)):
            list_type, storage_type = pa.list_(list_type), pa.list_(storage_type)
        convert = (lambda item: item) if base.kind is TypeKind.REAL else (lambda item: to_arrow_value(base, item))
        lists = pa.array([None if v is None else map_leaves(v, convert) for v in values], storage_type)
        return lists if storage_type == list_type else lists.cast(list_type)
    return pa.ExtensionArray.from_storage(ArrayResultType(str(base)), pa.array(texts, pa.string()))


class ArrayScalar(pa.ExtensionScalar):
    """An array whose depth varies by row, read back as nested lists of its element type."""

    def as_py(self, *args: Any, **kwargs: Any) -> Any:
        text = self.value
        if text is None:
            return None
        base = parse_data_type(self.type.element)
        return decode_value(DataType(TypeKind.ARRAY, element=base), json.loads(text.as_py()))


class ArrayResultType(pa.ExtensionType):
    """Arrays in query results when no one list type holds them: JSON text that reads back as lists."""

    def __init__(self, element: str) -> None:
        self.element = element
        super().__init__(pa.string(), "history_pipeline.array")

    def __arrow_ext_serialize__(self) -> bytes:
        return self.element.encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> ArrayResultType:
        return cls(serialized.decode())

    def __arrow_ext_scalar_class__(self) -> type:
        return ArrayScalar


pa.register_extension_type(ArrayResultType("TEXT"))


def canonical_json(value: Any) -> str:
    """JSONB's normalized text, as PostgreSQL prints it: keys ordered by length then bytes, ', ' and ': '
    separators."""
    return json.dumps(_jsonb_order(value), ensure_ascii=False)


def _jsonb_order(value: Any) -> Any:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value
