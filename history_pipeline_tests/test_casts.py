"""CAST with PostgreSQL's rules, used when a column changes type (values as PostgreSQL 15 prints them)."""

import datetime as dt
from decimal import Decimal

import pytest

from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.types import Interval, parse_data_type

CASES = [
    ("DOUBLE PRECISION", "TEXT", 1e15, "1e+15"),
    ("DOUBLE PRECISION", "TEXT", 0.1, "0.1"),
    ("DOUBLE PRECISION", "TEXT", 1.5e-5, "1.5e-05"),
    ("DOUBLE PRECISION", "TEXT", 123456.0, "123456"),
    ("REAL", "TEXT", 1e6, "1e+06"),
    ("DOUBLE PRECISION", "INTEGER", 2.5, 2),  # rint: half to even
    ("DOUBLE PRECISION", "INTEGER", 3.5, 4),
    ("NUMERIC(6,2)", "INTEGER", Decimal("2.50"), 3),  # numeric rounds half away from zero
    ("NUMERIC(6,2)", "INTEGER", Decimal("-2.50"), -3),
    ("DOUBLE PRECISION", "NUMERIC", 1.0000000000000002, Decimal("1")),  # 15 significant digits
    ("INTEGER", "NUMERIC(5,1)", 42, Decimal("42.0")),
    ("TEXT", "INTEGER", " 17 ", 17),
    ("TEXT", "BOOLEAN", "yes", True),
    ("TEXT", "DATE", "2024-02-29", dt.date(2024, 2, 29)),
    ("BOOLEAN", "TEXT", False, "false"),
    ("TIME", "TEXT", dt.time(12, 30, 0, 500000), "12:30:00.5"),
    ("TIMESTAMP", "TEXT", dt.datetime(2024, 1, 2, 3, 4, 5, 123400), "2024-01-02 03:04:05.1234"),
    ("TIMESTAMPTZ", "TEXT", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "2024-01-02 03:04:05+00"),
    ("TIMESTAMP", "DATE", dt.datetime(2024, 1, 2, 3, 4, 5), dt.date(2024, 1, 2)),
    ("INTERVAL", "TEXT", Interval(14, 3, 3723000500), "1 year 2 mons 3 days 01:02:03.0005"),
    ("INTERVAL", "TEXT", Interval(-14, -1, 0), "-1 years -2 mons -1 days"),
    ("JSONB", "TEXT", {"bb": 1, "a": [1, {"ccc": 2, "d": 3}]}, '{"a": [1, {"d": 3, "ccc": 2}], "bb": 1}'),
    ("BYTEA", "TEXT", b"\x00\xff", "\\x00ff"),
    ("INTEGER[]", "TEXT[]", [1, None], ["1", None]),
    ("INTEGER", "BIGINT", 7, 7),
    ("TEXT", "VARCHAR(2)", "abc", "ab"),  # an explicit cast truncates
    ("REAL", "DOUBLE PRECISION", 0.1, 0.10000000149011612),  # the float32 itself, not its shortest text
    ("INTERVAL", "TEXT", Interval(0, -1, 3600000000), "-1 days +01:00:00"),
    ("TEXT[]", "TEXT", ["a b", "", None, "NULL", 'q"'], '{"a b","",NULL,"NULL","q\\""}'),
    ("TEXT", "BYTEA", " a\\\\b\\101 ", b" a\\bA "),
    ("TEXT", "BOOLEAN", "tr", True),
    ("NUMERIC", "TEXT", Decimal("-0.00"), "0.00"),
]


@pytest.mark.parametrize("source, target, value, expected", CASES)
def test_casts_follow_postgresql(source, target, value, expected):
    assert cast_value(value, parse_data_type(source), parse_data_type(target)) == expected


@pytest.mark.parametrize(
    "source, target, value",
    [
        ("TEXT", "INTEGER", "12.5"),
        ("TEXT", "INTEGER", "abc"),
        ("TEXT", "INTEGER", "\u0661\u0662"),  # Arabic-Indic digits: Python's int() reads them
        ("NUMERIC", "INTEGER", Decimal("123456789012345678901234567890.5")),
        ("BIGINT", "SMALLINT", 40000),
        ("DOUBLE PRECISION", "INTEGER", float("nan")),
        ("TEXT", "BOOLEAN", "maybe"),
        ("DATE", "BOOLEAN", dt.date(2024, 1, 1)),
    ],
)
def test_impossible_casts_fail(source, target, value):
    with pytest.raises(CastFailure):
        cast_value(value, parse_data_type(source), parse_data_type(target))
