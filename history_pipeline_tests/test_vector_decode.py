"""The DataFrame engine's vectorized decoder against its reference (``parse_line`` + ``decode_value``
row by row), value by value: canonical and non-canonical values of every type with a fast path,
out-of-range values, NULLs, explicit NULL against absent, NOT NULL and defaults, unknown columns
and tables, duplicate keys, odd line shapes. Every row must come out identical (values, "set"
flags, error class and message), and the canonical rows must really take the fast path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest

from history_pipeline.catalog.model import CatalogState
from history_pipeline.compaction import frames
from history_pipeline.compaction.vector_decode import decode_canonical
from history_pipeline.schema import SchemaState
from history_pipeline.wal.segments import SealedSegment, SegmentRef, SegmentState

TYPES = {
    "b": "BOOLEAN", "i2": "SMALLINT", "i4": "INTEGER", "i8": "BIGINT", "r": "REAL", "d": "DOUBLE PRECISION",
    "n": "NUMERIC(12,2)", "n0": "NUMERIC(5,0)", "nf": "NUMERIC(3,3)", "nw": "NUMERIC", "s": "TEXT",
    "v": "VARCHAR(3)", "u": "UUID", "dt": "DATE", "tm": "TIME", "ts": "TIMESTAMP", "tz": "TIMESTAMPTZ",
    "j": "JSONB", "iv": "INTERVAL", "by": "BYTEA", "a": "INTEGER[]", "c": "CHAR(4)",
}
#: per column: canonical values (the fast path must take them) and others (the reference decides)
CANONICAL = {
    "b": [True, False],
    "i2": [0, -32768, 32767, 12],
    "i4": [0, 2**31 - 1, -(2**31), 7],
    "i8": [2**59, -(2**59), 123456789012345678, 0],
    "r": [1.5, 3.4028234e38, 1e-45, 0.1, -2.5e-3, 16777217, 0.0, -0.0],
    "d": [0.1, 1e308, -2.5e-300, 12345678901234567, 5, 4.35, 1e-400, -0.0],
    "n": ["12.34", "-0.5", "9999999999.99", "0", "7", 42, -3, "1.2"],
    "n0": ["12345", "-99999", 0, "3"],
    "nf": ["0.123", "-0.9", "0", 0],
    "s": ["", "plain", "ünïcödé ✓ 😀", "a,b", "x:y", "12", "true", ":", ":x:"],  # a value may begin with ":"
    "v": ["abc", "äöü", ""],
    "c": ["ab", "abcd", "", " a", "äö "],  # blank-padded to 4
    "u": ["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-ABCD-EF0123456789"],
    "dt": ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", "1969-12-31"],
    "tm": ["00:00:00", "23:59:59.999999", "12:30:00.5", "01:02:03.0405"],
    "ts": ["2024-01-01T00:00:00", "1900-03-01 12:00:00.25", "9999-12-31T23:59:59.999999", "0001-01-01T00:00:00"],
    "tz": ["2024-01-01T00:00:00+00:00", "2024-06-30T23:30:00.123-05:30", "2000-01-01T00:00:00Z",
           "1999-12-31T23:00:00+23:59", "9998-12-31T23:59:59-12:00"],
}
OTHER = {
    "b": ["true", 1, 0],
    "i2": [32768, -32769, 1.0, "5", True, 10**30],
    "i4": [2**31, -(2**31) - 1, 2.5, "7", 1e3],
    "i8": [2**63 - 1, -(2**63), 2**63, 10**19, 1.5],
    "r": [3.5e38, 1e-46, 1e-50, "NaN", "Infinity", "-Infinity", "1.5", True, 10**39, 1e300],
    "d": [1.5e308 * 10, "NaN", "-Infinity", "x", False, 10**400],
    "n": ["12.345", "12.355", "10000000000.00", "1e3", ".5", "+1", "NaN", 1.5, "1.", "0012.5", True],
    "n0": ["123456", "1.5", 100000],
    "nf": ["1.0", "0.1234", 1],
    "nw": ["12.3400", "-0", 5, "1e-7"],
    "s": [5, True, "tab\there", "quote\"d", "back\\slash", "\u00e9\\u00e9", "nul\x00"],
    "v": ["abcd", 12],
    "c": ["abcde", "abcd  ", 5],  # too long (an error), blanks past the length (cut), not a string
    "u": ["123e4567e89b12d3a456426614174000", "{123e4567-e89b-12d3-a456-426614174000}", "nope", 5],
    "dt": ["2023-02-29", "0000-01-01", "2024-13-01", "2024-1-01", "20240101", 20240101],
    "tm": ["24:00:00", "12:60:00", "12:00:60", "12:00:00.1234567", "12:00", "12:00:00Z"],
    "ts": ["2024-01-01T00:00:00+00:00", "2024-02-30T00:00:00", "2024-01-01T25:00:00", "2024-01-01"],
    "tz": ["2024-01-01T00:00:00", "2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00+05", "9999-12-31T23:00:00-05:00",
           "0001-01-01T00:00:00+01:00", "2024-01-01T00:00:00+0530", "2024-01-01T00:00:00+05:75"],
    "j": [{"a": [1, 2]}, 5, "text"],
    "iv": [{"months": 1, "days": 2, "micros": 3}],
    "by": ["aGVsbG8=", "not base64!"],
    "a": [[1, 2], [[1], [2]]],
}
SEGMENT = "00000000000000000042"


def _segment() -> SealedSegment:
    ref = SegmentRef(42, SegmentState.SEALED, Path(f"/nonexistent/{SEGMENT}"))
    return SealedSegment(ref=ref, lower=0, upper=10**6, records=0, body_bytes=0, size_bytes=0)


def _line(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


def _work(records: list[tuple[int, bytes]]) -> frames.TableWork:
    plan = frames.plan_frames(_segment(), records, [("T", 1, 1)], SchemaState(), CatalogState())
    assert plan.error is None
    return next(w for w in plan.tables if w.table_uuid == "T")


def _schema_records() -> list[tuple[int, bytes]]:
    create = {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
              "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty in TYPES.items()]
              + [{"column_uuid": "nn", "column_name": "nn", "data_type": "INTEGER", "is_nullable": False}]}
    add = {"op": "add_column", "t": 500, "table_uuid": "T",
           "column": {"column_uuid": "def", "column_name": "def", "data_type": "TEXT", "is_nullable": False},
           "default": "dflt"}
    return [(1, _line(create)), (5000, _line(add))]


def _rows(work: frames.TableWork, lines: list[tuple[int, bytes]], fast: bool) -> list[dict]:
    batch = pa.RecordBatch.from_arrays(
        [pa.array([n for n, _ in lines], pa.int64()), pa.array([t for _, t in lines], pa.binary())],
        names=["line", "text"],
    )
    out = pa.Table.from_batches(list(frames._decoder(work, SEGMENT, fast=fast)(iter([batch]))))
    return sorted(out.to_pylist(), key=lambda r: r["line"])


def _compare(lines: list[tuple[int, bytes]], records: list[tuple[int, bytes]] | None = None) -> tuple[int, int]:
    """Both decoders over ``lines``; returns (rows, rows the fast path decoded)."""
    work = _work(records if records is not None else _schema_records())
    fast, reference = _rows(work, lines, True), _rows(work, lines, False)
    assert len(fast) == len(reference) == len(lines)
    for got, want in zip(fast, reference, strict=True):
        assert repr(got) == repr(want), (got["line"], got, want)  # repr: NaN equals itself, -0.0 is not 0.0
    batch_lines = pa.array([n for n, _ in lines], pa.int64())
    _, left = decode_canonical(batch_lines, pa.array([t for _, t in lines], pa.binary()), "T", work.epoch_lines,
                               frames._epochs(work), work.supercolumns_after)
    return len(lines), len(lines) - len(left)


def _event(line: int, op: str, key: int, values: dict | None) -> tuple[int, bytes]:
    record = {"op": op, "t": line, "table_uuid": "T", "key": key}
    if values is not None:
        record["values"] = values
    return line, _line(record)


def test_canonical_values_of_every_type_take_the_fast_path_and_equal_the_reference():
    lines, n = [], 10
    for column, values in CANONICAL.items():
        for value in values:
            for op in ("insert", "update"):
                n += 1
                lines.append(_event(n, op, n, {column: value, "nn": 1}))
    rows, fast = _compare(lines)
    assert fast == rows  # every one of them decoded as Arrow kernels


def test_other_values_go_to_the_reference_and_equal_it():
    lines, n = [], 10
    for column, values in OTHER.items():
        for value in values:
            n += 1
            lines.append(_event(n, "update", n, {column: value}))
    rows, fast = _compare(lines)
    assert fast == 0


def test_nulls_absent_values_defaults_and_not_null():
    lines = [
        _event(11, "insert", 1, {"nn": 1}),  # every other column absent: NULL, set (an insert)
        _event(12, "update", 1, {"s": None}),  # explicit NULL: set; the others absent: not set
        _event(13, "update", 1, {}),
        _event(18, "update", 1, {"j": None, "iv": None, "a": None}),  # NULL needs no fast path of its type
        _event(14, "delete", 1, None),
        _event(15, "insert", 2, {"nn": None}),  # explicit NULL into NOT NULL: the reference's error
        _event(16, "insert", 3, {"s": "x"}),  # NOT NULL left empty: the reference's error
        _event(17, "update", 3, {"nn": None}),
        _event(6000, "insert", 4, {"nn": 2}),  # after add_column: its default fills in
        _event(6001, "insert", 5, {"nn": 2, "def": "given"}),
        _event(6002, "insert", 6, {"nn": 2, "def": None}),  # NULL into the new NOT NULL column
        _event(6003, "update", 5, {"def": "changed"}),
    ]
    rows, fast = _compare(lines)
    assert fast == 8  # the four NOT NULL violations are the reference's to explain


def test_odd_shapes_unknown_columns_and_tables_duplicates():
    good = {"s": "a", "nn": 1}
    lines = [
        _event(11, "insert", 1, {**good, "nope": 5}),  # unknown column
        (12, b'{"op":"update","t":12,"table_uuid":"T","key":1,"values":{"s":"a","s":"b"}}'),  # duplicate
        (13, b'{"op": "update", "t": 13, "table_uuid": "T", "key": 1, "values": {"s": "a"}}'),  # spaces
        (14, b'{"t":14,"op":"update","table_uuid":"T","key":1,"values":{"s":"a"}}'),  # another order
        (15, b'{"op":"update","t":15,"table_uuid":"U","key":1,"values":{"s":"a"}}'),  # another table
        (16, b'{"op":"update","t":16,"table_uuid":"T","key":1,"values":{"s":"a"},"x":1}'),  # an extra field
        (17, b'{"op":"delete","t":17,"table_uuid":"T","key":1,"values":{}}'),  # a delete with values
        (18, b'{"op":"update","t":18,"table_uuid":"T","key":1}'),  # an update without values
        (19, b'{"op":"update","t":19,"table_uuid":"T","key":12345678901234567890,"values":{}}'),  # key range
        (20, b'{"op":"update","t":-1,"table_uuid":"T","key":1,"values":{}}'),
        (21, b'{"op":"update","t":21,"table_uuid":"T","key":1,"values":{"s":"\xff"}}'),  # not UTF-8
        (22, b'{"op":"update","t":22,"table_uuid":"T","key":1,"values":{"d":NaN}}'),
        (23, b'{"op":"update","t":23,"table_uuid":"T","key":1,"values":{"s":"\\ud800"}}'),  # lone surrogate
        (24, b'{"op":"update","t":24,"table_uuid":"T","key":1,"values":{"s":"x:\\"y"}}'),
        (25, b'{"op":"update","t":25,"table_uuid":"T","key":-0,"values":{"s":"a"}}'),
        (26, b'{"op":"update","t":26,"table_uuid":"T","key":0,"values":{"s":"a"}}'),
    ]
    _compare(lines)
    valid_utf8 = [line for line in lines if line[0] != 21]  # one bad line sends its whole batch to the reference
    rows, fast = _compare(valid_utf8)
    assert fast == 1  # line 26 only


def test_an_unknown_table_is_the_reference_error():
    records = [(1, _line({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t",
                          "columns": [{"column_uuid": "s", "column_name": "s", "data_type": "TEXT"}]})),
               (20, _line({"op": "drop_table", "t": 20, "table_uuid": "T"}))]
    lines = [_event(10, "insert", 1, {"s": "a"}), _event(30, "update", 1, {"s": "b"})]
    rows, fast = _compare(lines, records)
    assert fast == 1


@pytest.mark.parametrize("seed", [1, 2])
def test_random_numbers_read_like_python(seed):
    """Correct rounding of text -> DOUBLE / REAL and exact NUMERIC, over many random spellings."""
    rng = random.Random(seed)
    lines, n = [], 10
    for _ in range(400):
        n += 1
        x = rng.uniform(-1, 1) * 10 ** rng.randint(-40, 40)
        spelled = float(f"{x:.{rng.randint(1, 17)}g}")
        whole, frac = rng.randint(0, 10**10 - 1), rng.randint(0, 99)
        values = {
            "d": spelled, "r": spelled, "n": f"{rng.choice(['', '-'])}{whole}.{frac:0{rng.randint(1, 2)}d}",
            "i8": rng.randint(-(10**18) + 1, 10**18 - 1), "nn": 1,
        }
        lines.append(_event(n, "insert", n, values))
    rows, fast = _compare(lines)
    assert fast > rows * 0.9


def test_the_driver_routes_a_segment_as_sparks_json_reader_does(tmp_path, spark):
    from history_pipeline import HistoryStore, StoreSettings
    from history_pipeline.compaction import frames
    from history_pipeline.wal import SegmentState
    from history_pipeline.wal.segments import verify_segment
    from history_pipeline_tests.test_compaction import write
    from history_pipeline_tests.test_compaction_frames import BAD_SEGMENTS, FIRST
    from history_pipeline_tests.test_frame_routing import scan_segment

    store = HistoryStore.open(tmp_path, database="db", settings=StoreSettings(compaction_engine="dataframes"))
    second = [*BAD_SEGMENTS["cast fails on two keys (smallest key named)"],
              {"op": "insert", "t": 7, "table_uuid": "U", "key": 1, "values": {}},
              {"op": "update", "t": 8, "table_uuid": "T", "key": 2, "values": {"nn": 5}}]
    write(store, FIRST, second)
    for ref in store.segments(SegmentState.SEALED):
        sealed = verify_segment(ref)
        scanned = scan_segment(sealed)
        assert scanned is not None
        assert scanned == frames.route(spark, frames.parsed_lines(spark, sealed))
        assert scanned[1]  # some rows were routed, beside the schema and close records


def test_a_row_event_not_in_the_writers_form_is_routed_by_spark(tmp_path):
    from history_pipeline.wal import SegmentState
    from history_pipeline.wal.segments import SealedSegment, SegmentRef
    from history_pipeline_tests.test_frame_routing import scan_segment


    path = tmp_path / "00000000000000000001"
    canonical = b'{"op":"insert","t":2,"table_uuid":"T","key":1,"values":{"c":"a"}}\n'
    for other, routed in ((b'{"op":"update","t":3,"table_uuid":"T","key":1,"values":{"c":"b"}}\n', True),
                          (b'{"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"c": "b"}}\n', False),
                          (b'{"t":3,"op":"delete","table_uuid":"T","key":1}\n', False),
                          (b'{"op":"rename_table","t":3,"table_uuid":"T","new_name":"u"}\n', True)):
        body = b'{"op":"close","t":1}\n' + canonical + other
        path.write_bytes(body)
        ref = SegmentRef(1, SegmentState.SEALED, path)
        scanned = scan_segment(SealedSegment(ref, 1, 3, 3, len(body), len(body)))
        assert (scanned is not None) == routed, other


@pytest.mark.parametrize("seed", [3, 4])
def test_bodies_of_several_values_are_cut_into_pairs_as_the_reference_reads_them(seed):
    """Values are found without a regular expression (cut at '":' and at a piece's last ',"'):
    strings ending in a comma, holding ':' or ',', or spelling a column uuid, values in any order,
    some of them absent, duplicate keys and unknown columns among them, all equal the reference."""
    rng = random.Random(seed)
    texts = ["a,", ",", ":", "x:", ",:", "s", "nn", '", "', "{}", "[1,2]", "\u00e9,", ""]
    pool = {"s": texts, "v": ["a,", ":", ""], "nn": [1, 0, -7], "i8": [5, -3], "b": [True, False],
            "n": ["1.5", "-0.25"], "dt": ["2024-02-29"], "u": ["123e4567-e89b-12d3-a456-426614174000"]}
    lines, n = [], 10
    for _ in range(300):
        n += 1
        names = rng.sample(sorted(pool), rng.randint(1, len(pool)))
        values = {c: rng.choice(pool[c]) for c in names}
        if rng.random() < 0.5:
            values["nn"] = rng.choice(pool["nn"])  # inserts need it
        text = _line({"op": rng.choice(["insert", "update"]), "t": n, "table_uuid": "T", "key": n, "values": values})
        if rng.random() < 0.1:  # a duplicate key, or a column the table does not have
            extra = rng.choice([b'"s":"dup",', b'"zz":1,', b'"nn":null,'])
            text = text.replace(b'"values":{', b'"values":{' + extra, 1)
        lines.append((n, text))
    rows, fast = _compare(lines)
    assert fast > rows // 2
