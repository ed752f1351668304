"""The pure parts of PostgreSQL capture, without a server: LSN parsing, pgoutput message decoding,
PostgreSQL text values -> WAL values, and decoded transactions -> WAL records with timestamps."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest

from history_pipeline.capture.model import (
    CaptureError,
    CaptureOptions,
    CaptureState,
    ColumnState,
    TableState,
    Transaction,
    schema_changes,
    split_transactions,
    transaction_events,
)
from history_pipeline.capture.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DeleteMessage,
    InsertMessage,
    ProtocolError,
    Relation,
    RelationColumn,
    TruncateMessage,
    UpdateMessage,
    decode_message,
)
from history_pipeline.capture.values import (
    CaptureValueError,
    UnsupportedTypeError,
    contract_type,
    convert,
    parse_array,
    wal_value,
)
from history_pipeline.errors import HistoryError
from history_pipeline.events import parse_event
from history_pipeline.lsn import format_lsn, parse_lsn, to_timestamp
from history_pipeline.types import decode_value, parse_data_type

# --- LSNs ---------------------------------------------------------------------------


def test_lsn_round_trips_and_orders_like_postgresql():
    assert parse_lsn("0/16B3748") == 0x16B3748
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")
    assert to_timestamp("0/10") == 16 and to_timestamp(" 42 ") == 42 and to_timestamp(7) == 7
    for bad in ("16", "0/", "x/1", "1/2/3", "123456789/0"):
        with pytest.raises(HistoryError):
            parse_lsn(bad)
    with pytest.raises(HistoryError, match="X/Y"):
        to_timestamp("yesterday")


def test_store_and_cli_take_lsns():
    from history_pipeline.cli import build_parser

    args = build_parser().parse_args(["load", "t", "--as-of", "0/1A"])
    assert args.as_of == 26
    args = build_parser().parse_args(["diff", "t", "--from", "0/1", "--to", "5"])
    assert (args.from_, args.to) == (1, 5)
    assert build_parser().parse_args(["retain", "1/0"]).purge_before == 2**32
    with pytest.raises(SystemExit):
        build_parser().parse_args(["load", "t", "--as-of", "soon"])


# --- pgoutput ---------------------------------------------------------------------------


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(*values) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            raw = v.encode()
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def test_pgoutput_messages_decode():
    assert decode_message(b"B" + struct.pack("!QqI", 100, 5, 77)) == Begin(100, 5, 77)
    assert decode_message(b"C" + struct.pack("!BQQq", 0, 200, 232, 9)) == Commit(200, 232, 9)
    relation = (b"R" + struct.pack("!I", 16384) + _s("public") + _s("t") + b"d" + struct.pack("!h", 2)
                + b"\x01" + _s("id") + struct.pack("!Ii", 20, -1) + b"\x00" + _s("name") + struct.pack("!Ii", 25, -1))
    assert decode_message(relation) == Relation(
        16384, "public", "t", "d", (RelationColumn("id", 20, -1, True), RelationColumn("name", 25, -1, False))
    )
    assert decode_message(b"I" + struct.pack("!I", 1) + b"N" + _tuple("1", None)) == InsertMessage(1, ("1", None))
    update = decode_message(b"U" + struct.pack("!I", 1) + b"K" + _tuple("1", None) + b"N" + _tuple("2", UNCHANGED))
    assert update == UpdateMessage(1, ("1", None), ("2", UNCHANGED))
    assert decode_message(b"U" + struct.pack("!I", 1) + b"N" + _tuple("é")) == UpdateMessage(1, None, ("é",))
    assert decode_message(b"D" + struct.pack("!I", 1) + b"K" + _tuple("3")) == DeleteMessage(1, ("3",))
    assert decode_message(b"T" + struct.pack("!IBII", 2, 0, 5, 6)) == TruncateMessage((5, 6))
    with pytest.raises(ProtocolError):
        decode_message(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t\x00\x00")
    with pytest.raises(ProtocolError, match="unknown"):
        decode_message(b"Z")


# --- values -----------------------------------------------------------------------------

# (type oid, typmod, PostgreSQL text output with the capture's session settings, WAL value)
CASES = [
    (16, -1, "t", True),
    (21, -1, "-32768", -32768),
    (23, -1, "2147483647", 2147483647),
    (20, -1, "-9223372036854775808", -(2**63)),
    (700, -1, "3.4e+38", 3.4e38),
    (701, -1, "-Infinity", "-Infinity"),
    (701, -1, "NaN", "NaN"),
    (1700, (10 << 16 | 2) + 4, "-12.50", "-12.50"),
    (1700, -1, "123456789012345678901234567890.000000001", "123456789012345678901234567890.000000001"),
    (25, -1, 'a "b" \\ ✓', 'a "b" \\ ✓'),
    (1043, 5 + 4, "abcde", "abcde"),
    (17, -1, "\\x00ff10", "AP8Q"),
    (2950, -1, "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01", "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"),
    (1082, -1, "2024-02-29", "2024-02-29"),
    (1083, -1, "23:59:59.999999", "23:59:59.999999"),
    (1114, -1, "2024-01-02 03:04:05.123456", "2024-01-02T03:04:05.123456"),
    (1184, -1, "2024-01-01 21:34:05.5+00", "2024-01-01T21:34:05.5+00:00"),
    (1186, -1, "P1Y2M-3DT4H5M6.789S", {"months": 14, "days": -3, "micros": 14_706_789_000}),
    (1186, -1, "PT-1.5S", {"months": 0, "days": 0, "micros": -1_500_000}),
    (1186, -1, "PT0S", {"months": 0, "days": 0, "micros": 0}),
    (3802, -1, '{"a": [1, null, 2.5]}', {"a": [1, None, 2.5]}),
    (114, -1, '{"z":1}', {"z": 1}),
    (1007, -1, "{1,NULL,3}", [1, None, 3]),
    (1009, -1, '{"a,b","c\\"d",NULL,"NULL"}', ["a,b", 'c"d', None, "NULL"]),
    (1001, -1, '{"\\\\x01"}', ["AQ=="]),
    (1231, (6 << 16 | 2) + 4, "{1.50,-2.00}", ["1.50", "-2.00"]),
    (1185, -1, '{"2000-01-01 00:00:00+00"}', ["2000-01-01T00:00:00+00:00"]),
    (1007, -1, "[0:1]={7,8}", [7, 8]),
    (1007, -1, "{}", []),
]


@pytest.mark.parametrize(("oid", "typmod", "text", "expected"), CASES)
def test_every_contract_type_maps_to_its_wal_value(oid, typmod, text, expected):
    data_type = contract_type(oid, typmod)
    value = wal_value(data_type, text)
    assert value == expected
    decode_value(parse_data_type(data_type), value)  # a valid WAL value of its type
    assert wal_value(data_type, None) is None


def test_type_modifiers_and_unsupported_types():
    assert contract_type(1700, (12 << 16 | 3) + 4) == "NUMERIC(12,3)"
    assert contract_type(1043, 24) == "VARCHAR(20)"
    assert contract_type(1042, 88) == "CHAR(84)"  # bpchar, as pgbench's filler columns
    assert contract_type(1042, -1) == "BPCHAR"  # an expression's bpchar: no length
    assert contract_type(1014, 7) == "CHAR(3)[]"
    assert wal_value("CHAR(4)", "ab  ") == "ab  "  # its text output is padded: kept as it is
    assert wal_value("CHAR(3)[]", '{"a  ",bcd}') == ["a  ", "bcd"]
    assert contract_type(1231, (6 << 16 | 2) + 4) == "NUMERIC(6,2)[]"
    with pytest.raises(UnsupportedTypeError, match="table 't' column 'p'.*--text-fallback"):
        contract_type(600, -1, where="table 't' column 'p'")  # point
    with pytest.raises(UnsupportedTypeError):
        contract_type(1017, -1)  # point[]
    assert contract_type(600, -1, text_fallback=True) == "TEXT"
    assert contract_type(1017, -1, text_fallback=True) == "TEXT"


@pytest.mark.parametrize(("data_type", "text"), [
    ("NUMERIC", "NaN"), ("DATE", "infinity"), ("TIMESTAMP", "2024-01-01 00:00:00 BC"),
    ("TIMESTAMPTZ", "infinity"), ("BYTEA", "abc"),
])
def test_values_without_a_wal_form_are_clear_errors(data_type, text):
    pattern = f"table 't' column 'c': value .* of type {data_type.replace('[', '.')}"
    with pytest.raises(CaptureValueError, match=pattern):
        convert(data_type, text, where="table 't' column 'c'")


def test_array_literals_parse():
    assert parse_array('{{1,2},{NULL,"x y"}}') == [["1", "2"], [None, "x y"]]
    # a T[] column holds arrays of any depth, in PostgreSQL and in the contract
    assert wal_value("INTEGER[]", "{{1,2},{3,NULL}}") == [[1, 2], [3, None]]
    assert parse_array('{"\\\\"}') == ["\\"]


# --- transactions -> WAL records ---------------------------------------------------------

DDL = Relation(9000, "history_capture", "ddl_log", "d", (
    RelationColumn("id", 20, -1, True), RelationColumn("relid", 26, -1, False),
    RelationColumn("dropped", 16, -1, False), RelationColumn("description", 3802, -1, False),
))
T = Relation(100, "public", "t", "d", (RelationColumn("id", 23, -1, True), RelationColumn("name", 25, -1, False)))


def _describe(name="t", columns=(("id", 23, "C1", True, 1), ("name", 25, "C2", False, 2)), **extra):
    return json.dumps({
        "schema": "public", "name": name, "table_uuid": "T1", "key": [1],
        "columns": [{"attnum": n, "name": c, "type_oid": oid, "typmod": -1, "not_null": nn, "column_uuid": u,
                     "has_default": False, "missing": None} for c, oid, u, nn, n in columns],
        **extra,
    })


def _ddl(description=None, dropped=False):
    return InsertMessage(9000, ("1", "100", "t" if dropped else "f", description))


def _txn(commit, *messages, end=None):
    end = end or commit + 40
    return Transaction(commit, end, (Begin(commit, 0, 1), *messages, Commit(commit, end, 0)))


def _run(*transactions, state=None, options=None, live_keys=None):
    state = state or CaptureState()
    out = []
    relations = {}
    for txn in transactions:
        decoded = transaction_events(state, txn, relations, options or CaptureOptions(), live_keys)
        state, relations = decoded.state, decoded.relations
        out.extend(decoded.records)
    for record in out:
        parse_event(record)  # every record is valid WAL
    return state, out


def test_rows_share_the_commit_lsn_and_a_close_follows():
    state, records = _run(
        _txn(1000, DDL, _ddl(_describe())),
        _txn(2000, T, InsertMessage(100, ("1", "a")), InsertMessage(100, ("2", None)),
             UpdateMessage(100, None, ("1", UNCHANGED)), DeleteMessage(100, ("2", None))),
    )
    assert [(r["op"], r["t"]) for r in records] == [
        ("create_table", 1000), ("close", 1000),
        ("insert", 2000), ("insert", 2000), ("update", 2000), ("delete", 2000), ("close", 2000),
    ]
    assert records[2]["values"] == {"C1": 1, "C2": "a"} and records[2]["key"] == 1
    assert records[4]["values"] == {"C1": 1}  # the unchanged TOASTed value is left out
    assert state.last_t == 2000 and state.last_end_lsn == 2040
    assert CaptureState.from_json(state.to_json()) == state


def test_schema_changes_take_consecutive_timestamps_ending_at_the_commit():
    state, _ = _run(_txn(1000, DDL, _ddl(_describe())))
    renamed = _describe(columns=(("id", 23, "C1", True, 1), ("label", 25, "C2", False, 2)))
    _, records = _run(
        _txn(5000, T, InsertMessage(100, ("1", "a")), DDL, _ddl(renamed),
             Relation(100, "public", "t", "d", (T.columns[0], RelationColumn("label", 25, -1, False))),
             InsertMessage(100, ("2", "b")), InsertMessage(100, ("3", "c"))),
        state=state,
    )
    assert [(r["op"], r["t"]) for r in records] == [
        ("insert", 4998), ("rename_column", 4999), ("insert", 5000), ("insert", 5000), ("close", 5000),
    ]
    with pytest.raises(CaptureError, match="no room"):
        _run(_txn(1001, T, InsertMessage(100, ("1", "a")), DDL, _ddl(renamed)), state=state)


def test_schema_diffs():
    key, a, b = ColumnState(1, "C1", "id", "INTEGER", True), ColumnState(2, "C2", "a", "TEXT", False), None
    b = ColumnState(3, "C3", "b", "DATE", False)
    before = TableState(1, "T1", "t", (key, a), (1,))
    after = TableState(1, "T1", "u", (ColumnState(1, "C1", "id", "BIGINT", True), b), (1,))
    raw = {"columns": [{"attnum": 3, "missing": "2024-01-01", "has_default": True}], "has_rows": True}
    assert [r["op"] for r in schema_changes(before, after, raw)] == [
        "rename_table", "drop_column", "change_column_type", "add_column"
    ]
    assert schema_changes(before, after, raw)[-1]["default"] == "2024-01-01"
    assert schema_changes(before, None) == [{"op": "drop_table", "table_uuid": "T1"}]
    volatile = {"columns": [{"attnum": 3, "missing": None, "has_default": True}], "has_rows": True}
    with pytest.raises(CaptureError, match="volatile default"):
        schema_changes(before, after, volatile)


def test_key_changes_unknown_tables_truncate_and_keyless_tables():
    state, _ = _run(_txn(1000, DDL, _ddl(_describe())))
    _, records = _run(_txn(2000, T, UpdateMessage(100, ("1", None), ("9", "x"))), state=state)
    assert [(r["op"], r["key"]) for r in records[:-1]] == [("delete", 1), ("insert", 9)]
    # a table not described yet (it existed before capture): its rows come with its snapshot
    _, records = _run(_txn(2000, T, InsertMessage(100, ("1", "a"))))
    assert records == [{"op": "close", "t": 2000}]
    with pytest.raises(CaptureError, match="TRUNCATE"):
        _run(_txn(2000, TruncateMessage((100,))), state=state)
    keyless, _ = _run(_txn(1000, DDL, _ddl(_describe(key=None))))
    with pytest.raises(CaptureError, match="--key t=COLUMN"):
        _run(_txn(2000, T, InsertMessage(100, ("1", "a"))), state=keyless)
    _, records = _run(_txn(2000, T, InsertMessage(100, ("1", "a"))), state=keyless,
                      options=CaptureOptions(keys={"t": "id"}))
    assert records[0]["key"] == 1
    _, records = _run(_txn(3000, DDL, _ddl(dropped=True)), state=state)
    assert records[0] == {"op": "drop_table", "table_uuid": "T1", "t": 3000}


def test_truncate_deletes_every_key_live_at_that_point():
    """The history's live keys before the transaction, changed by the transaction's own earlier rows,
    become deletes where the TRUNCATE is; rows inserted after it live on. A keyless table's TRUNCATE is
    an error naming the way out."""
    state, _ = _run(_txn(1000, DDL, _ddl(_describe())))
    asked = []

    def live_keys(table_uuid, up_to):
        asked.append((table_uuid, up_to))
        return [1, 2, 3]

    _, records = _run(_txn(2000, T, InsertMessage(100, ("4", "d")), DeleteMessage(100, ("2", None)),
                           TruncateMessage((100, 555)), InsertMessage(100, ("1", "again"))),
                      state=state, live_keys=live_keys)
    assert asked == [("T1", 1000)]
    assert [(r["op"], r["key"]) for r in records[:-1]] == [
        ("insert", 4), ("delete", 2), ("delete", 1), ("delete", 3), ("delete", 4), ("insert", 1)]
    assert {r["t"] for r in records} == {2000}
    keyless, _ = _run(_txn(1000, DDL, _ddl(_describe(key=None))))
    with pytest.raises(CaptureError, match="TRUNCATE of 't' cannot be captured: the table has no key"):
        _run(_txn(2000, TruncateMessage((100,))), state=keyless, live_keys=live_keys)
    _, records = _run(_txn(2000, TruncateMessage((100,))), state=keyless, live_keys=live_keys,
                      options=CaptureOptions(keys={"t": "id"}))
    assert [(r["op"], r["key"]) for r in records[:-1]] == [("delete", 1), ("delete", 2), ("delete", 3)]


def test_a_snapshot_describes_the_table_then_inserts_its_rows():
    snap = Relation(9001, "history_capture", "snapshot_rows", "d", (
        RelationColumn("id", 20, -1, True), RelationColumn("relid", 26, -1, False),
        RelationColumn("vals", 1009, -1, False),
    ))
    _, records = _run(_txn(1000, DDL, _ddl(_describe(snapshot=True)), snap,
                           InsertMessage(9001, ("1", "100", '{7,"x, y"}')),
                           InsertMessage(9001, ("2", "100", "{8,NULL}")),
                           InsertMessage(9001, ("3", "555", "{1}"))))
    assert [(r["op"], r["t"], r.get("key"), r.get("values")) for r in records] == [
        ("create_table", 999, None, None),
        ("insert", 1000, 7, {"C1": 7, "C2": "x, y"}),
        ("insert", 1000, 8, {"C1": 8, "C2": None}),
        ("close", 1000, None, None),
    ]
    excluded, records = _run(_txn(1000, DDL, _ddl(_describe())), options=CaptureOptions(exclude=("t",)))
    assert excluded.tables == {} and records == [{"op": "close", "t": 1000}]


def test_split_transactions_keeps_the_unfinished_tail():
    messages = [Begin(1, 0, 1), T, Commit(1, 9, 0), Begin(20, 0, 2)]
    done, rest = split_transactions(messages)
    assert [t.commit_lsn for t in done] == [1] and rest == [Begin(20, 0, 2)]


def test_the_progress_line_counts_row_and_schema_changes_not_wal_records():
    from history_pipeline.capture.postgres import CaptureProgress

    progress = CaptureProgress().counting(
        [{"op": "create_table"}, {"op": "insert"}, {"op": "insert"}, {"op": "close"}]
    ).counting([{"op": "update"}, {"op": "delete"}, {"op": "rename_column"}, {"op": "close"}])
    progress = progress.counting([{"op": "close"}])  # a transaction of no change: the capture's heartbeat
    assert (progress.transactions, progress.inserts, progress.updates, progress.deletes) == (2, 2, 1, 1)
    assert progress.schema_changes == 2
    line = replace(progress, batches=1, last_t=300, lag_bytes=0, lag_seconds=0.25).line()
    assert line == ("captured 2 transactions (2 inserts, 1 update, 1 delete, 2 schema changes) in 1 batch;"
                    " last commit 0/12C; lag 0 bytes, 0.2 s")
    assert "\n" not in line


def _literal(items) -> str:
    """A PostgreSQL array literal as PostgreSQL prints it: every element quoted where it must be."""
    def element(item):
        if isinstance(item, list):
            return _literal(item)
        if item is None:
            return "NULL"
        if item == "" or item.upper() == "NULL" or any(c in item for c in ' ,{}"\\\t\n'):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return item
    return "{" + ",".join(element(i) for i in items) + "}"


TRICKY = ["plain", "", "NULL", "null", "a b", " lead", "x,y", "{b}", 'q"q', "back\\slash", "\\", '"', "é✓", "1.5",
          "tab\there", "line\nbreak", "}", None]


def test_array_literals_as_postgresql_prints_them_parse_back():
    """One- and two-dimensional literals of awkward strings (as the snapshot carries rows) parse back to
    their elements; malformed literals are errors, not wrong values."""
    assert parse_array(_literal(TRICKY)) == TRICKY
    rows = [TRICKY[i:] + TRICKY[:i] for i in range(len(TRICKY))]
    assert parse_array(_literal(rows)) == rows
    assert parse_array(_literal([[["1", None]], [["2", "3"]]])) == [[["1", None]], [["2", "3"]]]
    for bad in ("{a}x", "{a b", '{"a"b}', "{{a},{b}", "{a,{b}}"):
        with pytest.raises((ValueError, IndexError)):
            parse_array(bad)


def test_a_snapshot_message_carries_many_rows():
    """The snapshot sends about 1 MB of rows per message as a two-dimensional array; a one-dimensional
    array is a single row, and a row of the wrong width is an error naming the table."""
    snap = Relation(9001, "history_capture", "snapshot_rows", "d", (
        RelationColumn("id", 20, -1, True), RelationColumn("relid", 26, -1, False),
        RelationColumn("vals", 1009, -1, False),
    ))
    many = _literal([["7", "x, y"], ["8", None], ["9", "{z}"]])
    _, records = _run(_txn(1000, DDL, _ddl(_describe(snapshot=True)), snap, InsertMessage(9001, ("1", "100", many)),
                           InsertMessage(9001, ("2", "100", _literal(["10", "{{w}}"])))))
    assert [(r["op"], r.get("key"), r.get("values")) for r in records[1:-1]] == [
        ("insert", 7, {"C1": 7, "C2": "x, y"}), ("insert", 8, {"C1": 8, "C2": None}),
        ("insert", 9, {"C1": 9, "C2": "{z}"}), ("insert", 10, {"C1": 10, "C2": "{{w}}"}),
    ]
    with pytest.raises(CaptureError, match="'t': a snapshot row has 3 values, not 2"):
        _run(_txn(1000, DDL, _ddl(_describe(snapshot=True)), snap,
                  InsertMessage(9001, ("1", "100", _literal([["7", "a"], ["8", "b", "c"]])))))


def test_malformed_pgoutput_tuples_are_protocol_errors():
    insert = b"I" + struct.pack("!I", 1) + b"N" + _tuple("12", None, UNCHANGED, "é")
    assert decode_message(insert) == InsertMessage(1, ("12", None, UNCHANGED, "é"))
    for bad in (insert[:-1], insert[:6], insert[:8], insert + b"x", insert[:6] + struct.pack("!h", 1) + b"q"):
        with pytest.raises(ProtocolError):
            decode_message(bad)


def test_row_values_are_converted_per_column_and_errors_name_the_column():
    """Each column's value goes through its own type's converter (worked out once per relation); a
    value without a WAL form names its table and column; a relation whose width differs from its rows
    is an error, not a shifted row."""
    typed = _describe(columns=(("id", 23, "C1", True, 1), ("day", 1082, "C2", False, 2)))
    state, _ = _run(_txn(1000, DDL, _ddl(typed)))
    days = Relation(100, "public", "t", "d", (T.columns[0], RelationColumn("day", 1082, -1, False)))
    _, records = _run(_txn(2000, days, InsertMessage(100, ("1", "2024-02-29")), InsertMessage(100, ("2", None))),
                      state=state)
    assert [r["values"] for r in records[:-1]] == [{"C1": 1, "C2": "2024-02-29"}, {"C1": 2, "C2": None}]
    with pytest.raises(CaptureValueError, match="table 't' column 'day': value 'infinity' of type DATE"):
        _run(_txn(2000, days, InsertMessage(100, ("1", "infinity"))), state=state)
    with pytest.raises(CaptureError, match="3 values for 2 columns"):
        _run(_txn(2000, days, InsertMessage(100, ("1", "2024-02-29", "x"))), state=state)
