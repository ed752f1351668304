"""Arrays as PostgreSQL has them: any T[] column holds rectangular arrays of any depth (up to 6).

The number of [] in a declared type is not binding: a 2-D value in an INTEGER[] column is
accepted, not a reason to quarantine its segment and stop the database's line.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from history_pipeline import HistoryStore
from history_pipeline.errors import SegmentQuarantinedError, ValueTypeError
from history_pipeline.types import decode_value, parse_data_type
from history_pipeline_tests.test_compaction import write


@pytest.mark.parametrize(
    ("type_text", "value", "expected"),
    [("INTEGER[]", [[1, 2], [3, None]], [[1, 2], [3, None]]), ("INTEGER[][]", [1, 2], [1, 2]),
     ("TEXT[]", [[["a"]], [["b"]]], [[["a"]], [["b"]]]), ("INTEGER[]", [[[[[[1]]]]]], [[[[[[1]]]]]]),
     ("NUMERIC(4,1)[]", [["1.5"], [None]], [[Decimal("1.5")], [None]]), ("INTEGER[]", [], [])],
)
def test_rectangular_arrays_of_any_depth_are_values(type_text, value, expected):
    assert decode_value(parse_data_type(type_text), value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [([[1, 2], [3]], "matching dimensions"), ([[1, 2], None], "mixed"), ([1, [2]], "mixed"),
     ([[], []], "matching dimensions"), ([[[[[[[1]]]]]]], "7 dimensions exceed the maximum of 6"),
     ([[1, "x"]], "integer")],
)
def test_what_postgresql_refuses_is_a_typed_error(value, fragment):
    with pytest.raises(ValueTypeError, match=fragment):
        decode_value(parse_data_type("INTEGER[]"), value)


def _events(value):
    column = {"column_uuid": "a", "column_name": "a", "data_type": "INTEGER[]"}
    return [
        {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": [column]},
        {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"a": [[1, 2], [3, 4]]}},
        {"op": "insert", "t": 3, "table_uuid": "T", "key": 2, "values": {"a": value}},
    ]


def test_a_two_dimensional_value_in_an_integer_array_column_comes_back_equal(tmp_path, spark):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, _events([5]))
    store.compact(spark=spark)  # the same tasks on Spark executors
    assert store.load_table("t", 4).to_pylist() == [{"synthetic_key": 1, "a": [[1, 2], [3, 4]]},
                                                    {"synthetic_key": 2, "a": [5]}]
    assert store.fetch_row("t", 1, 3) == {"a": [[1, 2], [3, 4]]}
    assert [v["values"] for v in store.row_history("t", 1)] == [{"a": [[1, 2], [3, 4]]}]
    # depths differ by row: SQL sees JSON, and the result reads back as the arrays
    assert store.sql("SELECT a FROM t ORDER BY synthetic_key", 4).to_pylist() == [{"a": [[1, 2], [3, 4]]},
                                                                                  {"a": [5]}]
    assert store.sql("SELECT a->0->1 AS x FROM t WHERE synthetic_key = 1", 4).to_pylist() == [{"x": 2}]
    # one depth in every row (as of 3): a DuckDB list, indexed as in PostgreSQL
    assert store.sql("SELECT a[2][1] AS x FROM t", 3).to_pylist() == [{"x": 3}]


def test_a_ragged_array_quarantines_its_segment_naming_the_line(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, _events([[1], [2, 3]]))
    with pytest.raises(SegmentQuarantinedError, match="line 4.*matching dimensions"):
        store.compact(spark=False)
