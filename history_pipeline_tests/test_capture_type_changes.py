"""Every ALTER COLUMN ... TYPE PostgreSQL runs without USING (its assignment casts) between the
contract's types, against a real PostgreSQL 15: the captured history must answer, before and
after the change, what PostgreSQL's own table holds. The pairs share one table and one ALTER
TABLE, so one server and one capture check them all."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid

import pytest

from history_pipeline import HistoryStore
from history_pipeline.capture.postgres import CaptureConfig, current_lsn, run_capture
from history_pipeline_tests.pg_support import postgres_server

pytestmark = pytest.mark.postgres

#: (source type, target type, values as SQL literals): each pair is one column of the table
PAIRS = [
    ("smallint", "integer", ["-32768", "7"]),
    ("integer", "bigint", ["2147483647", "-1"]),
    ("bigint", "integer", ["-2147483648", "42"]),
    ("integer", "smallint", ["32767", "-5"]),
    ("integer", "numeric", ["-2147483648", "0"]),
    ("integer", "numeric(12,2)", ["123456", "-7"]),
    ("bigint", "numeric", ["9223372036854775807", "-1"]),
    ("integer", "real", ["16777217", "-3"]),
    ("integer", "double precision", ["2147483647", "5"]),
    ("bigint", "double precision", ["9007199254740993", "-9223372036854775808"]),
    ("bigint", "real", ["922337203685477580", "1"]),
    ("numeric(10,2)", "numeric(12,4)", ["12345678.91", "-0.5"]),
    ("numeric(12,4)", "numeric(10,2)", ["1.0050", "-2.0050", "0.0049"]),
    ("numeric", "numeric(8,3)", ["12345.12345", "-0.0005", "0.0004"]),
    ("numeric(10,2)", "integer", ["2.50", "-2.50", "3.49"]),
    ("numeric", "bigint", ["922337203685477580.5", "-0.5"]),
    ("numeric", "double precision", ["0.1", "123456789012345678901234567890.123", "-1e-300"]),
    ("numeric", "real", ["0.1", "3.4e38", "16777217"]),
    ("double precision", "real", ["0.1", "1e-40", "16777217"]),
    ("real", "double precision", ["0.1", "3.4e38", "-1.5"]),
    ("double precision", "numeric", ["0.1", "1.0000000000000002", "1e20", "-2.5e-7"]),
    ("real", "numeric", ["0.1", "16777217", "1e-7"]),
    ("double precision", "integer", ["2.5", "3.5", "-2.5", "1e9"]),
    ("double precision", "bigint", ["1e18", "-0.5"]),
    ("real", "smallint", ["1.5", "-32768"]),
    ("varchar(10)", "text", ["'abc'", "'  x  '"]),
    ("text", "varchar(20)", ["'abc'", "'ünïcödé ✓'"]),
    ("varchar(5)", "varchar(10)", ["'abcde'", "''"]),
    ("varchar(8)", "varchar(4)", ["'ab'", "'abcd    '"]),  # blanks past the length are cut
    ("char(5)", "text", ["'ab'", "''", "' a b'"]),
    ("char(5)", "varchar(10)", ["'ab'", "'abcde'"]),
    ("char(5)", "varchar(3)", ["'ab'", "'abc'"]),
    ("char(5)", "char(8)", ["'ab'", "'abcde'"]),
    ("char(6)", "char(3)", ["'ab'", "'abc'"]),
    ("text", "char(10)", ["'ab'", "'x y '"]),
    ("varchar(4)", "char(6)", ["'abcd'", "''"]),
    ("char", "text", ["'a'", "' '"]),
    ("timestamp", "timestamptz", ["'2024-01-02 03:04:05.123456'", "'1999-12-31 23:59:59'"]),
    ("timestamptz", "timestamp", ["'2024-01-02 03:04:05.5+05:30'", "'2000-01-01 00:00+00'"]),
    ("date", "timestamp", ["'2024-02-29'", "'0001-01-01'"]),
    ("date", "timestamptz", ["'2024-02-29'", "'1970-01-01'"]),
    ("timestamp", "date", ["'2024-01-02 23:59:59'", "'1999-12-31 00:00:00'"]),
    ("timestamptz", "date", ["'2024-01-02 23:30+00'", "'2024-01-02 23:30-05'"]),
    ("timestamp", "time", ["'2024-01-02 03:04:05.25'", "'2000-01-01 00:00'"]),
    ("timestamptz", "time", ["'2024-01-02 03:04:05-02'", "'2000-01-01 00:00+00'"]),
    ("interval", "time", ["'1 day 25:00:01'", "'-1 hour'", "'3 months 00:00:00.5'"]),
    ("boolean", "text", ["true", "false"]),
    ("boolean", "varchar(5)", ["true", "false"]),
    ("boolean", "char(5)", ["true", "false"]),
    ("integer", "text", ["-2147483648", "0"]),
    ("bigint", "varchar(20)", ["9223372036854775807", "-1"]),
    ("numeric(10,3)", "text", ["-0.500", "12"]),
    ("numeric", "text", ["0.00001", "-0", "1e20"]),
    ("real", "text", ["0.1", "1e20", "-1.5e-7", "'NaN'", "'-Infinity'"]),
    ("double precision", "text", ["0.1", "1e15", "123456.0", "'Infinity'", "5e-324"]),
    ("date", "text", ["'2024-02-29'", "'0001-01-01'"]),
    ("time", "text", ["'12:30:00.5'", "'00:00'"]),
    ("timestamp", "text", ["'2024-01-02 03:04:05.1234'", "'1900-03-01 00:00'"]),
    ("timestamptz", "text", ["'2024-01-02 03:04:05+05:30'", "'2000-01-01 00:00:00.5+00'"]),
    ("interval", "text", ["'1 year 2 months 3 days 04:05:06.5'", "'-1 days +01:00'", "'0'"]),
    ("uuid", "text", ["'0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01'"]),
    ("bytea", "text", ["'\\x00ff10'", "''"]),
    ("jsonb", "text", ["""'{"bb": 1, "a": [1, {"ccc": 2, "d": 3}]}'""", "'1e20'", "'\"x\"'"]),
    ("json", "jsonb", ["""'{"b": 1,  "a": [1, 2]}'""", """'{"a": 1, "a": 2}'""", "'[]'"]),
    ("integer[]", "bigint[]", ["'{1,NULL,3}'", "'{{1,2},{3,4}}'"]),
    ("integer[]", "text", ["'{1,NULL,3}'", "'{}'"]),
    ("text[]", "text", ["""'{"a b","",NULL,"q\\"x"}'"""]),
    ("char(3)[]", "text[]", ["'{a,\"b c\"}'"]),
    ("varchar(3)[]", "text[]", ["'{ab,NULL}'"]),
    ("numeric(6,2)[]", "numeric(8,3)[]", ["'{1.5,-2.25}'"]),
]


@pytest.fixture(scope="module")
def pg():
    with postgres_server("wal_level=logical", "max_replication_slots=4", "max_wal_senders=4") as server:
        yield server


def _rows(conn) -> dict[int, dict]:
    cur = conn.execute("SELECT * FROM pairs ORDER BY id")
    names = [d.name for d in cur.description]
    return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def _same(a, b) -> bool:
    if isinstance(b, dt.timedelta) and hasattr(a, "months"):  # psycopg folds a year into 365 days, a month 30
        days = a.months // 12 * 365 + a.months % 12 * 30 + a.days
        return dt.timedelta(days=days, microseconds=a.nanoseconds // 1000) == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _differences(store: HistoryStore, lsn: int, expected: dict[int, dict]) -> dict[str, list]:
    got = {r["id"]: r for r in store.load_table("pairs", as_of=lsn).to_pylist()}
    assert sorted(got) == sorted(expected)
    out: dict[str, list] = {}
    for key, row in expected.items():
        for column, value in row.items():
            if column in ("id",) or _same(got[key][column], value):
                continue
            out.setdefault(column, []).append((key, got[key][column], value))
    return out


def test_every_assignment_cast_between_contract_types_is_captured_as_postgresql_answers(tmp_path, pg):
    name = f"pairs_{uuid.uuid4().hex[:8]}"
    admin = pg.connect()
    admin.execute(f"CREATE DATABASE {name}")
    conn = pg.connect(name)
    try:
        store = HistoryStore.open(tmp_path, database="pairs")
        config = CaptureConfig(dsn=pg.dsn(name), slot="pairs")
        run_capture(store, config, once=True)
        columns = ", ".join(f"c{i} {source}" for i, (source, _, _) in enumerate(PAIRS))
        conn.execute(f"CREATE TABLE pairs (id int PRIMARY KEY, {columns})")
        rows = max(len(values) for _, _, values in PAIRS) + 1  # the last row: NULL everywhere
        for key in range(rows):
            literals = [values[key] if key < len(values) else "NULL" for _, _, values in PAIRS]
            conn.execute(f"INSERT INTO pairs VALUES ({key}, {', '.join(literals)})")
        before_lsn, before = current_lsn(conn), _rows(conn)
        conn.execute("ALTER TABLE pairs " + ", ".join(f"ALTER COLUMN c{i} TYPE {target}"
                                                     for i, (_, target, _) in enumerate(PAIRS)))
        after_lsn, after = current_lsn(conn), _rows(conn)
        run_capture(store, config, once=True)
        store.compact(spark=False)
        assert _differences(store, before_lsn, before) == {}
        differences = _differences(store, after_lsn, after)
        named = {f"{PAIRS[int(c[1:])][0]} -> {PAIRS[int(c[1:])][1]}": d for c, d in differences.items()}
        assert named == {}
    finally:
        conn.close()
        admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                      (name,))
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        admin.close()


def test_type_changes_that_cast_cannot_compute_are_captured_from_the_rows_they_leave(tmp_path, pg):
    """USING expressions, a session time zone other than UTC, a json column's text and a change made
    inside a DO block: the capture writes the rows as the change left them, right after it."""
    name = f"inexact_{uuid.uuid4().hex[:8]}"
    admin = pg.connect()
    admin.execute(f"CREATE DATABASE {name}")
    conn = pg.connect(name)
    try:
        store = HistoryStore.open(tmp_path, database="inexact")
        config = CaptureConfig(dsn=pg.dsn(name), slot="inexact")
        run_capture(store, config, once=True)
        conn.execute("CREATE TABLE u (id int PRIMARY KEY, price int, code text, doc json, at timestamp, "
                     "seen timestamptz, plain integer, ratio double precision, small integer)")
        conn.execute("""INSERT INTO u VALUES
            (1, 250, 'a7', '{"b": 1,  "a": [1, 2]}', '2024-07-01 12:00', '2024-01-01 23:30+00', 1,
             0.1::float8 + 0.2::float8, 5),
            (2, NULL, 'b9', '[1,  2]', '2024-01-01 00:00', '2024-07-01 00:30+00', 2, 1e-7, NULL)""")
        states = [(current_lsn(conn), _table(conn, "u"))]
        steps = [
            "ALTER TABLE u ALTER COLUMN price TYPE numeric(10,2) USING price / 100.0",
            "ALTER TABLE u ALTER COLUMN code TYPE integer USING substr(code, 2)::integer",
            "ALTER TABLE u ALTER COLUMN doc TYPE text",
            ["SET TimeZone = 'America/New_York'", "ALTER TABLE u ALTER COLUMN at TYPE timestamptz",
             "ALTER TABLE u ALTER COLUMN seen TYPE date",
             "ALTER TABLE u ALTER COLUMN small TYPE bigint",  # the time zone does not matter: a cast
             "RESET TimeZone"],
            ["SET extra_float_digits = 0", "ALTER TABLE u ALTER COLUMN ratio TYPE text",  # 0.3, not 0.30000000000000004
             "RESET extra_float_digits"],
            "DO $$ BEGIN EXECUTE 'ALTER TABLE u ALTER COLUMN plain TYPE bigint USING plain * 10'; END $$",
            "UPDATE u SET price = 3.5 WHERE id = 2",
        ]
        for step in steps:
            for statement in [step] if isinstance(step, str) else step:  # each statement on its own
                conn.execute(statement)
            states.append((current_lsn(conn), _table(conn, "u")))
        run_capture(store, config, once=True)
        store.compact(spark=False)
        retyped = [r for ref in store.segments() for r in map(json.loads, ref.path.read_text().splitlines())
                   if r["op"] == "change_column_type"]
        # every change but small's is one no CAST computes (in order: price, code, doc, at, seen, small, ratio,
        # plain), so only those are followed by the rows
        assert [r.get("values_follow", False) for r in retyped] == [True] * 5 + [False] + [True] * 2
        for lsn, expected in states:
            got = {r["id"]: r for r in store.load_table("u", as_of=lsn).to_pylist()}
            assert {k: {c: v for c, v in r.items() if c != "synthetic_key"} for k, r in got.items()} == expected, lsn
    finally:
        conn.close()
        admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                      (name,))
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        admin.close()


def _table(conn, name: str) -> dict[int, dict]:
    cur = conn.execute(f"SELECT * FROM {name} ORDER BY 1", prepare=False)  # its columns change type
    names = [d.name for d in cur.description]
    return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
