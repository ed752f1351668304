"""``change_column_type`` with ``values_follow``: the rows existing at the change are not cast (a
database computed their new values by an expression, which the writer sends as updates right
after); until then they read NULL in the column, on both compaction engines."""

from __future__ import annotations

import pytest

from history_pipeline import HistoryStore
from history_pipeline.errors import MalformedRecordError
from history_pipeline.events import ChangeColumnType, event_to_record, parse_line


def test_the_field_round_trips_and_is_optional():
    line = ('{"op":"change_column_type","t":5,"table_uuid":"T","column_uuid":"c","data_type":"INTEGER",'
            '"values_follow":true}')
    event = parse_line(line)
    assert isinstance(event, ChangeColumnType) and event.values_follow
    assert event_to_record(event)["values_follow"] is True
    plain = parse_line('{"op":"change_column_type","t":5,"table_uuid":"T","column_uuid":"c","data_type":"INTEGER"}')
    assert not plain.values_follow and "values_follow" not in event_to_record(plain)
    with pytest.raises(MalformedRecordError, match="values_follow"):
        parse_line(line.replace("true", '"yes"'))


@pytest.mark.parametrize("engine", [False, pytest.param("spark", marks=pytest.mark.spark)])
def test_rows_read_null_until_their_values_follow(tmp_path, request, engine):
    spark = request.getfixturevalue("spark") if engine == "spark" else False
    store = HistoryStore.open(tmp_path, database="follow")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "u",
                    "columns": [{"column_uuid": "c", "column_name": "code", "data_type": "TEXT"}]})
        for key, code in ((1, "a7"), (2, "b9"), (3, None)):
            wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": key, "values": {"c": code}})
        wal.append({"op": "close", "t": 2})
        # ALTER ... TYPE integer USING substr(code, 2)::integer: no CAST of 'a7' gives 7
        wal.append({"op": "change_column_type", "t": 8, "table_uuid": "T", "column_uuid": "c",
                    "data_type": "INTEGER", "values_follow": True})
        for key, code in ((1, 7), (2, 9), (3, None)):
            wal.append({"op": "update", "t": 9, "table_uuid": "T", "key": key, "values": {"c": code}})
        wal.append({"op": "close", "t": 9})
        wal.seal()
    store.compact(spark=spark)

    def codes(as_of):
        return {r["synthetic_key"]: r["code"] for r in store.load_table("u", as_of=as_of).to_pylist()}

    assert codes(8) == {1: "a7", 2: "b9", 3: None}
    assert codes(9) == {1: None, 2: None, 3: None}
    assert codes(10) == {1: 7, 2: 9, 3: None}
