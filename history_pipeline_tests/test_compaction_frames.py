"""The DataFrame compaction against the per-event reference path, on values of every contract type
(they travel through Spark in carrier types and come back exact), across segment boundaries
(prior images read on executors) and through type changes and defaults (backfills, snapshots)."""

from __future__ import annotations

import shutil

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.model import FileKind
from history_pipeline_tests.spark_scenario import answers
from history_pipeline_tests.test_compaction import write
from history_pipeline_tests.test_postgres_oracle import TYPED

#: the DataFrame compaction engine, on the session given to compact()
FRAMES = StoreSettings(spark_master=None, compaction_engine="dataframes")


@pytest.fixture(autouse=True, params=["driver-routed", "driver-routed-split", "spark-routed"])
def routing(request, monkeypatch):
    """Every test in each routing: segments routed on the driver (one task per table), the same
    with tables split into key parts (as large tables are), and routed by Spark's JSON reader
    (the fallback for segments not in the writer's form)."""
    from history_pipeline.compaction import compactor, frames

    if request.param == "driver-routed-split":
        monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 2)
    if request.param == "spark-routed":
        monkeypatch.setattr(frames, "MAX_SCANNED_RECORDS", -1)
    return request.param


def _both(tmp_path, spark, *batches):
    """The same segments compacted on Spark (DataFrame path) and in-process (reference)."""
    stores = []
    for name, session in (("frames", spark), ("reference", False)):
        store = HistoryStore.open(tmp_path / name, database="db", settings=FRAMES)
        write(store, *batches)
        store.compact(spark=session)
        stores.append(store)
    return stores


def test_every_type_survives_the_dataframe_path(tmp_path, spark):
    create = {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
              "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty, _ in TYPED]}
    first = [create] + [
        {"op": "insert", "t": 2, "table_uuid": "T", "key": key, "values": {c: v[key] for c, _, v in TYPED}}
        for key in (0, 1)
    ]
    second = [  # a later segment: the prior image of key 1 is read back from Parquet on executors
        {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {c: v[0] for c, _, v in TYPED[::2]}},
        {"op": "insert", "t": 4, "table_uuid": "T", "key": 2, "values": {}},
        {"op": "update", "t": 5, "table_uuid": "T", "key": 0, "values": {"i": None}},
    ]
    frames, reference = _both(tmp_path, spark, first, second)
    assert frames.segments() and all(s.state.value == "applied" for s in frames.segments())
    got = answers(frames)
    assert got == answers(reference)
    assert len(got["6"]["typed"]) == 3 and got["6"]["typed"][0]["i"] == "None"  # an explicit NULL is kept


def test_type_changes_and_defaults_backfill_on_executors(tmp_path, spark):
    cols = [{"column_uuid": "a", "column_name": "a", "data_type": "NUMERIC(8,2)"},
            {"column_uuid": "b", "column_name": "b", "data_type": "INTEGER"}]
    first = [{"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": cols}] + [
        {"op": "insert", "t": 2, "table_uuid": "T", "key": k, "values": {"a": f"{k}.25", "b": k}} for k in range(5)
    ]
    second = [
        {"op": "delete", "t": 3, "table_uuid": "T", "key": 4},
        {"op": "change_column_type", "t": 4, "table_uuid": "T", "column_uuid": "a", "data_type": "TEXT"},
        {"op": "update", "t": 5, "table_uuid": "T", "key": 0, "values": {"b": 50}},
        {"op": "add_column", "t": 6, "table_uuid": "T",
         "column": {"column_uuid": "c", "column_name": "c", "data_type": "UUID"},
         "default": "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"},
        {"op": "change_column_type", "t": 7, "table_uuid": "T", "column_uuid": "b", "data_type": "TEXT"},
        {"op": "change_column_type", "t": 8, "table_uuid": "T", "column_uuid": "b", "data_type": "BIGINT"},
        {"op": "insert", "t": 9, "table_uuid": "T", "key": 9, "values": {"a": "x"}},
        {"op": "update", "t": 9, "table_uuid": "T", "key": 1, "values": {"a": "y"}},
        # integers into integers: one Arrow cast when every value fits
        {"op": "change_column_type", "t": 10, "table_uuid": "T", "column_uuid": "b", "data_type": "INTEGER"},
        {"op": "change_column_type", "t": 11, "table_uuid": "T", "column_uuid": "b", "data_type": "BIGINT"},
        {"op": "update", "t": 12, "table_uuid": "T", "key": 2, "values": {"b": 2**40}},
    ]
    frames, reference = _both(tmp_path, spark, first, second)
    assert answers(frames) == answers(reference)
    snapshots = frames.catalog_state().files_of("T", FileKind.SNAPSHOT)
    # one snapshot point per backfill (in one piece per key part when a table is split)
    assert sorted({f.snapshot_as_of for f in snapshots}) == [5, 7, 8, 9, 11, 12]
    row = frames.fetch_row("t", 9, 10)
    assert row["a"] == "x" and str(row["c"]) == "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01" and row["b"] is None


def test_seal_is_verified_streaming_before_spark_reads_the_segment(tmp_path, spark):
    from history_pipeline import SegmentQuarantinedError
    from history_pipeline.wal import SegmentState
    from history_pipeline_tests.test_compaction import example_events

    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, example_events()[:3], example_events()[3:])
    second = store.segments(SegmentState.SEALED)[1]
    data = bytearray(second.path.read_bytes())
    data[data.index(b"value2_prime")] ^= 0x01
    second.path.write_bytes(bytes(data))
    with pytest.raises(SegmentQuarantinedError, match="checksum"):
        store.compact(spark=spark)
    assert store.frontier == 3
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [2]


NOT_NULL = {"column_uuid": "nn", "column_name": "nn", "data_type": "SMALLINT", "is_nullable": False}
FIRST = [  # the good first segment: key 1 deleted, keys 2 and 3 live, a NOT NULL column and a cast target
    {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t",
     "columns": [{"column_uuid": "c", "column_name": "c", "data_type": "TEXT"}, NOT_NULL]},
    {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"c": "a", "nn": 1}},
    {"op": "insert", "t": 2, "table_uuid": "T", "key": 2, "values": {"c": "12", "nn": 2}},
    {"op": "insert", "t": 3, "table_uuid": "T", "key": 3, "values": {"c": "x", "nn": 3}},
    {"op": "delete", "t": 4, "table_uuid": "T", "key": 1},
]
BAD_SEGMENTS = {  # each second segment fails; the DataFrame engine must name the same line and reason
    "update of a deleted key": [{"op": "update", "t": 5, "table_uuid": "T", "key": 1, "values": {"c": "y"}}],
    "delete of a missing key": [{"op": "delete", "t": 5, "table_uuid": "T", "key": 9}],
    "insert of a live key": [{"op": "insert", "t": 5, "table_uuid": "T", "key": 2, "values": {"nn": 1}}],
    "unknown table": [{"op": "insert", "t": 5, "table_uuid": "nope", "key": 5, "values": {}}],
    "unknown column": [{"op": "insert", "t": 5, "table_uuid": "T", "key": 5, "values": {"zz": 1, "nn": 1}}],
    "wrong JSON type": [{"op": "insert", "t": 5, "table_uuid": "T", "key": 5, "values": {"c": 5, "nn": 1}}],
    "out of range": [{"op": "update", "t": 5, "table_uuid": "T", "key": 2, "values": {"nn": 40000}}],
    "NOT NULL left empty": [{"op": "insert", "t": 5, "table_uuid": "T", "key": 5, "values": {"c": "v"}}],
    "NOT NULL set to null": [{"op": "update", "t": 5, "table_uuid": "T", "key": 3, "values": {"nn": None}}],
    "re-insert within one t, then a delete of the vanished key": [
        {"op": "insert", "t": 5, "table_uuid": "T", "key": 6, "values": {"nn": 6}},
        {"op": "delete", "t": 5, "table_uuid": "T", "key": 6},
        {"op": "delete", "t": 6, "table_uuid": "T", "key": 6},
    ],
    "cast fails on two keys (smallest key named)": [
        {"op": "insert", "t": 5, "table_uuid": "T", "key": 0, "values": {"c": "zero", "nn": 0}},
        {"op": "change_column_type", "t": 6, "table_uuid": "T", "column_uuid": "c", "data_type": "INTEGER"},
    ],
    "an integer narrowed out of range (the Arrow cast fails, the per-value casts name the key)": [
        {"op": "change_column_type", "t": 5, "table_uuid": "T", "column_uuid": "nn", "data_type": "BIGINT"},
        {"op": "update", "t": 6, "table_uuid": "T", "key": 3, "values": {"nn": 70000}},
        {"op": "insert", "t": 6, "table_uuid": "T", "key": 4, "values": {"nn": -70000}},
        {"op": "change_column_type", "t": 7, "table_uuid": "T", "column_uuid": "nn", "data_type": "SMALLINT"},
    ],
}


@pytest.fixture(scope="module")
def first_compacted(tmp_path_factory):
    """A store at ``root`` holding ``FIRST`` compacted on ``session`` in ``routing``: a copy of one
    compaction per routing and engine made once for the module (each bad segment is written to its
    own copy; a bad segment in a group after good ones is test_frame_routing's)."""
    made: dict[tuple[str, str], object] = {}

    def copy(root, name: str, session, routing: str) -> HistoryStore:
        if (routing, name) not in made:
            made[routing, name] = tmp_path_factory.mktemp("first") / "root"
            store = HistoryStore.open(made[routing, name], database="db", settings=FRAMES)
            write(store, FIRST)
            assert store.compact(spark=session).segments_applied == [1]
        shutil.copytree(made[routing, name], root)
        return HistoryStore.open(root, database="db", settings=FRAMES)

    return copy


@pytest.mark.parametrize("case", sorted(BAD_SEGMENTS))
def test_bad_segments_fail_with_the_reference_line_and_reason(tmp_path, spark, routing, first_compacted, case):
    from history_pipeline import SegmentQuarantinedError

    messages = []
    for name, session in (("frames", spark), ("reference", False)):
        store = first_compacted(tmp_path / name, name, session, routing)
        write(store, BAD_SEGMENTS[case])
        with pytest.raises(SegmentQuarantinedError) as info:
            store.compact(spark=session)
        messages.append(str(info.value))
        state = store.catalog_state()
        assert store.frontier == 4 and state.files_of("T", FileKind.VERSIONS)
        assert {e.segments for e in state.files.values()} == {(1,)}  # nothing of the bad segment
    assert messages[0] == messages[1]
    assert "segment 00000000000000000002, line" in messages[0]


def test_the_dataframe_engine_names_the_smallest_failing_line(tmp_path, spark):
    """Several bad lines: the smallest is named (the per-event reference names a bad value before
    any missing key, whatever their lines, as it decodes the whole segment before folding)."""
    from history_pipeline import SegmentQuarantinedError

    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, FIRST, [
        {"op": "insert", "t": 5, "table_uuid": "T", "key": 7, "values": {"nn": 7}},
        {"op": "update", "t": 6, "table_uuid": "T", "key": 8, "values": {"c": "y"}},  # line 3: no key 8
        {"op": "update", "t": 7, "table_uuid": "T", "key": 3, "values": {"nn": "x"}},  # line 4: not a SMALLINT
    ])
    with pytest.raises(SegmentQuarantinedError, match="segment 00000000000000000002, line 3: update of key 8, "
                                                      "which does not exist"):
        store.compact(spark=spark)



def test_key_parts_are_ranges_of_the_prior_keys_or_modulo_without_them():
    import numpy as np

    from history_pipeline.catalog.model import FileEntry, FileKind
    from history_pipeline.compaction.frames import key_cuts, part_of_keys

    def entry(low, high):
        return FileEntry(path=f"f{low}", kind=FileKind.VERSIONS, table_uuid="T", size_bytes=1, row_count=1,
                         min_t=1, max_t=1, min_key=low, max_key=high)

    cuts = key_cuts([entry(10, 50), entry(60, 109)], parts=4)
    assert cuts == (35, 60, 85)  # [10, 110) in four ranges of 25
    keys = np.array([-5, 10, 34, 35, 59, 60, 84, 85, 109, 10_000])
    assert part_of_keys(keys, 4, cuts).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]  # below / above go to the ends
    assert key_cuts([entry(10, 50)], parts=1) is None
    assert key_cuts([FileEntry("f", FileKind.VERSIONS, "T", 1, 0, None, None)], parts=4) is None
    assert part_of_keys(np.array([7, -3, 8]), 4, None).tolist() == [3, 1, 0]  # modulo, never negative


def test_a_part_reads_only_the_prior_files_whose_key_range_may_hold_its_keys():
    import pyarrow as pa

    from history_pipeline.catalog.model import FileEntry, FileKind
    from history_pipeline.compaction.frames import _files_of_keys

    def entry(name, low, high, kind=FileKind.SNAPSHOT):
        return FileEntry(path=name, kind=kind, table_uuid="T", size_bytes=1, row_count=1,
                         min_t=1, max_t=1, min_key=low, max_key=high)

    pieces = [entry("p0", 0, 99), entry("p1", 100, 199), entry("p2", 200, 299)]
    unknown = FileEntry("u", FileKind.VERSIONS, "T", 1, 1, 1, 1)  # no key statistics: always read
    files = [*pieces, unknown, entry("v", 150, 250, FileKind.VERSIONS)]
    names = lambda keys: [f.path for f in _files_of_keys(files, keys)]  # noqa: E731
    assert names(pa.array([120, 130], pa.int64())) == ["p1", "u"]
    assert names(pa.array([99, 100], pa.int64())) == ["p0", "p1", "u"]  # both edges are inside
    assert names(pa.array([180, 260], pa.int64())) == ["p1", "p2", "u", "v"]  # by the keys' range
    assert names(pa.array([1000], pa.int64())) == ["u"]
    assert names(None) == ["p0", "p1", "p2", "u", "v"]  # the whole table: every file
