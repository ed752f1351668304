"""The event model: every record type parses, writes back identically, and bad records are typed errors."""

import json

import pytest

from history_pipeline.errors import MalformedRecordError
from history_pipeline.events import (
    AddColumn,
    ChangeColumnType,
    Close,
    CreateTable,
    Insert,
    event_to_line,
    event_to_record,
    parse_event,
    parse_line,
)

COLUMN = {"column_uuid": "c1", "column_name": "a", "data_type": "INTEGER", "is_nullable": True}

RECORDS = [
    {"op": "create_table", "t": 1, "table_uuid": "t1", "table_name": "x",
     "columns": [COLUMN, {"column_uuid": "c2", "column_name": "b", "data_type": "TEXT[]",
                          "is_nullable": False, "ordinal_key": "m"}]},
    {"op": "drop_table", "t": 2, "table_uuid": "t1"},
    {"op": "rename_table", "t": 3, "table_uuid": "t1", "new_name": "y"},
    {"op": "add_column", "t": 4, "table_uuid": "t1", "column": COLUMN},
    {"op": "add_column", "t": 4, "table_uuid": "t1", "column": COLUMN, "default": 7},
    {"op": "drop_column", "t": 5, "table_uuid": "t1", "column_uuid": "c1"},
    {"op": "rename_column", "t": 6, "table_uuid": "t1", "column_uuid": "c1", "new_name": "z"},
    {"op": "change_column_type", "t": 7, "table_uuid": "t1", "column_uuid": "c1", "data_type": "NUMERIC(12,3)"},
    {"op": "change_column_nullable", "t": 8, "table_uuid": "t1", "column_uuid": "c1", "is_nullable": False},
    {"op": "reorder_column", "t": 9, "table_uuid": "t1", "column_uuid": "c1", "ordinal_key": "aa"},
    {"op": "insert", "t": 10, "table_uuid": "t1", "key": -(2**63), "values": {"c1": 1, "c2": ["ü"]}},
    {"op": "update", "t": 10, "table_uuid": "t1", "key": 2**63 - 1, "values": {"c1": None}},
    {"op": "delete", "t": 11, "table_uuid": "t1", "key": 5},
    {"op": "close", "t": 11},
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["op"])
def test_every_record_round_trips(record):
    event = parse_event(record)
    assert event_to_record(event) == record
    assert parse_line(event_to_line(event)) == event


def test_parsed_events_are_typed_and_immutable():
    event = parse_event(RECORDS[0])
    assert isinstance(event, CreateTable)
    assert [c.column_name for c in event.columns] == ["a", "b"]
    with pytest.raises(AttributeError):
        event.t = 5  # type: ignore[misc]
    insert = parse_event(RECORDS[10])
    assert isinstance(insert, Insert)
    with pytest.raises(TypeError):
        insert.values["c1"] = 2  # type: ignore[index]
    assert isinstance(parse_event(RECORDS[4]), AddColumn)
    assert str(parse_event(RECORDS[7]).data_type) == "NUMERIC(12,3)"
    assert isinstance(parse_event(RECORDS[7]), ChangeColumnType)
    assert parse_event({"op": "close", "t": 3}) == Close(3)


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"t": 1}, "missing field 'op'"),
        ({"op": "explode", "t": 1}, "unknown op"),
        ({"op": "insert", "t": -1, "table_uuid": "t", "key": 1, "values": {}}, "field 't'"),
        ({"op": "insert", "t": 1.5, "table_uuid": "t", "key": 1, "values": {}}, "field 't'"),
        ({"op": "insert", "t": 1, "key": 1, "values": {}}, "missing field 'table_uuid'"),
        ({"op": "insert", "t": 1, "table_uuid": "t", "key": 2**63, "values": {}}, "64-bit"),
        ({"op": "insert", "t": 1, "table_uuid": "t", "key": "1", "values": {}}, "64-bit"),
        ({"op": "insert", "t": 1, "table_uuid": "t", "key": 1, "values": [1]}, "values"),
        ({"op": "insert", "t": 1, "table_uuid": "t", "key": 1, "values": {}, "extra": 1}, "unknown field"),
        ({"op": "create_table", "t": 1, "table_uuid": "t", "table_name": "x",
          "columns": [{**COLUMN, "data_type": "BLOB"}]}, "unknown data type"),
        ({"op": "create_table", "t": 1, "table_uuid": "t", "table_name": "x", "columns": [COLUMN, COLUMN]},
         "duplicate column"),
        ({"op": "add_column", "t": 1, "table_uuid": "t", "column": COLUMN, "default": "x"}, "default"),
        ({"op": "change_column_nullable", "t": 1, "table_uuid": "t", "column_uuid": "c", "is_nullable": 1},
         "true or false"),
    ],
)
def test_malformed_records_name_segment_line_and_problem(record, fragment):
    with pytest.raises(MalformedRecordError, match=fragment) as info:
        parse_event(record, segment="00000000000000000007", line=12)
    assert "segment 00000000000000000007, line 12" in str(info.value)
    assert info.value.segment == "00000000000000000007" and info.value.line == 12


def test_bad_json_lines_are_typed_errors():
    with pytest.raises(MalformedRecordError, match="not valid JSON"):
        parse_line(b'{"op": "close", "t": ', segment="s", line=3)
    with pytest.raises(MalformedRecordError, match="NaN is not JSON"):
        parse_line(b'{"op": "close", "t": NaN}', segment="s", line=3)
    assert json.loads(event_to_line(parse_event(RECORDS[10])))["values"]["c2"] == ["ü"]
