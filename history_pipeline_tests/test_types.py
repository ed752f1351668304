"""Every SQL type of the contract: parsing, validation of WAL values, and exact round trips."""

import datetime as dt
import json
import math
import uuid
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline.errors import DataTypeError, ValueTypeError
from history_pipeline.types import (
    INTERVAL_ARROW,
    Interval,
    TypeKind,
    arrow_type,
    decode_value,
    encode_value,
    from_arrow_value,
    interval_storage,
    interval_values,
    parse_data_type,
    to_arrow_value,
)

ROUND_TRIPS = [
    ("BOOLEAN", [True, False]),
    ("SMALLINT", [-32768, 32767, 0]),
    ("INTEGER", [-(2**31), 2**31 - 1]),
    ("BIGINT", [-(2**63), 2**63 - 1]),
    ("REAL", [1.5, 0.1, "NaN", "Infinity", "-Infinity", 3.4e38]),
    ("DOUBLE PRECISION", [0.1, 1e308, -5e-324, "NaN", "Infinity", "-Infinity"]),
    ("NUMERIC", ["12.3400", "123456789012345678901234567890123456789", "-0.000000000000000000001"]),
    ("NUMERIC(10,2)", ["12.34", "-99999999.99", "0.00"]),
    ("NUMERIC(39,0)", ["123456789012345678901234567890123456789"]),
    ("TEXT", ["", "héllo wörld ✓ 𝄞", "line\nbreak"]),
    ("VARCHAR(5)", ["abcde", "✓✓✓✓✓"]),
    ("BYTEA", ["AAEC/w==", ""]),
    ("UUID", ["0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"]),
    ("DATE", ["2024-02-29", "0001-01-01", "9999-12-31"]),
    ("TIME", ["00:00:00", "23:59:59.999999", "12:30:00.5"]),
    ("TIMESTAMP", ["2024-01-02T03:04:05", "2024-01-02T03:04:05.123456"]),
    ("TIMESTAMPTZ", ["2024-01-02T03:04:05+05:30", "2024-01-02T03:04:05.000001Z", "1999-12-31T23:00:00-08:00"]),
    ("INTERVAL", [{"months": 14, "days": -3, "micros": 123456789}]),
    ("JSONB", [{"a": [1, 2, {"b": None}], "ü": "x"}, [1, "two"], "text", 3, True]),
    ("INTEGER[]", [[1, None, 3], []]),
    ("TEXT[][]", [[["a", "b"], ["c", None]], []]),
    ("NUMERIC(6,3)[]", [["1.500", None]]),
]


@pytest.mark.parametrize("type_text, values", ROUND_TRIPS)
def test_values_round_trip_through_parquet(tmp_path, type_text, values):
    data_type = parse_data_type(type_text)
    python_values = [decode_value(data_type, v) for v in values]
    arrow = pa.array([to_arrow_value(data_type, v) for v in python_values], type=arrow_type(data_type))
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"c": arrow}), path)
    back = [from_arrow_value(data_type, v) for v in pq.read_table(path).column("c").to_pylist()]
    for original, python_value, read in zip(values, python_values, back, strict=True):
        if isinstance(python_value, float) and math.isnan(python_value):
            assert math.isnan(read)
            continue
        assert read == python_value
        assert encode_value(data_type, read) == _normal_wal(type_text, original, data_type)


def _normal_wal(type_text, original, data_type):
    """What encode_value returns for a value: the WAL form, normalized where the type normalizes."""
    value = decode_value(data_type, original)
    return encode_value(data_type, value)


def test_decoded_values_have_natural_python_types():
    assert decode_value(parse_data_type("NUMERIC"), "12.3400") == Decimal("12.3400")
    assert str(decode_value(parse_data_type("NUMERIC"), "12.3400")) == "12.3400"
    ts = decode_value(parse_data_type("TIMESTAMPTZ"), "2024-01-02T03:04:05+05:30")
    assert ts == dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=dt.UTC)
    assert decode_value(parse_data_type("UUID"), "0B4F6F36-5D1E-4C47-9B8A-2F0F3D6E9A01") == uuid.UUID(
        "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"
    )
    assert decode_value(parse_data_type("BYTEA"), "AAEC/w==") == b"\x00\x01\x02\xff"
    assert decode_value(parse_data_type("INTERVAL"), {"months": 1, "days": 2, "micros": 3}) == Interval(1, 2, 3)
    assert decode_value(parse_data_type("REAL"), 0.1) == 0.1  # shortest float32 reading
    assert decode_value(parse_data_type("NUMERIC(5,2)"), "1.005") == Decimal("1.01")  # rounds like PG


@pytest.mark.parametrize(
    "type_text, value, fragment",
    [
        ("SMALLINT", 32768, "out of range"),
        ("SMALLINT", -32769, "out of range"),
        ("INTEGER", 2**31, "out of range"),
        ("BIGINT", 2**63, "out of range"),
        ("INTEGER", 1.5, "integer"),
        ("INTEGER", True, "integer"),
        ("BOOLEAN", 1, "true or false"),
        ("DATE", "2023-02-30", "DATE"),
        ("DATE", "20230101", "YYYY-MM-DD"),
        ("TIME", "25:00:00", "TIME"),
        ("TIMESTAMP", "2024-01-01T00:00:00+01:00", "without an offset"),
        ("TIMESTAMPTZ", "2024-01-01T00:00:00", "with an offset"),
        ("BYTEA", "not base64!", "base64"),
        ("UUID", "not-a-uuid", "not a UUID"),
        ("NUMERIC", "12.3.4", "not a decimal"),
        ("NUMERIC", 1.5, "decimal string"),
        ("NUMERIC(4,2)", "123.4", "needs more than 4 digits"),
        ("VARCHAR(3)", "abcd", "longer than 3"),
        ("REAL", 1e39, "out of range"),
        ("DOUBLE PRECISION", "nan", "NaN"),
        ("INTERVAL", {"months": 1}, "months"),
        ("INTEGER[]", 5, "JSON array"),
        ("INTEGER[]", [1, "x"], "integer"),
        ("TEXT", 5, "string"),
    ],
)
def test_invalid_values_are_typed_errors(type_text, value, fragment):
    with pytest.raises(ValueTypeError, match=fragment):
        decode_value(parse_data_type(type_text), value)


def test_type_strings_parse_and_render_canonically():
    assert str(parse_data_type("numeric(10, 2)")) == "NUMERIC(10,2)"
    assert str(parse_data_type("varchar(20)")) == "VARCHAR(20)"
    assert str(parse_data_type("int")) == "INTEGER"
    assert str(parse_data_type("double precision")) == "DOUBLE PRECISION"
    assert str(parse_data_type("timestamp with time zone")) == "TIMESTAMPTZ"
    nested = parse_data_type("INTEGER[][]")
    assert nested.kind is TypeKind.ARRAY and nested.element.kind is TypeKind.ARRAY
    for bad in ["", "BLOB", "NUMERIC(2,5)", "INTEGER(3)", "VARCHAR(0)"]:
        with pytest.raises(DataTypeError):
            parse_data_type(bad)


def test_data_types_compare_equal_to_their_spellings():
    assert parse_data_type("int") == "INTEGER" == parse_data_type("INT4")
    assert parse_data_type("NUMERIC(10,2)") == "numeric(10, 2)"
    assert parse_data_type("TEXT[]") != "TEXT"
    assert parse_data_type("TEXT") != "BLOB"
    assert len({parse_data_type("int"), parse_data_type("INTEGER")}) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3.4028234663852886e38, 3.4028235e38),  # FLT_MAX: its shortest reading rounds past it when packed
        (3.4028235e38, 3.4028235e38),  # FLT_MAX as PostgreSQL prints it goes back in
        (-3.4028235e38, -3.4028235e38),
        (1e-40, 1e-40),  # a subnormal float32, accepted as by PostgreSQL's float4in
    ],
)
def test_real_at_the_float32_limits_is_read_as_postgresql_reads_it(value, expected):
    assert decode_value(parse_data_type("REAL"), value) == expected


@pytest.mark.parametrize("value", [3.4028236e38, 1e39, -1e39, 1e-50])
def test_real_out_of_float32_range_is_a_typed_error(value):
    with pytest.raises(ValueTypeError, match="out of range for REAL"):
        decode_value(parse_data_type("REAL"), value)


@pytest.mark.parametrize("type_text", ["TEXT", "VARCHAR(5)", "JSONB"])
def test_a_lone_surrogate_is_a_typed_error_not_a_crash(type_text):
    lone = json.loads('"a\\ud800"')
    with pytest.raises(ValueTypeError, match="lone surrogate"):
        decode_value(parse_data_type(type_text), lone if type_text != "JSONB" else {"k": [lone]})
    with pytest.raises(ValueTypeError, match="lone surrogate"):
        decode_value(parse_data_type(type_text + "[]"), [lone])


def test_intervals_become_month_day_nano_values_and_back_without_a_python_loop():
    """The stored struct (months, days, micros) and Arrow's month_day_nano values, both ways, with
    NULLs, negative parts, a slice (an offset into the buffers) and several chunks; held to the
    value-by-value conversion as reference."""
    stored = pa.array([{"months": 1, "days": 2, "micros": 3}, None,
                       {"months": -14, "days": -3, "micros": -86_400_000_001}, {"months": 0, "days": 0, "micros": 0},
                       {"months": 2**31 - 1, "days": -(2**31), "micros": 2**53}], INTERVAL_ARROW)
    reference = pa.array([None if v is None else pa.MonthDayNano([v["months"], v["days"], v["micros"] * 1000])
                          for v in stored.to_pylist()], pa.month_day_nano_interval())
    assert interval_values(stored).equals(reference)
    assert interval_storage(reference).equals(stored)
    sliced = stored.slice(1, 3)
    assert interval_values(sliced).equals(reference.slice(1, 3))
    assert interval_storage(reference.slice(1, 3)).equals(sliced)
    chunked = pa.chunked_array([stored.slice(0, 2), stored.slice(2)])
    assert interval_values(chunked).equals(pa.chunked_array([reference.slice(0, 2), reference.slice(2)]))
    assert interval_storage(interval_values(chunked)).equals(chunked)
