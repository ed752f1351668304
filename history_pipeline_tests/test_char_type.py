"""CHAR(n) (PostgreSQL's bpchar) as a type of the contract: values blank-padded to n as PostgreSQL
stores and prints them, a longer value an error unless the excess is blanks, casts to TEXT and
VARCHAR stripping the padding, and SQL comparing, grouping and measuring a value without it."""

from __future__ import annotations

import pytest

from history_pipeline import HistoryStore
from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.errors import DataTypeError, ValueTypeError
from history_pipeline.types import DataType, TypeKind, decode_value, encode_value, parse_data_type


def test_char_types_parse_as_postgresql_names_them():
    assert parse_data_type("CHAR(4)") == DataType(TypeKind.CHAR, length=4)
    assert parse_data_type("character(4)") == "CHAR(4)"
    assert parse_data_type("CHAR") == "CHAR(1)"  # as in PostgreSQL: CHAR alone is CHAR(1)
    assert parse_data_type("character") == "CHAR(1)"
    assert str(parse_data_type("bpchar")) == "BPCHAR"  # bpchar without a length: no padding
    assert str(parse_data_type("char(3)[]")) == "CHAR(3)[]"
    assert parse_data_type("character varying(3)") == "VARCHAR(3)"  # not CHAR
    assert parse_data_type("char varying(3)") == "VARCHAR(3)"
    for bad in ("CHAR(0)", "CHAR(2,1)", "CHAR(10485761)"):
        with pytest.raises(DataTypeError):
            parse_data_type(bad)


def test_values_are_blank_padded_and_too_long_ones_refused_unless_the_excess_is_blanks():
    c4 = parse_data_type("CHAR(4)")
    assert decode_value(c4, "ab") == "ab  "
    assert decode_value(c4, "") == "    "
    assert decode_value(c4, " a") == " a  "
    assert decode_value(c4, "abcd") == "abcd"
    assert decode_value(c4, "abcd   ") == "abcd"  # PostgreSQL cuts blanks past the length
    assert decode_value(parse_data_type("CHAR"), "x") == "x"
    assert decode_value(parse_data_type("BPCHAR"), "ab  ") == "ab  "
    assert encode_value(c4, "ab  ") == "ab  "
    for bad in ("abcde", "abcd  x", 5, "a\x00"):
        with pytest.raises(ValueTypeError, match="CHAR"):
            decode_value(c4, bad)


CASTS = [
    # source, target, value, PostgreSQL's answer (SELECT CAST(value::source AS target))
    ("CHAR(4)", "TEXT", "ab  ", "ab"),
    ("CHAR(4)", "VARCHAR(10)", "ab  ", "ab"),
    ("CHAR(4)", "VARCHAR(2)", "ab  ", "ab"),
    ("CHAR(4)", "TEXT", "    ", ""),
    ("CHAR(4)", "TEXT", " a b", " a b"),  # leading and inner blanks stay
    ("CHAR(4)", "CHAR(6)", "ab  ", "ab    "),
    ("CHAR(4)", "CHAR(2)", "ab  ", "ab"),
    ("CHAR(4)", "CHAR(1)", "abcd", "a"),  # an explicit cast truncates
    ("TEXT", "CHAR(4)", "ab", "ab  "),
    ("TEXT", "CHAR(4)", "abcdef", "abcd"),
    ("TEXT", "CHAR(4)", "ab\t", "ab\t "),  # only blanks are padding
    ("VARCHAR(3)", "CHAR(5)", "xyz", "xyz  "),
    ("INTEGER", "CHAR(5)", 42, "42   "),
    ("BOOLEAN", "CHAR(5)", True, "true "),
    ("CHAR(5)", "INTEGER", " 42  ", 42),
    ("CHAR(4)", "CHAR(4)[]", None, None),
    ("CHAR(2)[]", "TEXT[]", ["a ", None], ["a", None]),
    ("TEXT[]", "CHAR(2)[]", ["a", "bcd"], ["a ", "bc"]),
]


@pytest.mark.parametrize(("source", "target", "value", "expected"), CASTS)
def test_casts_follow_postgresql(source, target, value, expected):
    if source.endswith("[]") != target.endswith("[]"):
        assert cast_value(value, parse_data_type(source), parse_data_type(target)) is None
        return
    assert cast_value(value, parse_data_type(source), parse_data_type(target)) == expected


def test_a_char_value_that_is_no_integer_is_a_cast_failure():
    with pytest.raises(CastFailure):
        cast_value("ab  ", parse_data_type("CHAR(4)"), parse_data_type("INTEGER"))


def _char_store(root, spark=False) -> HistoryStore:
    """A table with a CHAR(4) column, rows written before and after its change to TEXT (t 10) and of
    another column to CHAR(6) (t 20)."""
    store = HistoryStore.open(root, database="chars")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "codes",
                    "columns": [{"column_uuid": "c", "column_name": "code", "data_type": "CHAR(4)"},
                                {"column_uuid": "v", "column_name": "label", "data_type": "VARCHAR(3)"}]})
        rows = {1: ("ab", "x"), 2: ("abcd", "yz"), 3: ("a", None), 4: ("", "w"), 5: (" a", "a b")}
        for key, (code, label) in rows.items():
            wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": key, "values": {"c": code, "v": label}})
        wal.append({"op": "close", "t": 2})
        wal.append({"op": "update", "t": 5, "table_uuid": "T", "key": 3, "values": {"c": "a   "}})
        wal.append({"op": "close", "t": 5})
        wal.append({"op": "change_column_type", "t": 10, "table_uuid": "T", "column_uuid": "c", "data_type": "TEXT"})
        wal.append({"op": "insert", "t": 11, "table_uuid": "T", "key": 6, "values": {"c": "new  ", "v": "q"}})
        wal.append({"op": "close", "t": 11})
        wal.append({"op": "change_column_type", "t": 20, "table_uuid": "T", "column_uuid": "v",
                    "data_type": "CHAR(6)"})
        wal.append({"op": "close", "t": 20})
        wal.seal()
    store.compact(spark=spark)
    return store


BEFORE = {1: ("ab  ", "x"), 2: ("abcd", "yz"), 3: ("a   ", None), 4: ("    ", "w"), 5: (" a  ", "a b")}
#: after ALTER ... TYPE text the padding is gone (PostgreSQL's bpchar -> text), after TYPE char(6) it is there
AFTER = {1: ("ab", "x     "), 2: ("abcd", "yz    "), 3: ("a", None), 4: ("", "w     "), 5: (" a", "a b   "),
         6: ("new  ", "q     ")}


def _rows(store: HistoryStore, as_of: int) -> dict[int, tuple]:
    return {r["synthetic_key"]: (r["code"], r["label"])
            for r in store.load_table("codes", as_of=as_of).to_pylist()}


@pytest.mark.parametrize("engine", [False, pytest.param("spark", marks=pytest.mark.spark)])
def test_a_change_from_char_to_text_strips_the_padding_on_both_engines(tmp_path, request, engine):
    spark = request.getfixturevalue("spark") if engine == "spark" else False
    store = _char_store(tmp_path, spark)
    assert _rows(store, 9) == BEFORE
    assert _rows(store, 21) == AFTER
    assert store.fetch_row("codes", 1, as_of=9) == {"code": "ab  ", "label": "x"}
    assert store.fetch_row("codes", 1, as_of=21) == {"code": "ab", "label": "x     "}
    assert [v["values"]["code"] for v in store.row_history("codes", 3)] == ["a   ", "a   "]


def test_sql_compares_groups_and_measures_char_values_without_their_padding(tmp_path):
    store = _char_store(tmp_path)
    # as of 9 the column is CHAR(4): PostgreSQL ignores trailing blanks in =, <, GROUP BY, length and ||
    found = store.sql("SELECT synthetic_key AS k FROM codes WHERE code = 'ab' ORDER BY k", as_of=9).to_pylist()
    assert found == [{"k": 1}]
    assert store.sql("SELECT count(*) AS n FROM codes WHERE code IN ('a', 'abcd')", as_of=9).to_pylist() == [{"n": 2}]
    measured = store.sql("SELECT length(code) AS n, code || '|' AS shown FROM codes WHERE synthetic_key = 5",
                         as_of=9).to_pylist()
    assert measured == [{"n": 2, "shown": " a|"}]
    ordered = store.sql("SELECT code FROM codes ORDER BY code", as_of=9).column("code").to_pylist()
    assert ordered == ["", " a", "a", "ab", "abcd"]
    # a CHAR value equals a TEXT value only without its padding, as bpchar -> text does
    joined = store.sql("SELECT count(*) AS n FROM codes c JOIN (VALUES ('ab'), ('ab  ')) v(t) ON c.code = v.t",
                       as_of=9).to_pylist()
    assert joined == [{"n": 1}]
    # as of 21 label is CHAR(6): the same rules, its stored value padded
    assert store.sql("SELECT synthetic_key AS k FROM codes WHERE label = 'yz'", as_of=21).to_pylist() == [{"k": 2}]


def test_a_table_with_array_columns_shows_char_values_in_sql_as_any_other(tmp_path):
    """Tables with array columns are exposed to SQL from their reconstruction: CHAR values lose their
    padding there too."""
    store = HistoryStore.open(tmp_path, database="arrays")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "tagged",
                    "columns": [{"column_uuid": "c", "column_name": "code", "data_type": "CHAR(5)"},
                                {"column_uuid": "a", "column_name": "tags", "data_type": "CHAR(3)[]"}]})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"c": "ab", "a": ["x", None]}})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 2, "values": {"c": "abc", "a": []}})
        wal.append({"op": "close", "t": 2})
        wal.seal()
    store.compact(spark=False)
    assert store.load_table("tagged", as_of=3, ordered=True).to_pylist() == [
        {"synthetic_key": 1, "code": "ab   ", "tags": ["x  ", None]},
        {"synthetic_key": 2, "code": "abc  ", "tags": []},
    ]
    found = store.sql("SELECT synthetic_key AS k, length(code) AS n FROM tagged WHERE code = 'ab'", as_of=3)
    assert found.to_pylist() == [{"k": 1, "n": 2}]
