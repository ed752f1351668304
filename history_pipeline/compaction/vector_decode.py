"""Row events in their canonical form, decoded as Arrow kernels (the DataFrame engine's fast path).

The WAL writer prints a row event as one compact JSON object with its fields in a fixed order
(``{"op":"update","t":7,"table_uuid":"T","key":3,"values":{"c":"12.50"}}``). A line of exactly
that shape, whose values are scalars and whose strings hold no escape or control character, is
read the same way by every JSON parser, so it can be taken apart with regular expressions (RE2,
vectorized) instead of ``json.loads``. Each value is then decoded per column type with Arrow
compute and numpy, but only when its text is in a canonical form whose decoding is unambiguous
(``-?[1-9][0-9]*`` for integers, ``"YYYY-MM-DD"`` for dates ...); the check is a regular
expression plus range checks.

Every other row (another shape, an escape, an object or array value, a value outside its
canonical form or its range, a NULL where NOT NULL, an unknown column, a duplicate key, an
unknown table) is left to the reference decoder (``events.parse_line`` + ``types.decode_value``),
so accepted values and error messages stay exactly the contract's. INTERVAL, JSONB, arrays,
BYTEA and NUMERIC wider than 38 digits have no fast path yet: rows giving them a value take the
reference path too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.compaction.carriers import carrier_type, to_carrier
from history_pipeline.schema import ColumnSpec, Supercolumn, TableDescriptor
from history_pipeline.types import DataType, TypeKind, arrow_native, arrow_type, to_arrow_value


@dataclass(frozen=True)
class Epoch:
    """One schema epoch of a table, as the decoders need it."""

    table: TableDescriptor | None
    by_uuid: dict[str, tuple[ColumnSpec, int]]  # column uuid -> (column, supercolumn index)
    in_force: frozenset[int]
    defaults: dict[int, Any]  # supercolumn index -> a column's default (Python form)


# --- the line ------------------------------------------------------------------------------

_CHAR = r'[^"\\\x00-\x1f]'  # a string character that needs no escape
_STR = rf'"{_CHAR}*"'
_NUM = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_SCALAR = rf"(?:{_STR}|{_NUM}|true|false|null)"
_PAIR = rf'"{_CHAR}+":{_SCALAR}'
#: a row event exactly as the WAL writer prints it, with scalar values only (18-digit t and key
#: always fit their ranges; longer ones take the reference path)
LINE_RE = (
    r'^\{"op":"(?P<op>insert|update|delete)","t":(?P<t>0|[1-9][0-9]{0,17}),'
    rf'"table_uuid":"(?P<table>{_CHAR}+)","key":(?P<key>0|-?[1-9][0-9]{{0,17}})'
    rf'(?P<values>,"values":\{{(?P<body>(?:{_PAIR}(?:,{_PAIR})*)?)\}})?\}}$'
)
_SAFE_KEY = re.compile(r'^[^"\\\x00-\x1f]+$')


# --- values ----------------------------------------------------------------------------------


def _np(arr: Any) -> np.ndarray:
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _flags(arr: Any) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return _np(pc.fill_null(arr, False)).astype(bool)


def _matches(tokens: pa.Array, pattern: str) -> np.ndarray:
    return _np(pc.fill_null(pc.match_substring_regex(tokens, pattern), False)).astype(bool)


def _where(ok: np.ndarray, tokens: pa.Array, filler: str) -> pa.Array:
    """The tokens where ``ok``, a harmless filler elsewhere (so casts cannot fail)."""
    return pc.if_else(pa.array(ok), tokens, pa.scalar(filler, pa.string()))


def _ints(column: pa.Array) -> np.ndarray:
    """Digit strings (empty for an absent group) as int64."""
    filled = pc.if_else(pc.equal(pc.utf8_length(column), 0), pa.scalar("0"), column)
    return _np(filled.cast(pa.int64()))


_INT_TOKEN = r"^(?:0|-?[1-9][0-9]{0,17})$"
#: numbers whose float reading is correctly rounded by Arrow and by Python alike ("-0" is the
#: integer 0 for json.loads but -0.0 for a cast: left to the reference)
_FLOAT_TOKEN = r"^-?(?:0|[1-9][0-9]{0,16})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,3})?$"
_INT_RANGES = {TypeKind.SMALLINT: (-(2**15), 2**15 - 1), TypeKind.INTEGER: (-(2**31), 2**31 - 1),
               TypeKind.BIGINT: (-(2**63), 2**63 - 1)}
_DATE = r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
_TIME = r"(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]{1,6}))?"
_OFFSET = r"(?:Z|(?P<sign>[+-])(?P<oh>[0-9]{2}):(?P<om>[0-9]{2}))"
_UUID_TOKEN = r'^"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"$'
_DAY_US = 86_400_000_000


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (vectorized)."""
    y = y - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _valid_date(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(m, 0, 12)]
    month_days = month_days + ((m == 2) & leap)
    return (y >= 1) & (y <= 9999) & (m >= 1) & (m <= 12) & (d >= 1) & (d <= month_days)


def _time_of_day(parts: pa.StructArray) -> tuple[np.ndarray, np.ndarray]:
    """(micros since midnight, valid) of extracted h, mi, s, f groups."""
    h, mi, s = (_ints(parts.field(n)) for n in ("h", "mi", "s"))
    f = _ints(pc.utf8_rpad(parts.field("f"), width=6, padding="0"))
    return ((h * 60 + mi) * 60 + s) * 1_000_000 + f, (h < 24) & (mi < 60) & (s < 60)


def _date_parts(parts: pa.StructArray) -> tuple[np.ndarray, np.ndarray]:
    y, m, d = (_ints(parts.field(n)) for n in ("y", "mo", "d"))
    return _days_from_civil(y, m, d), _valid_date(y, m, d)


def _extract(tokens: pa.Array, pattern: str) -> tuple[pa.StructArray, np.ndarray]:
    """Named groups of ``pattern`` (filled with zeros where it does not match), and where it does."""
    ok = _matches(tokens, pattern)
    return pc.extract_regex(_where(ok, tokens, _FILLERS[pattern]), pattern), ok


_DATE_TOKEN = rf'^"{_DATE}"$'
_TIME_TOKEN = rf'^"{_TIME}"$'
_TS_TOKEN = rf'^"{_DATE}[T ]{_TIME}"$'
_TSTZ_TOKEN = rf'^"{_DATE}[T ]{_TIME}{_OFFSET}"$'
_FILLERS = {
    _DATE_TOKEN: '"2000-01-01"',
    _TIME_TOKEN: '"00:00:00"',
    _TS_TOKEN: '"2000-01-01T00:00:00"',
    _TSTZ_TOKEN: '"2000-01-01T00:00:00Z"',
}


def _numeric_patterns(precision: int, scale: int) -> tuple[str, str]:
    """(string token, integer token) patterns of NUMERIC(p,s) values a decimal cast reads exactly."""
    whole = precision - scale
    integer = "0" if whole == 0 else rf"(?:0|[1-9][0-9]{{0,{whole - 1}}})"
    fraction = rf"(?:\.[0-9]{{1,{scale}}})?" if scale else ""
    return rf'^"-?{integer}{fraction}"$', rf"^-?{integer}$"


def decode_tokens(data_type: DataType, tokens: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Non-null JSON value tokens of a column in their carrier type, and which were decoded
    exactly (where not, the value is arbitrary and the row goes to the reference decoder)."""
    kind = data_type.kind
    n = len(tokens)
    carrier = carrier_type(arrow_type(data_type))
    if kind is TypeKind.BOOLEAN:
        ok = _np(pc.is_in(tokens, pa.array(["true", "false"]))).astype(bool)
        return pc.equal(tokens, "true"), ok
    if kind in _INT_RANGES:
        ok = _matches(tokens, _INT_TOKEN)
        values = _np(_where(ok, tokens, "0").cast(pa.int64()))
        low, high = _INT_RANGES[kind]
        ok &= (values >= low) & (values <= high)
        return pa.array(np.where(ok, values, 0)).cast(carrier), ok
    if kind in (TypeKind.REAL, TypeKind.DOUBLE):
        ok = _matches(tokens, _FLOAT_TOKEN) & _np(pc.not_equal(tokens, "-0")).astype(bool)
        values = _np(_where(ok, tokens, "0").cast(pa.float64()))
        if kind is TypeKind.DOUBLE:
            return pa.array(values), ok & np.isfinite(values)
        with np.errstate(over="ignore"):
            single = values.astype(np.float32)  # round to nearest, as PostgreSQL's float4in
        ok &= np.isfinite(single) & ~((single == 0) & (values != 0))  # overflow, underflow: the reference says
        return pa.array(np.where(ok, single, np.float32(0))), ok
    if kind is TypeKind.NUMERIC and data_type.is_exact_decimal:
        assert data_type.precision is not None
        as_string, as_integer = _numeric_patterns(data_type.precision, data_type.scale or 0)
        ok = _matches(tokens, as_string) | _matches(tokens, as_integer)
        digits = pc.replace_substring(_where(ok, tokens, "0"), '"', "")
        return digits.cast(carrier), ok
    if kind in (TypeKind.TEXT, TypeKind.VARCHAR, TypeKind.CHAR):
        ok = _np(pc.starts_with(tokens, '"')).astype(bool)
        text = pc.utf8_slice_codeunits(_where(ok, tokens, '""'), 1, -1)
        if data_type.length is not None:
            ok &= _np(pc.utf8_length(text)) <= data_type.length
            if kind is TypeKind.CHAR:  # blank-padded to its length (a longer value: the reference decides)
                text = pc.utf8_rpad(text, width=data_type.length, padding=" ")
        return text, ok
    if kind is TypeKind.UUID:
        ok = _matches(tokens, _UUID_TOKEN)
        return _uuid_bytes(_where(ok, tokens, '"00000000-0000-0000-0000-000000000000"')), ok
    if kind is TypeKind.DATE:
        parts, ok = _extract(tokens, _DATE_TOKEN)
        days, valid = _date_parts(parts)
        ok &= valid
        return pa.array(np.where(ok, days, 0).astype(np.int32)), ok
    if kind is TypeKind.TIME:
        parts, ok = _extract(tokens, _TIME_TOKEN)
        micros, valid = _time_of_day(parts)
        ok &= valid
        return pa.array(np.where(ok, micros, 0)), ok
    if kind in (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
        pattern = _TS_TOKEN if kind is TypeKind.TIMESTAMP else _TSTZ_TOKEN
        parts, ok = _extract(tokens, pattern)
        days, valid_date = _date_parts(parts)
        micros, valid_time = _time_of_day(parts)
        ok &= valid_date & valid_time
        at = days * _DAY_US + micros
        if kind is TypeKind.TIMESTAMPTZ:
            oh, om = _ints(parts.field("oh")), _ints(parts.field("om"))
            sign = np.where(_np(pc.equal(parts.field("sign"), "-")).astype(bool), -1, 1)
            at = at - sign * (oh * 60 + om) * 60_000_000
            # offsets Python reads as written; years far from the ends (UTC conversion cannot overflow)
            year = _ints(parts.field("y"))
            ok &= (oh < 24) & (om < 60) & (year >= 2) & (year <= 9998)
        return pa.array(np.where(ok, at, 0)), ok
    return pa.nulls(n, carrier), np.zeros(n, bool)  # no fast path: the reference decodes


def _uuid_bytes(tokens: pa.Array) -> pa.Array:
    """``"8-4-4-4-12"`` hex tokens (38 characters each, quotes included) as 16-byte binary values."""
    n = len(tokens)
    if n == 0:
        return pa.array([], pa.binary())
    raw = tokens.cast(pa.binary())
    offsets = np.frombuffer(raw.buffers()[1], np.int32)[raw.offset : raw.offset + n + 1]
    data = np.frombuffer(raw.buffers()[2], np.uint8)[offsets[0] : offsets[n]]
    hexes = data.reshape(n, 38)[:, [i for i in range(1, 37) if i not in (9, 14, 19, 24)]]
    nibbles = np.where(hexes <= ord("9"), hexes - ord("0"), (hexes | 0x20) - ord("a") + 10).astype(np.uint8)
    packed = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, pa.py_buffer(packed.tobytes())])
    return fixed.cast(pa.binary())


def carrier_value(data_type: DataType, value: Any) -> pa.Array:
    """One Python-form value as a one-element array of its carrier type (for defaults)."""
    t = arrow_type(data_type)
    item = value if arrow_native(data_type) else to_arrow_value(data_type, value)
    return to_carrier(pa.array([item], t), t)


# --- rows ------------------------------------------------------------------------------------


def row_names(width: int) -> list[str]:
    """The decoded rows' columns: envelope, error, then each supercolumn's value and "set" flag."""
    return ["line", "t", "kind", "key", "error_class", "reason"] + [f"v{i}" for i in range(width)] + [
        f"s{i}" for i in range(width)
    ]


def decode_canonical(
    lines: pa.Array,
    texts: pa.Array,
    table_uuid: str,
    epoch_lines: Sequence[int],
    epochs: Sequence[Epoch],
    supercolumns: Sequence[Supercolumn],
) -> tuple[pa.RecordBatch | None, np.ndarray]:
    """The rows of a batch decoded as Arrow kernels, and the positions left to the reference decoder."""
    n = len(lines)
    everything = np.arange(n)
    try:
        text = texts.cast(pa.string())  # checks UTF-8; a batch with a bad line goes to the reference
    except pa.ArrowInvalid:
        return None, everything
    canonical = _flags(pc.match_substring_regex(text, LINE_RE))  # a DFA: no captures over the whole line
    if not canonical.any():
        return None, everything
    parts, has_values, cut = _envelopes(text, canonical)
    is_delete = _flags(pc.equal(parts.field("op"), "delete"))
    canonical &= _flags(pc.equal(parts.field("table"), table_uuid))
    canonical &= is_delete != has_values  # a delete carries no values, an insert or update does
    line_numbers = _np(lines).astype(np.int64)
    epoch_of = np.searchsorted(np.asarray(epoch_lines, np.int64), line_numbers, side="left") - 1
    fast: list[pa.RecordBatch] = []
    decoded = np.zeros(n, bool)
    found: dict[str, tuple[np.ndarray, pa.Array]] = {}  # per column uuid, over the whole batch
    names: np.ndarray | None = None  # how many keys each canonical body holds
    for e, epoch in enumerate(epochs):
        rows = np.nonzero(canonical & (epoch_of == e))[0]
        if not len(rows) or epoch.table is None:  # an unknown table: the reference says so
            continue
        index = pa.array(rows)
        missing = [c.column_uuid for c, _ in epoch.by_uuid.values() if c.column_uuid not in found]
        if missing or names is None:
            names, more = _find_all(cut, canonical, missing)
            found.update(more)
        whole = len(rows) == n  # every row of the batch (the usual case): no copies
        given = {u: (counts[rows], tokens if whole else pc.take(tokens, index))
                 for u, (counts, tokens) in found.items()}
        batch, ok = _decode_epoch(
            lines if whole else pc.take(lines, index), parts if whole else pc.take(parts, index), is_delete[rows],
            names[rows], epoch, supercolumns, given
        )
        if batch is not None:
            fast.append(batch)
        decoded[rows[ok]] = True
    if not fast:
        return None, np.nonzero(~decoded)[0]
    return _concat(fast), np.nonzero(~decoded)[0]


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0] if len(batches) > 1 else batches[0]


#: pieces of a canonical line cut at every '"' before its values' own: '{', 'op', ':', op, ',', 't',
#: ':<t>,', 'table_uuid', ':', table, ',', 'key', ':<key>,', 'values', then ':{' and the body's
VALUES_AT = 14


@dataclass(frozen=True)
class _Cut:
    """The canonical lines of a batch cut at every '"' (one list of pieces per canonical line) and,
    per line of the batch, the index of its list (-1: not canonical)."""

    pieces: pa.ListArray
    list_of: np.ndarray


def _envelopes(text: pa.Array, canonical: np.ndarray) -> tuple[pa.StructArray, np.ndarray, _Cut]:
    """(op, t, table, key) of the canonical lines (NULL elsewhere), which carry values, and the
    lines cut at every '"' (``_find_all`` reads the values from the same cut).

    ``LINE_RE`` has checked their shape, and no string of a canonical line holds a '"', so cutting
    at every '"' puts each field at a fixed place: '{', 'op', ':', op, ',', 't', ':<t>,',
    'table_uuid', ':', table, ',', 'key', ':<key>,' (or ':<key>}' for a delete), then 'values',
    ':{' and the pieces of the values' body, the last one ending in '}}'.
    """
    n = len(text)
    at = np.nonzero(canonical)[0]
    every = len(at) == n
    pieces = pc.split_pattern(text if every else pc.take(text, pa.array(at)), '"')
    starts = _np(pieces.offsets)
    with_values = (starts[1:] - starts[:-1]) > VALUES_AT
    fields = [pc.list_element(pieces, 3), pc.utf8_slice_codeunits(pc.list_element(pieces, 6), 1, -1),
              pc.list_element(pieces, 9), pc.utf8_slice_codeunits(pc.list_element(pieces, 12), 1, -1)]
    list_of = np.full(n, -1, np.int64)
    list_of[at] = np.arange(len(at))
    if not every:
        index = pa.array(list_of, mask=list_of < 0)
        fields = [pc.take(f, index) for f in fields]
    parts = pa.StructArray.from_arrays(fields, names=["op", "t", "table", "key"])
    has_values = np.zeros(n, bool)
    has_values[at] = with_values
    return parts, has_values, _Cut(pieces, list_of)


def _find_all(
    cut: _Cut, canonical: np.ndarray, uuids: Sequence[str]
) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, pa.Array]]]:
    """How many keys each canonical body holds, and per column uuid how often it names it and its
    value's JSON token (NULL unless named once), with no regular expression. In a
    canonical line no string holds a '"', so in its pieces cut at every '"' from ``VALUES_AT`` on
    (':{', then the body's) quoted text is at the odd places and the text between strings at the
    even ones; a quoted piece is a key exactly when the piece after it starts with ':' (after a
    string value comes ',' or the closing '}}'). A key's value is the string two pieces on (when
    the piece after the key is just ':'), else the literal in the piece after it, up to its comma
    (or the closing braces). Each column is then one comparison over the keys, whatever the
    table's width (an update names one column of many)."""
    n = len(canonical)
    offsets = _np(cut.pieces.offsets).astype(np.int64)
    sizes = offsets[1:] - offsets[:-1]
    rows = np.nonzero(canonical & (cut.list_of >= 0))[0]
    rows = rows[sizes[cut.list_of[rows]] > VALUES_AT + 1]  # a body of one pair at least
    lists = cut.list_of[rows]
    flat = cut.pieces.values
    first = offsets[lists] + VALUES_AT  # the ':{' piece: place 0 of the body's pieces
    lengths = sizes[lists] - VALUES_AT
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(rows)), lengths)
    position = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    at = np.repeat(first, lengths) + position  # each piece's place in ``flat``
    quoted = np.nonzero((position % 2 == 1) & (position < np.repeat(lengths, lengths) - 1))[0]
    after = pc.take(flat, pa.array(at[quoted] + 1))
    is_key = _flags(pc.starts_with(after, ":"))
    keys_at = quoted[is_key]
    after = after.filter(pa.array(is_key))
    # a key's piece is never a line's last: two pieces on is inside the flat pieces
    string = pc.take(flat, pa.array(np.minimum(at[keys_at] + 2, len(flat) - 1)))
    pair_values = pc.if_else(
        pc.equal(after, ":"),
        pc.binary_join_element_wise('"', string, '"', ""),
        pc.utf8_rtrim(pc.utf8_slice_codeunits(after, 1), characters=",}"),
    )
    pair_keys = pc.take(flat, pa.array(at[keys_at]))
    pair_rows = rows[owner[keys_at]]
    names = np.bincount(pair_rows, minlength=n).astype(np.int64)
    out = {}
    for uuid in uuids:
        named = _flags(pc.equal(pair_keys, uuid)) if _SAFE_KEY.match(uuid) else np.zeros(len(keys_at), bool)
        counts = np.bincount(pair_rows[named], minlength=n).astype(np.int64)
        pick = np.full(n, -1, np.int64)
        pick[pair_rows[named]] = np.nonzero(named)[0]
        pick[counts != 1] = -1
        out[uuid] = (counts, pc.take(pair_values, pa.array(pick, mask=pick < 0)))
    return names, out


def _decode_epoch(
    lines: pa.Array,
    parts: pa.StructArray,
    is_delete: np.ndarray,
    names: np.ndarray,
    epoch: Epoch,
    supercolumns: Sequence[Supercolumn],
    found: dict[str, tuple[np.ndarray, pa.Array]],
) -> tuple[pa.RecordBatch | None, np.ndarray]:
    """One epoch's canonical rows: (the rows decoded exactly, which of them those are)."""
    m = len(lines)
    is_insert = _flags(pc.equal(parts.field("op"), "insert"))
    ok = np.ones(m, bool)
    known = np.zeros(m, np.int64)  # values naming a column of the epoch
    width = len(supercolumns)
    values: list[pa.Array | None] = [None] * width
    sets: list[np.ndarray] = [np.zeros(m, bool) for _ in range(width)]
    for i in range(width):
        if i not in epoch.in_force:  # not in force at this event: NULL in its image
            sets[i] = ~is_delete
    for column, i in epoch.by_uuid.values():
        target = supercolumns[i].data_type
        count, tokens = found[column.column_uuid]
        ok &= count <= 1  # a duplicate key: the reference decides which value counts
        present = count == 1
        known += present
        is_null = present & _flags(pc.equal(tokens, "null"))
        if not column.is_nullable:
            ok &= ~is_null
        given = np.nonzero(present & ~is_null)[0]
        carrier = carrier_type(arrow_type(target))
        source = [pa.nulls(len(given), carrier)]
        if len(given):
            if arrow_type(column.data_type) == arrow_type(target):
                decoded, good = decode_tokens(column.data_type, pc.take(tokens, pa.array(given)))
                source = [decoded]
            else:  # a value converted to another supercolumn type: the reference converts
                good = np.zeros(len(given), bool)
            ok[given] &= good
        # per row: its decoded value, or the column's default on an insert that names no value
        pick = np.full(m, -1, np.int64)
        pick[given] = np.arange(len(given))
        default = epoch.defaults.get(i)
        if default is not None:
            pick[~present & is_insert] = len(given)
            source.append(carrier_value(target, default))
        source_array = pa.concat_arrays(source)
        values[i] = pc.take(source_array, pa.array(pick, mask=pick < 0))
        sets[i] = present | is_insert
        if not column.is_nullable:  # an insert must leave it set
            ok &= ~(is_insert & (pick < 0))
    ok &= known == names  # every value names a column of the epoch
    if not ok.any():
        return None, ok
    keep = pa.array(np.nonzero(ok)[0])
    arrays = [
        pc.take(lines, keep).cast(pa.int64()),
        pc.take(parts.field("t"), keep).cast(pa.int64()),
        pc.take(parts.field("op"), keep),
        pc.take(parts.field("key"), keep).cast(pa.int64()),
        pa.nulls(len(keep), pa.string()),
        pa.nulls(len(keep), pa.string()),
    ]
    for i, s in enumerate(supercolumns):
        carrier = carrier_type(arrow_type(s.data_type))
        arrays.append(pa.nulls(len(keep), carrier) if values[i] is None else pc.take(values[i], keep))
    arrays += [pa.array(flags[ok]) for flags in sets]
    return pa.RecordBatch.from_arrays(arrays, names=row_names(width)), ok
