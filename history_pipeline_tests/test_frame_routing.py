"""The driver-routed DataFrame path's plumbing: one read verifies and routes a segment, each (table,
key part) task is handed its lines' byte ranges and reads exactly those lines, on a local root and
on the S3 endpoint, and the answers equal the per-event reference."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from history_pipeline import HistoryStore, SegmentQuarantinedError, StoreSettings
from history_pipeline.compaction import compactor, frames
from history_pipeline.errors import SegmentCorruptedError
from history_pipeline.schema import replay_schema_history
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import SealedSegment, verify_segment
from history_pipeline_tests.spark_scenario import answers
from history_pipeline_tests.test_compaction import random_history, write

FRAMES = StoreSettings(spark_master=None, compaction_engine="dataframes")


def scan_segment(segment: SealedSegment) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, int]]] | None:
    """The reference route of a segment's body in a second read, after verification (as the
    driver did before routing moved into the verifying read): (the lines that are not row events
    in the writer's form, per touched table (uuid, rows, max t)), as ``frames.route`` returns; None
    when the segment is not for the driver's shortcut."""
    folder = frames.routes_dir(segment.ref.path.parent.parent)
    folder.mkdir(exist_ok=True)
    router = frames._Router(folder / f"{segment.ref.name}.reference")
    with open(segment.ref.path, "rb") as f:
        offset, line, carry = 0, 1, b""
        while offset + len(carry) < segment.body_bytes:
            data = carry + f.read(min(frames.ROUTE_BYTES, segment.body_bytes - offset - len(carry)))
            end = data.rfind(b"\n") + 1
            router(data[:end], offset, line)
            offset, line, carry = offset + end, line + data.count(b"\n", 0, end), data[end:]
    routed = router.routed()
    router.discard()
    return None if routed is None else (list(routed.records), list(routed.touched))


def _two_tables(n: int) -> list[list[dict]]:
    """Two segments over two tables, text values with commas and braces, a schema change between."""
    cols = [{"column_uuid": "c", "column_name": "c", "data_type": "TEXT"},
            {"column_uuid": "i", "column_name": "i", "data_type": "BIGINT"}]
    first = [{"op": "create_table", "t": 1, "table_uuid": u, "table_name": u.lower(), "columns": cols}
             for u in ("A", "B")]
    first[1]["t"] = 2
    first += [{"op": "insert", "t": 3 + k // 7, "table_uuid": "AB"[k % 2], "key": k * 3 - n,
               "values": {"c": f"v{k},{{x}}", "i": k}} for k in range(n)]
    second = [{"op": "update", "t": 100 + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n, "values": {"i": -k}}
              for k in range(0, n, 3)]
    second.append({"op": "rename_column", "t": 100 + n, "table_uuid": "A", "column_uuid": "i", "new_name": "j"})
    second += [{"op": "delete", "t": 101 + n + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n}
               for k in range(1, n, 5)]
    return [first, second]


def state_edges(*batches: list[dict]) -> list[int]:
    """The T's at both ends of every span of T's over which the answers cannot change: 0, and each
    event's pre-image (``t``) and post-image (``t + 1``); between them the answers are those at the
    span's ends (a history with gaps between its timestamps is read at far fewer T's than all)."""
    return sorted({0} | {t for batch in batches for e in batch for t in (e["t"], e["t"] + 1)})


def edge_answers(store: HistoryStore, batches: list[list[dict]]) -> dict:
    """Every answer of ``store`` at the :func:`state_edges` of the history it was written from."""
    return answers(store, at=state_edges(*batches))


@pytest.fixture(scope="module")
def reference_answers(tmp_path_factory):
    """Every answer of a history's segments compacted in-process (at the T's of
    :func:`state_edges`), made once per history for the module (several tests compare their stores
    with the same reference)."""
    made: dict[str, dict] = {}

    def answers_of(name: str, batches: list[list[dict]]) -> dict:
        if name not in made:
            store = HistoryStore.open(tmp_path_factory.mktemp("reference") / "root", database="db", settings=FRAMES)
            write(store, *batches)
            assert store.compact(spark=False).segments_applied == list(range(1, len(batches) + 1))
            made[name] = edge_answers(store, batches)
        return made[name]

    return answers_of


def _python_lines(path) -> dict[int, bytes]:
    """The reference: every line of the file by number, split in Python."""
    return dict(enumerate(path.read_bytes().split(b"\n")[:-1], start=1))


@pytest.mark.parametrize("piece", [50, 700, 1 << 22])
def test_one_read_verifies_and_routes_as_the_two_passes_did(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(frames, "ROUTE_BYTES", piece)  # reads cut lines (even shorter than one line)
    monkeypatch.setattr(frames, "SAMPLE_KEYS", 4)  # the key samples thin out several times
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(60))
    for ref in store.segments(SegmentState.SEALED):
        sealed, routed = frames.verify_and_route(ref)
        assert sealed == verify_segment(ref)
        assert routed is not None
        assert (list(routed.records), list(routed.touched)) == scan_segment(sealed)
        lines = _python_lines(ref.path)
        for uuid, rows in routed.rows.items():
            wanted = [n for n, text in lines.items() if f'"table_uuid":"{uuid}","key"'.encode() in text]
            assert rows.lines.tolist() == wanted
            data = ref.path.read_bytes()
            assert [data[s:e] for s, e in zip(rows.starts, rows.ends, strict=True)] == [lines[n] for n in wanted]
            assert all(f'"key":{k},'.encode() in lines[n] or f'"key":{k}}}'.encode() in lines[n]
                       for n, k in zip(rows.lines, rows.keys, strict=True))
        routed_lines = {n for n, _ in routed.records} | {n for r in routed.rows.values() for n in r.lines}
        assert routed_lines == set(range(1, sealed.records + 1))
        for uuid, table in routed.tables.items():  # what the driver keeps: a file and its figures
            rows = routed.rows[uuid]
            assert (table.rows, table.min_key, table.max_key) == (len(rows.lines), rows.keys.min(), rows.keys.max())
            sample = routed.samples[uuid]  # every stride-th key in line order, whatever the pieces
            stride = -(-len(rows.keys) // len(sample))
            assert len(sample) <= frames.SAMPLE_KEYS < len(rows.keys)
            assert sample.tolist() == rows.keys[::stride].tolist()
        routed.remove()
    assert list(frames.routes_dir(store.wal_dir).iterdir()) == []  # removed


def test_a_corrupted_segment_fails_the_single_read_before_any_routing_is_used(tmp_path):
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(20))
    ref = store.segments(SegmentState.SEALED)[1]
    data = bytearray(ref.path.read_bytes())
    data[data.index(b'"i":-3')] ^= 0x01
    ref.path.write_bytes(bytes(data))
    with pytest.raises(SegmentCorruptedError, match="checksum"):
        frames.verify_and_route(ref)


@pytest.mark.parametrize(("span", "gap"), [(1 << 20, 1 << 20), (300, 40), (10, 1)])
def test_a_task_reads_exactly_its_lines(tmp_path, monkeypatch, span, gap):
    """Spans of any size (one line at least) and skipped gaps give back exactly the named lines."""
    monkeypatch.setattr(frames, "ROUTE_BYTES", span)
    monkeypatch.setattr(frames, "SKIP_GAP", gap)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(80))
    ref = store.segments(SegmentState.SEALED)[0]
    _, routed = frames.verify_and_route(ref)
    lines = _python_lines(ref.path)
    rows = routed.rows["A"]
    picked = rows.take(np.arange(len(rows.lines)) % 3 != 1)  # a part: not every line of its table
    got = [(n, text) for b in frames._read_lines(str(ref.path), picked)
           for n, text in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True)]
    assert got == [(int(n), lines[int(n)]) for n in picked.lines]
    spans = list(frames._read_lines(str(ref.path), picked))
    for size, batches in ((1, len(spans)), (1 << 30, 1)):  # what a task decodes: spans joined, in order
        joined = list(frames._coalesced(iter(spans), size))
        assert pa.Table.from_batches(joined).equals(pa.Table.from_batches(spans))
        assert len(joined) == batches


def _first_sealed_tasks(store):
    """The group tasks of the first sealed segment alone, and its route (to remove after)."""
    ref = store.segments(SegmentState.SEALED)[0]
    sealed, routed = frames.verify_and_route(ref)
    state = store.catalog_state()
    plan = frames.plan_frames(sealed, routed.records, routed.touched, replay_schema_history(state.schema_history),
                              state)
    ctx = frames.FrameContext({}, "db", state.frontier + 1, state.txn_id + 1, ref.segment_id)
    return frames.group_tasks([frames.GroupMember(plan, routed, ctx)], compactor.files_per_table), routed


def test_key_parts_get_disjoint_keys_and_every_line_of_their_table(tmp_path, monkeypatch):
    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 10)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(90))
    tasks, routed = _first_sealed_tasks(store)
    for uuid in ("A", "B"):
        mine = [t for t in tasks if t.table_uuid == uuid]
        assert len(mine) > 1  # split
        rows = [t.rows(step) for t in mine for step in t.steps]
        keys = [set(r.keys.tolist()) for r in rows]
        assert sum(len(k) for k in keys) == len(set().union(*keys))  # a key lives in one part only
        assert sorted(n for r in rows for n in r.lines) == routed.rows[uuid].lines.tolist()
        ranges = sorted((min(k), max(k)) for k in keys if k)
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # key ranges, not modulo
    assert [t.weight for t in tasks] == sorted((t.weight for t in tasks), reverse=True)
    routed.remove()


def test_sampled_keys_stay_uniform_and_bounded(monkeypatch):
    monkeypatch.setattr(frames, "SAMPLE_KEYS", 10)
    keys = np.arange(1000, 1237, dtype=np.int64) * 7
    sample, stride, seen = np.zeros(0, np.int64), 1, 0
    for size in (1, 5, 30, 2, 100, 99):  # route pieces of any size
        sample, stride = frames.sample_keys(sample, stride, seen, keys[seen:seen + size])
        seen += size
        assert sample.tolist() == keys[:seen:stride].tolist() and len(sample) <= 10


def test_balanced_cuts_give_each_part_an_equal_share_of_the_rows():
    held = np.arange(1, 1001, dtype=np.int64)  # updates over the held keys, then inserts past them
    inserts = np.arange(1001, 1401, dtype=np.int64)
    cuts, estimate = frames.balanced_cuts([(held, 1000), (inserts, 400)], 4)
    assert cuts == (351, 701, 1051)
    assert estimate == [350, 350, 350, 350]
    parts = frames.part_of_keys(np.concatenate([held, inserts]), 4, cuts)
    assert np.bincount(parts).tolist() == estimate
    # a segment's sample stands for its rows: 10 keys for 1000 rows weigh 100 each
    cuts, estimate = frames.balanced_cuts([(np.arange(10, dtype=np.int64), 1000), (held, 1000)], 2)
    assert cuts == (10,) and estimate == [1009, 991]  # keys 0-9: 10 x 100 + 9 held
    assert frames.balanced_cuts([(np.full(50, 7, np.int64), 50)], 4) == ((), [50])  # one key: one part
    assert frames.balanced_cuts([(np.zeros(0, np.int64), 0)], 4) is None
    assert frames.balanced_cuts([(held, 1000)], 1) is None
    extreme = np.array([-2**63, 2**63 - 1], np.int64)
    assert frames.balanced_cuts([(extreme, 2)], 2) == ((-2**63 + 1,), [1, 1])


def test_inserts_past_the_held_keys_are_spread_over_the_parts(tmp_path, monkeypatch):
    """Parts hold equal shares of a group's rows even when its inserts lie past every key the
    table's files hold (equal key widths of the files would give the last part all of them)."""
    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 100)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    cols = [{"column_uuid": "i", "column_name": "i", "data_type": "BIGINT"}]
    held = [{"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "a", "columns": cols}]
    held += [{"op": "insert", "t": 2 + k, "table_uuid": "A", "key": k, "values": {"i": k}} for k in range(400)]
    later = [{"op": "update", "t": 1000 + k, "table_uuid": "A", "key": (k * 37) % 400, "values": {"i": -k}}
             for k in range(300)]
    later += [{"op": "insert", "t": 2000 + k, "table_uuid": "A", "key": 400 + k, "values": {"i": k}}
              for k in range(300)]
    write(store, held, later)
    store.compact(spark=None, only_segment=1)
    tasks, routed = _first_sealed_tasks(store)
    rows = [len(t.rows(step).lines) for t in tasks for step in t.steps]
    assert len(tasks) == 4 and sum(rows) == 600
    assert max(rows) <= 1.2 * min(rows)  # equal widths of the files' keys: 75 / 75 / 75 / 375
    assert rows == [t.weight for t in tasks]  # 600 keys: all sampled, so the estimates are exact
    routed.remove()


@pytest.mark.parametrize("root", ["local", "s3"])
def test_split_tables_with_byte_ranges_equal_the_reference(tmp_path, monkeypatch, spark, root, request,
                                                           reference_answers):
    """Compacted with tables split into parts and tasks reading small spans, on a local root and on
    the S3 endpoint: every answer at every T equals the per-event reference's."""
    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 8)
    monkeypatch.setattr(frames, "ROUTE_BYTES", 2_000)
    monkeypatch.setattr(frames, "SKIP_GAP", 200)
    planned, group_tasks = [], frames.group_tasks
    monkeypatch.setattr(frames, "group_tasks",
                        lambda *a: planned.append((len(a[0]), group_tasks(*a))) or planned[-1][1])
    events = random_history(5, n_events=90)
    cuts = [i for i in range(1, len(events)) if events[i]["t"] > events[i - 1]["t"]]  # a t is not split
    a, b = cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]
    batches = [events[:a], events[a:b], events[b:]]
    # every kind of column change the history makes comes in a later segment of the group
    assert {e["op"] for e in batches[1] + batches[2]} >= {"add_column", "drop_column", "rename_column",
                                                          "change_column_type", "reorder_column"}
    if root == "s3":
        store = HistoryStore.open(request.getfixturevalue("s3_bucket"), database="db", wal_dir=tmp_path / "wal",
                                  s3=request.getfixturevalue("s3_options"), settings=FRAMES)
    else:
        store = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    write(store, *batches)
    store.compact(spark=spark)
    assert store.segments() and all(s.state is SegmentState.APPLIED for s in store.segments())
    assert edge_answers(store, batches) == reference_answers("random history 5, three segments", batches)
    assert [members for members, _ in planned] == [3]  # every segment routed on the driver, one job
    tasks = planned[0][1]
    assert len({t.table_uuid for t in tasks}) < len(tasks)  # tables split


def test_a_bad_segment_after_good_ones_is_quarantined_alone(tmp_path, spark):
    """Segments are still applied one by one: the good ones commit, the bad one is quarantined
    naming its line, and the frontier stops before it."""
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    first, second = _two_tables(30)
    bad = [{"op": "update", "t": 500, "table_uuid": "B", "key": 10_000, "values": {"i": 1}}]
    write(store, first, second, bad)
    with pytest.raises(SegmentQuarantinedError, match="line 2"):
        store.compact(spark=spark)
    assert [s.segment_id for s in store.segments(SegmentState.APPLIED)] == [1, 2]
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [3]
    assert store.frontier == second[-1]["t"]


def test_part_tasks_are_dealt_into_one_partition_per_local_core(spark):
    def task(n: int) -> frames.GroupTask:
        step = frames.GroupStep(0, None, frames.RouteTable("", n, 0, 0, 0), 0)  # type: ignore[arg-type]
        return frames.GroupTask("T", (), None, (), (step,), False)

    tasks = [task(n) for n in (50, 40, 30, 20, 5)]
    assert frames.pack_tasks(tasks, 2) == [[0, 3, 4], [1, 2]]  # each to the lighter partition
    assert frames.pack_tasks(tasks, 8) == [[0], [1], [2], [3], [4]]
    assert frames.pack_tasks(tasks, None) == [[0], [1], [2], [3], [4]]  # a cluster: one each
    assert frames.local_slots(spark) == 2  # the test session is local[2]
    # near-equal parts of two tables: each partition gets a part of each (a row of one table may cost
    # more than a row of the other); the lightest partition still wins when loads differ much
    a0 = frames.GroupTask("A", (), None, (), (frames.GroupStep(0, None, frames.RouteTable("", 100, 0, 0, 0), 0),),
                          False, 0, 2, (0,), 50)  # type: ignore[arg-type]
    a1, b0, b1 = replace(a0, part=1), replace(a0, table_uuid="B"), replace(a0, table_uuid="B", part=1)
    assert frames.pack_tasks([a0, a1, b0, b1], 2) == [[0, 2], [1, 3]]  # not A, A | B, B
    b60, b100 = replace(b0, estimate=60), replace(b0, estimate=100)
    # within a quarter of its rows of the lightest, a part goes where its table is not yet
    assert frames.pack_tasks([b60, a0, a1], 2) == [[0, 2], [1]]
    assert frames.pack_tasks([b100, a0, a1], 2) == [[0], [1, 2]]  # 101 is more than 51 + 12


# --- several pending segments in one Spark job (a group) ------------------------------------


def _record_groups(monkeypatch) -> list[int]:
    """Records how many segments each Spark job (``run_group``) folded."""
    sizes, run_group = [], frames.run_group
    monkeypatch.setattr(frames, "run_group", lambda spark, members, *a: sizes.append(len(members))
                        or run_group(spark, members, *a))
    return sizes


def _schema_changes_across(n: int) -> list[list[dict]]:
    """Three segments over two tables: a column added without a default, a rename, a column added
    with a default (a backfill) in the middle segment, a type change (a backfill) in the last, and
    deletes with keys inserted again."""
    first, second = _two_tables(n)
    second = [e for e in second if e["op"] != "rename_column"]
    t = 200 + n
    second += [
        {"op": "add_column", "t": t, "table_uuid": "A",
         "column": {"column_uuid": "x", "column_name": "x", "data_type": "INTEGER"}},
        {"op": "rename_column", "t": t + 1, "table_uuid": "B", "column_uuid": "c", "new_name": "label"},
        {"op": "add_column", "t": t + 2, "table_uuid": "B",
         "column": {"column_uuid": "d", "column_name": "d", "data_type": "INTEGER"}, "default": 7},
    ]
    second += [{"op": "update", "t": t + 3 + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n,
                "values": {"x": k} if k % 2 == 0 else {"d": -k}} for k in range(0, n, 4) if k % 5 != 1]
    t += 3 + n
    third = [{"op": "change_column_type", "t": t, "table_uuid": "B", "column_uuid": "i", "data_type": "TEXT"}]
    third += [{"op": "insert", "t": t + 1 + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n,
               "values": {"c": f"again {k}", "i": k} if k % 2 == 0 else {"c": f"again {k}", "i": str(k)}}
              for k in range(1, n, 5)]
    third += [{"op": "update", "t": t + 1 + n + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n,
               "values": {"i": 5 * k} if k % 2 == 0 else {"i": f"text {k}", "d": None}} for k in range(2, n, 6)]
    return [first, second, third]


@pytest.mark.parametrize("split", [False, True])
def test_a_group_across_schema_changes_equals_the_reference(tmp_path, monkeypatch, spark, split, reference_answers):
    """Three segments in one Spark job, with a column added, a rename and backfills (a default, a
    type change) in the middle of the group, whole and with the tables split into key parts (a
    backfill's snapshot then in one piece per part): every answer at every T is the reference's."""
    if split:
        monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 6)
    sizes = _record_groups(monkeypatch)
    store = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    batches = _schema_changes_across(60)
    write(store, *batches)
    assert store.compact(spark=spark).segments_applied == [1, 2, 3]
    assert sizes == [3]
    assert edge_answers(store, batches) == reference_answers("schema changes across 60", batches)
    pieces = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    snapshots = [f for f in pieces.catalog_state().files.values() if f.kind.value == "snapshot"]
    points = {(f.table_uuid, f.snapshot_as_of) for f in snapshots}
    assert len(points) == 2  # one per backfill
    if split:
        assert len(snapshots) > len(points)  # in pieces: disjoint key ranges
        for point in points:
            ranges = sorted((f.min_key, f.max_key) for f in snapshots if (f.table_uuid, f.snapshot_as_of) == point)
            assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert pieces.verify() == []


def test_a_bad_segment_in_the_middle_of_a_group_is_quarantined_alone(tmp_path, monkeypatch, spark):
    """The good segment before it commits, the bad one is quarantined naming its line, the one after
    it stays pending, and no file written for the bad one or after it is left in the store."""
    sizes = _record_groups(monkeypatch)
    store = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    first, second, third = _schema_changes_across(30)
    bad = [*second[:5], {"op": "update", "t": second[4]["t"], "table_uuid": "A", "key": 99_999, "values": {"i": 1}},
           *second[5:]]
    write(store, first, bad, third)
    lines = _python_lines(store.segments(SegmentState.SEALED)[1].path)
    line = next(n for n, text in lines.items() if b'"key":99999,' in text)
    with pytest.raises(SegmentQuarantinedError, match=f"line {line}: update of key 99999"):
        store.compact(spark=spark)
    assert sizes == [3]
    assert [s.segment_id for s in store.segments(SegmentState.APPLIED)] == [1]
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [2]
    assert [s.segment_id for s in store.segments(SegmentState.SEALED)] == [3]
    assert store.frontier == first[-1]["t"]
    committed = set(store.catalog_state().files)
    written = {str(p.relative_to(tmp_path / "frames")) for p in (tmp_path / "frames").rglob("*.parquet")}
    assert written == committed  # the bad segment's files and the next one's were deleted
    reference = HistoryStore.open(tmp_path / "reference", database="db", settings=FRAMES)
    write(reference, first)
    reference.compact(spark=False)
    assert edge_answers(store, [first]) == edge_answers(reference, [first])


class Crash(Exception):
    pass


@pytest.mark.parametrize("step", ["files_written", "schema_history_written", "committed"])
def test_a_crash_between_the_commits_of_a_group_recovers(tmp_path, spark, step, reference_answers):
    """A crash after the group's job, at a step of its second segment (the first committed): the
    next run applies every segment exactly once and answers as the reference."""
    store = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    batches = _schema_changes_across(40)
    write(store, *batches)
    seen = []

    def crash(at: str) -> None:
        seen.append(at)
        if at == step and seen.count("committed") == (1 if step != "committed" else 2):
            raise Crash(at)

    with pytest.raises(Crash):
        store.compact(spark=spark, on_step=crash)
    applied = 2 if step == "committed" else 1
    assert store.frontier == batches[applied - 1][-1]["t"]
    again = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    summary = again.compact(spark=spark)
    # a segment committed before the crash is only moved (the catalog lists it already)
    assert summary.segments_applied == ([3] if step == "committed" else [2, 3])
    assert [s.state for s in again.segments()] == [SegmentState.APPLIED] * 3
    assert edge_answers(again, batches) == reference_answers("schema changes across 40", batches)


def test_route_files_a_crashed_run_left_break_nothing_and_go(tmp_path, spark):
    """Route files are written beside the segments while the driver verifies them and removed after
    the Spark job; those a killed run left are not reused (a fresh attempt id each read), and
    compaction removes them once their segments are applied."""
    store = HistoryStore.open(tmp_path / "frames", database="db", settings=FRAMES)
    write(store, *_two_tables(40))
    left = [frames.verify_and_route(ref)[1] for ref in store.segments(SegmentState.SEALED)]  # a run killed here
    folder = frames.routes_dir(store.wal_dir)
    stale = sorted(p.name for p in folder.iterdir())
    assert len(stale) == sum(len(r.tables) for r in left) > 0
    (folder / "00000000000000000001.torn.0.rows").write_bytes(b"\x01\x02")  # a write cut short
    assert store.compact(spark=spark).segments_applied == [1, 2]
    assert list(folder.iterdir()) == []
    reference = HistoryStore.open(tmp_path / "reference", database="db", settings=FRAMES)
    write(reference, *_two_tables(40))
    reference.compact(spark=False)
    assert edge_answers(store, _two_tables(40)) == edge_answers(reference, _two_tables(40))


@pytest.mark.parametrize("stop", ["rows", "corrupt", "segments"])
def test_segments_routed_ahead_of_a_group_end_leave_no_route_file(tmp_path, monkeypatch, stop):
    """The driver routes the next segments while it plans one; where the group ends (its row bound,
    a corrupt segment, its segment bound) those routed ahead leave no route file, and the group's
    own files are exactly its members' until the job is over."""
    monkeypatch.setattr(compactor, "ROUTE_THREADS", 3)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    first, second = _two_tables(60)
    later = [[{"op": "update", "t": 1000 * s + k, "table_uuid": "AB"[k % 2], "key": k * 3 - 60, "values": {"i": s}}
              for k in range(0, 60, 2)] for s in (1, 2)]
    write(store, first, second, *later)  # four segments
    refs = store.segments(SegmentState.SEALED)
    if stop == "rows":
        monkeypatch.setattr(frames, "MAX_GROUP_ROWS", 70)  # the first segment's 60 rows, not the second's
    elif stop == "corrupt":
        data = bytearray(refs[2].path.read_bytes())
        data[data.index(b'"i":1')] ^= 0x01
        refs[2].path.write_bytes(bytes(data))
    else:
        monkeypatch.setattr(frames, "MAX_GROUP_SEGMENTS", 3)
    group = compactor._plan_group(store, refs, store.catalog_state())
    assert [p.ref.segment_id for p in group] == {"rows": [1], "corrupt": [1, 2], "segments": [1, 2, 3]}[stop]
    folder = frames.routes_dir(store.wal_dir)
    mine = {Path(t.path).name for p in group for t in p.member.routed.tables.values()}
    assert {p.name for p in folder.iterdir()} == mine and mine
    for pending in group:
        pending.member.routed.remove()
    assert list(folder.iterdir()) == []


def test_a_planning_failure_leaves_no_route_file(tmp_path, monkeypatch):
    """An unexpected error while a group is planned (here on its second segment, the third routed
    ahead) leaves no route file of any segment behind."""
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    first, second = _two_tables(40)
    third = [{"op": "update", "t": 5000 + k, "table_uuid": "A", "key": k * 3 - 40, "values": {"i": 7}}
             for k in range(0, 40, 2)]
    write(store, first, second, third)
    plan_frames, calls = frames.plan_frames, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planning failed")
        return plan_frames(*args, **kwargs)

    monkeypatch.setattr(frames, "plan_frames", failing)
    with pytest.raises(RuntimeError, match="planning failed"):
        compactor._plan_group(store, store.segments(SegmentState.SEALED), store.catalog_state())
    assert list(frames.routes_dir(store.wal_dir).iterdir()) == []
