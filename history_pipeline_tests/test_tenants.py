"""Many tenants under one root: the sensor's cost per tick follows what changed (the change journal,
and the marks store it reads only for the databases named), never the number of databases nor the
history; a quarantined or unreadable database holds up only itself; hundreds of databases work; and
the instance's run queue limits compaction runs per database and over all of them."""

import os
import shutil
from pathlib import Path

import dagster as dg
import pytest

from bench.tenants import age, fake_wal, seal_next, segment_file
from history_pipeline.errors import HistoryError
from history_pipeline.orchestration import sensors
from history_pipeline.orchestration.resources import HistoryRootResource, S3Settings, SparkResource, history_root
from history_pipeline.orchestration.sensor_marks import BlockedSummary, MarksStore, marks_path, summarize_blocked
from history_pipeline.orchestration.sensors import (
    COMPACTION_TAG,
    DATABASE_TAG,
    FULL_SCAN_EVERY,
    NAMED_IN_SKIP,
    SETTLE_NS,
    DatabaseListing,
    DatabaseMark,
    SegmentMark,
    SegmentView,
    SensorCursor,
    TickFacts,
    databases_to_check,
    databases_to_list,
    finished_wal_segments_sensor,
    full_scan_due,
    full_scan_every,
    plan_tick,
    skip_reason,
)
from history_pipeline.wal import SegmentState
from history_pipeline.wal.journal import JOURNAL, journal_dir, note_change, read_journal
from history_pipeline.wal.segments import segment_name

NOW = 10**19  # "now" for the pure tests: every stamp below is long settled
OLD = (1_000, 2_000)
CURSOR = SensorCursor("e", 0, None, 0)  # a new epoch's first tick


def sealed(db, i, ns=1):
    return SegmentView(db, i, segment_name(i), SegmentState.SEALED, ns)


def quarantined(db, i, ns=1, reason="line 2: bad"):
    return SegmentView(db, i, segment_name(i), SegmentState.QUARANTINED, ns, reason)


def key(db, i):
    return f"{db}.{segment_name(i)}"


def segments_of(plan):
    """The segments a plan requests, run after run."""
    return [v for batch in plan.runs for v in batch.segments]


def requested(result):
    """The partition keys a sensor result requests, run after run."""
    return [k for r in result.run_requests for k in r.run_config["ops"]["compact_segments"]["config"]["partition_keys"]]


# --- the pure decision ------------------------------------------------------------------------------


def test_plan_tick_requests_each_sealed_segment_once_in_id_order():
    listing = DatabaseListing("a", OLD, (sealed("a", 3), sealed("a", 2)))
    first = plan_tick(CURSOR, {}, {"a": OLD}, [listing], now_ns=NOW)
    assert [v.segment_id for v in segments_of(first)] == [2, 3] and len(first.runs) == 1  # one run, in order
    assert first.add_partitions == (key("a", 2), key("a", 3)) and first.delete_partitions == ()
    assert first.marks == {"a": DatabaseMark(OLD, (SegmentMark(2, 1, False, True), SegmentMark(3, 1, False, True)))}
    assert first.cursor == SensorCursor("e", 1, 0, 1)  # the marks are not in the cursor: four numbers
    assert databases_to_list(first.marks, {"a": OLD}) == []  # unchanged folders: not listed again
    moved = (OLD[0] + 1, OLD[1])
    assert databases_to_list(first.marks, {"a": moved}) == ["a"]
    # listed again (a new segment was sealed): only the new one runs
    again = plan_tick(first.cursor, first.marks, {"a": moved},
                      [DatabaseListing("a", moved, (sealed("a", 2), sealed("a", 3), sealed("a", 4)))], now_ns=NOW)
    assert [v.segment_id for v in segments_of(again)] == [4] and again.add_partitions == (key("a", 4),)
    # a segment repaired in place is a new file (new change time): it runs again, keeps its partition
    repaired = plan_tick(again.cursor, again.marks, {"a": OLD},
                         [DatabaseListing("a", OLD, (sealed("a", 2, ns=9), sealed("a", 3), sealed("a", 4)))],
                         now_ns=NOW)
    assert [v.version for v in segments_of(repaired)] == [f"{key('a', 2)}@9"] and repaired.add_partitions == ()


def batches(plan):
    return [(b.database, [v.segment_id for v in b.segments]) for b in plan.runs]


def test_plan_tick_batches_a_databases_ready_segments_one_run_in_flight_at_a_time():
    a = DatabaseListing("a", OLD, tuple(sealed("a", i) for i in range(1, 6)))
    b = DatabaseListing("b", OLD, (sealed("b", 1),))
    stamps = {"a": OLD, "b": OLD}
    # a run of a is queued or running: a's new segments wait for its end (a stays pending), b runs
    held = plan_tick(CURSOR, {}, stamps, [a, b], TickFacts(in_flight=frozenset({"a"})), now_ns=NOW)
    assert batches(held) == [("b", [1])]
    assert held.marks["a"].stamp is None and not any(m.done for m in held.marks["a"].segments)
    assert held.held == ("a",)
    assert "1 database(s) wait for their run in flight: a.00000000000000000001 waits for the run of a in flight" in (
        skip_reason(held, BlockedSummary()))
    # it ended: one run for the ready segments, in order, at most max_segments; the rest, the next run
    capped = plan_tick(held.cursor, held.marks, stamps, [a], now_ns=NOW, max_segments=3)
    assert batches(capped) == [("a", [1, 2, 3])] and capped.marks["a"].stamp is None
    assert [m.done for m in capped.marks["a"].segments] == [True, True, True, False, False]
    rest = plan_tick(capped.cursor, capped.marks, stamps, [a], now_ns=NOW, max_segments=3)
    assert batches(rest) == [("a", [4, 5])] and rest.marks["a"].stamp == OLD
    assert plan_tick(rest.cursor, rest.marks, stamps, [a], now_ns=NOW).runs == ()  # each once
    # bytes bound a run too: a first segment over the bound runs alone; a smaller later one does not
    # jump the queue
    sized = [SegmentView("c", i, segment_name(i), SegmentState.SEALED, 1, None, size) for i, size in
             ((1, 10), (2, 10), (3, 1), (4, 10))]
    c = DatabaseListing("c", OLD, tuple(sized))
    first = plan_tick(CURSOR, {}, {"c": OLD}, [c], now_ns=NOW, max_bytes=5)
    assert batches(first) == [("c", [1])]
    second = plan_tick(first.cursor, first.marks, {"c": OLD}, [c], now_ns=NOW, max_bytes=15)
    assert batches(second) == [("c", [2, 3])]
    # a run's key names its batch and changes with any segment's file
    assert second.runs[0].run_key.startswith(f"{key('c', 2)}..{segment_name(3)}@")
    touched = plan_tick(CURSOR, {}, {"c": OLD}, [DatabaseListing("c", OLD, (sized[0], sized[1]))], now_ns=NOW)
    retouched = plan_tick(CURSOR, {}, {"c": OLD}, [DatabaseListing("c", OLD, (
        sized[0], SegmentView("c", 2, segment_name(2), SegmentState.SEALED, 2)))], now_ns=NOW)
    assert touched.runs[0].run_key != retouched.runs[0].run_key
    assert touched.runs[0].run_key == plan_tick(CURSOR, {}, {"c": OLD}, [DatabaseListing(
        "c", OLD, (sized[0], sized[1]))], now_ns=NOW).runs[0].run_key


def skip(plan, marks):
    """The skip reason over the marks the store holds after the tick."""
    return skip_reason(plan, summarize_blocked(marks, NAMED_IN_SKIP))


def test_plan_tick_holds_back_only_the_quarantined_database_and_reports_once_its_partition_exists():
    stamps = {"q": OLD, "ok": OLD}
    listings = [DatabaseListing("q", OLD, (quarantined("q", 2), sealed("q", 3))),
                DatabaseListing("ok", OLD, (sealed("ok", 1),))]
    first = plan_tick(CURSOR, {}, stamps, listings, now_ns=NOW)
    assert [v.key for v in segments_of(first)] == [key("ok", 1)]  # q's segment 3 waits behind its segment 2
    assert set(first.add_partitions) == {key("q", 2), key("q", 3), key("ok", 1)}
    assert first.report_quarantined == ()  # the partition is only being added
    assert first.marks["q"].stamp is None  # so q is listed again next tick
    assert databases_to_list(first.marks, stamps) == ["q"]
    second = plan_tick(first.cursor, first.marks, stamps, [DatabaseListing("q", OLD, listings[0].segments)],
                       now_ns=NOW, full_scan=False)
    assert [v.key for v in second.report_quarantined] == [key("q", 2)] and second.runs == ()
    marks = {**first.marks, **second.marks}
    assert "(2 database(s), 1 listed this tick; q.00000000000000000002 is quarantined (line 2: bad)" in skip(
        second, marks)
    assert "1 sealed segment(s) wait behind them" in skip(second, marks)
    assert databases_to_list(marks, stamps) == []  # settled: reported once
    third = plan_tick(second.cursor, {}, {}, [], now_ns=NOW, full_scan=False)  # a steady tick looks at nothing
    assert third.marks == {} and third.gone == () and third.cursor.databases == 2
    assert "q.00000000000000000002 is quarantined (the reason is on its partition)" in skip(third, marks)
    # a quarantine the failing run already reported on the partition is not reported again
    observed = plan_tick(first.cursor, first.marks, stamps, [DatabaseListing("q", OLD, listings[0].segments)],
                         TickFacts(observed=frozenset({quarantined("q", 2).version})), now_ns=NOW)
    assert observed.report_quarantined == ()
    # repaired: the quarantined file left, a re-sealed one is in segments/: both run, in order
    fixed = plan_tick(second.cursor, marks, stamps,
                      [DatabaseListing("q", OLD, (sealed("q", 2, ns=5), sealed("q", 3)))], now_ns=NOW)
    assert [v.segment_id for v in segments_of(fixed)] == [2, 3] and fixed.add_partitions == ()
    assert summarize_blocked({**marks, **fixed.marks}, NAMED_IN_SKIP) == BlockedSummary()


def test_the_skip_reason_names_a_few_blocked_databases_and_counts_the_rest():
    marks = {f"db{n}": DatabaseMark(OLD, (SegmentMark(n + 1, 1, True, True), SegmentMark(n + 2, 1, False, False)))
             for n in range(8)}
    plan = plan_tick(SensorCursor("e", 4, 3, 8), {}, {}, [], now_ns=NOW, full_scan=False)
    text = skip(plan, marks)
    assert text.count("is quarantined (the reason is on its partition)") == NAMED_IN_SKIP
    assert "db0.00000000000000000001" in text and "db5." not in text
    assert "and 3 more quarantined database(s); 8 sealed segment(s) wait behind them; repair or skip them)" in text


def test_plan_tick_counts_databases_added_and_gone():
    cursor = SensorCursor("e", 5, 2, 2)
    marks = {"a": DatabaseMark(OLD), "gone": DatabaseMark(OLD, (SegmentMark(7, 1, False, True),))}
    plan = plan_tick(cursor, marks, {"a": OLD, "new": OLD},
                     [DatabaseListing("a", OLD, ()), DatabaseListing("new", OLD, ())], now_ns=NOW, full_scan=False)
    assert plan.gone == ("gone",) and set(plan.marks) == {"a", "new"}
    assert plan.cursor == SensorCursor("e", 6, 3, 2)  # one came, one left
    assert plan_tick(cursor, marks, {"a": OLD}, [], now_ns=NOW).cursor.databases == 1  # a full scan counts


def test_plan_tick_keeps_partitions_of_applied_segments_and_removes_those_gone():
    marks = {"a": DatabaseMark(OLD, (SegmentMark(1, 1, False, True), SegmentMark(2, 1, False, True))),
             "gone": DatabaseMark(OLD, (SegmentMark(7, 1, False, True),))}
    plan = plan_tick(CURSOR, marks, {"a": OLD}, [DatabaseListing("a", OLD, ())],
                     TickFacts(applied=frozenset({key("a", 1)}), partitions_of_gone=(key("gone", 3), key("gone", 7))),
                     now_ns=NOW)
    # segment 1 was applied (its partition stays, green); segment 2 left the WAL; "gone" left the root
    assert plan.delete_partitions == (key("gone", 3), key("gone", 7), key("a", 2))
    assert plan.marks == {"a": DatabaseMark(OLD)} and plan.gone == ("gone",)


def test_a_folder_changed_just_now_is_listed_again_on_the_next_tick():
    now = 50 * SETTLE_NS
    recent = (now - SETTLE_NS // 2, 0)
    plan = plan_tick(CURSOR, {}, {"a": recent}, [DatabaseListing("a", recent, (sealed("a", 1),))], now_ns=now)
    # folder times are coarse: a segment sealed in the same clock tick could leave the same time
    assert plan.marks["a"].stamp is None and databases_to_list(plan.marks, {"a": recent}) == ["a"]
    settled = plan_tick(plan.cursor, plan.marks, {"a": recent}, [DatabaseListing("a", recent, (sealed("a", 1),))],
                        now_ns=now + SETTLE_NS)
    assert settled.runs == () and settled.marks["a"].stamp == recent


def test_cursor_round_trips_through_json_and_an_older_cursor_starts_afresh():
    cursor = SensorCursor("0123abcd", 41, 7, 1_000)
    assert SensorCursor.from_json(cursor.to_json()) == cursor
    assert len(cursor.to_json()) < 80  # whatever the number of databases
    assert SensorCursor.from_json('["db.00000000000000000002@1"]') == SensorCursor()  # the first format
    assert SensorCursor.from_json(None) == SensorCursor() == SensorCursor.from_json("not json")
    # a cursor that held the marks itself (format 1): start afresh, with a full scan
    older = '{"v":1,"n":3,"db":{"a":[[1000,2000],[[2,5,1,0]]]}}'
    assert SensorCursor.from_json(older) == SensorCursor() and full_scan_due(SensorCursor.from_json(older), True)


def test_a_full_scan_runs_first_without_a_journal_and_every_nth_tick():
    assert full_scan_due(SensorCursor(), journal_present=True)  # first tick: no cursor
    assert full_scan_due(SensorCursor("e", 4, 3), journal_present=False)  # journal gone
    assert not full_scan_due(SensorCursor("e", 4, 0), True, every=60)
    assert not full_scan_due(SensorCursor("e", 4, 58), True, every=60)
    assert full_scan_due(SensorCursor("e", 4, 59), True, 60)
    assert full_scan_due(SensorCursor("e", 4, 0), True, every=1)  # every tick
    full = plan_tick(SensorCursor("e", 4, 59), {}, {}, [], now_ns=NOW, full_scan=True)
    steady = plan_tick(full.cursor, {}, {}, [], now_ns=NOW, full_scan=False)
    assert (full.cursor.since_full_scan, steady.cursor.since_full_scan) == (0, 1)
    assert (full.cursor.generation, steady.cursor.generation) == (5, 6)


def test_full_scan_interval_is_a_field_of_the_resource(monkeypatch):
    assert full_scan_every(history_root("data")) == FULL_SCAN_EVERY == 60
    assert full_scan_every(HistoryRootResource(root="data", s3=S3Settings(), sensor_full_scan_every=5)) == 5
    with pytest.raises(HistoryError, match="sensor_full_scan_every=0"):
        full_scan_every(HistoryRootResource(root="data", s3=S3Settings(), sensor_full_scan_every=0))


def test_a_steady_tick_checks_the_databases_named_by_markers_and_those_pending():
    assert databases_to_check(["b"], []) == ["b"]
    assert databases_to_check(["b"], ["c", "new", "c", "", "../x"]) == ["b", "c", "new"]  # not names: ignored


# --- the sensor on real folders and a real Dagster instance -----------------------------------------


class Listings:
    """Records every folder listed under a root (os.listdir and os.scandir, which pathlib uses) and
    every path stat-ed under it (os.stat, which pathlib and os.path use)."""

    def __init__(self, monkeypatch, root: Path):
        self.root = str(root)
        self.seen: list[str] = []
        self.stated: list[str] = []
        for name in ("listdir", "scandir"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._spy(real, self.seen))
        monkeypatch.setattr(os, "stat", self._spy(os.stat, self.stated))

    def _spy(self, real, record):
        def spy(path=".", *args, **kwargs):
            text = path if isinstance(path, int) else os.fspath(path)  # (an int is an open folder's fd)
            if isinstance(text, str) and text.startswith(self.root):
                record.append(os.path.relpath(text, self.root))
            return real(path, *args, **kwargs)
        return spy

    def take(self) -> list[str]:
        seen = sorted(self.seen)
        self.seen.clear()  # (in place: the spies append to these lists)
        return seen

    def take_stats(self) -> list[str]:
        stated = sorted(self.stated)
        self.stated.clear()
        return stated


def resource(root, every=FULL_SCAN_EVERY):
    return HistoryRootResource(root=str(root), s3=S3Settings(), sensor_full_scan_every=every)


def tick(instance, root, cursor, every=FULL_SCAN_EVERY):
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"history": resource(root, every), "spark": SparkResource()}) as context:
        return finished_wal_segments_sensor(context)


def marks_of(root, cursor):
    """The marks the sensor's cursor commits, as a tick with that cursor reads them."""
    cursor = SensorCursor.from_json(cursor)
    with MarksStore.open(marks_path(root)) as store:
        return store.read_all(cursor.epoch, cursor.generation)


def test_second_tick_over_unchanged_wals_lists_and_requests_nothing(tmp_path, monkeypatch):
    root = tmp_path / "data"
    for n in range(5):
        fake_wal(root / f"db{n}" / "wal", applied=50, sealed=2)
    listings = Listings(monkeypatch, root)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    assert len(first.run_requests) == 5 and len(requested(first)) == 10  # one run per database
    listed = listings.take()
    assert "." in listed and not any("applied" in p for p in listed)  # history is never listed
    # the first tick scans every WAL (and finds no journal yet: it creates one)
    assert sorted(p for p in listed if p != ".") == [JOURNAL] + [f"db{n}/wal/segments" for n in range(5)]
    assert read_journal(journal_dir(root)) == ()
    listings.take(), listings.take_stats()  # (the test's own reads)
    second = tick(instance, root, first.cursor)
    assert second.run_requests == [] and second.dynamic_partitions_requests == []
    assert listings.take() == [JOURNAL]  # the journal only: no database folder listed...
    assert listings.take_stats() == []  # ...nor stat-ed
    sealed_id = seal_next(root / "db3" / "wal")  # leaves a marker, as the writer does
    assert [m.database for m in read_journal(journal_dir(root))] == ["db3"]
    listings.take()  # (the test's own writer listed that folder)
    third = tick(instance, root, second.cursor)
    assert requested(third) == [f"db3.{segment_file(sealed_id, '')}"]
    assert listings.take() == [JOURNAL, "db3/wal/segments"]
    assert read_journal(journal_dir(root)) == ()  # its marker was consumed
    listings.take()
    fourth = tick(instance, root, third.cursor)  # db3 changed a moment ago: listed once more, nothing new
    assert fourth.run_requests == [] and listings.take() == [JOURNAL, "db3/wal/segments"]
    age(root / "db3" / "wal")  # seconds later: listed one last time, now settled
    fifth = tick(instance, root, fourth.cursor)
    assert fifth.run_requests == [] and listings.take() == [JOURNAL, "db3/wal/segments"]
    listings.take_stats()
    assert tick(instance, root, fifth.cursor).run_requests == [] and listings.take() == [JOURNAL]
    assert listings.take_stats() == []


def test_a_quarantined_or_unreadable_database_does_not_hold_up_the_others(tmp_path):
    root = tmp_path / "data"
    fake_wal(root / "ok" / "wal", applied=3, sealed=2)
    stuck = root / "stuck" / "wal"
    fake_wal(stuck, applied=1, sealed=2)
    (stuck / "quarantine").mkdir()
    (stuck / "segments" / segment_file(2)).rename(stuck / "quarantine" / segment_file(2))
    (stuck / "quarantine" / f"{segment_name(2)}.error.json").write_text('{"error": "line 4: no such key"}')
    broken = root / "broken" / "wal"
    broken.mkdir(parents=True)
    (broken / "segments").symlink_to(broken / "segments")  # a loop: stat fails with ELOOP
    age(stuck)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    assert requested(first) == [f"ok.{segment_name(4)}", f"ok.{segment_name(5)}"]
    assert all(r.tags[DATABASE_TAG] == "ok" and r.tags[COMPACTION_TAG] == "segments" for r in first.run_requests)
    assert set(first.dynamic_partitions_requests[0].partition_keys) == {
        f"ok.{segment_name(4)}", f"ok.{segment_name(5)}", f"stuck.{segment_name(2)}", f"stuck.{segment_name(3)}"}
    instance.add_dynamic_partitions("wal_segments", list(first.dynamic_partitions_requests[0].partition_keys))
    seal_next(root / "ok" / "wal")  # ok goes on while stuck waits for an operator
    second = tick(instance, root, first.cursor)
    assert requested(second) == [f"ok.{segment_name(6)}"]
    assert [(e.partition, e.metadata["reason"].value) for e in second.asset_events] == [
        (f"stuck.{segment_name(2)}", "line 4: no such key")] * 2
    (broken / "segments").unlink()  # fixed: the next tick lists it like any other
    fake_wal(broken, applied=0, sealed=1)
    note_change(broken)  # (its writer journals)
    third = tick(instance, root, second.cursor)
    assert requested(third) == [f"broken.{segment_name(1)}"]
    instance.add_dynamic_partitions("wal_segments", [f"broken.{segment_name(1)}"])
    shutil.move(broken / "segments", broken / "aside")  # unreadable again: not taken for a database gone
    (broken / "segments").symlink_to(broken / "segments")
    note_change(broken)  # named by a marker: a steady tick tries it
    fourth = tick(instance, root, third.cursor)
    assert fourth.run_requests == [] and fourth.dynamic_partitions_requests == []
    assert "broken" in marks_of(root, fourth.cursor)
    assert [m.database for m in read_journal(journal_dir(root))] == ["broken"]  # kept: tried again next tick
    full = tick(instance, root, fourth.cursor, every=1)  # a full scan does not take it for a database gone either
    assert full.run_requests == [] and full.dynamic_partitions_requests == []
    assert "broken" in marks_of(root, full.cursor)
    fourth = full
    (broken / "segments").unlink()
    shutil.move(broken / "aside", broken / "segments")
    assert tick(instance, root, fourth.cursor).run_requests == []  # nothing new: requested once


def test_three_hundred_databases(tmp_path, monkeypatch):
    root = tmp_path / "data"
    for n in range(300):
        fake_wal(root / f"tenant_{n:03d}" / "wal", applied=5, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    assert requested(first) == [
        f"tenant_{n:03d}.{segment_name(6)}" for n in range(300)]
    assert len(first.dynamic_partitions_requests[0].partition_keys) == 300
    listings = Listings(monkeypatch, root)
    second = tick(instance, root, first.cursor)
    # a steady tick reads the journal folder and nothing else: no database folder listed or stat-ed
    assert second.run_requests == [] and listings.take() == [JOURNAL] and listings.take_stats() == []
    assert "300 database(s), 0 listed this tick" in second.skip_reason.skip_message
    shutil.rmtree(root / "tenant_123")  # a tenant leaves: its partitions go (at the next full scan)
    instance.add_dynamic_partitions("wal_segments", list(first.dynamic_partitions_requests[0].partition_keys))
    third = tick(instance, root, second.cursor, every=1)
    assert third.dynamic_partitions_requests[0].partition_keys == [f"tenant_123.{segment_name(6)}"]
    assert "tenant_123" not in marks_of(root, third.cursor) and len(marks_of(root, third.cursor)) == 299
    assert "299 database(s)" in tick(instance, root, third.cursor).skip_reason.skip_message


def test_instance_limits_compaction_runs_per_database_and_over_all_databases(tmp_path):
    """The shipped dagster.yaml loads, and its run queue limits the tags the sensor puts on runs."""
    shutil.copy(Path(__file__).parent.parent / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        queue = instance.run_coordinator.get_run_queue_config()
        # each tick is stored with the cursor (O(databases)): idle ticks are not kept for a week
        assert instance.get_settings("retention")["sensor"]["purge_after_days"]["skipped"] == 1
        # a run whose process died is failed by monitoring (the launcher reports its worker's health)
        assert instance.run_monitoring_enabled and instance.run_launcher.supports_check_run_worker_health
    limits = {limit["key"]: limit for limit in queue.tag_concurrency_limits}
    assert limits[DATABASE_TAG]["limit"] == 1 and limits[DATABASE_TAG]["value"] == {"applyLimitPerUniqueValue": True}
    assert 1 <= limits[COMPACTION_TAG]["limit"] < queue.max_concurrent_runs  # a slot stays for maintenance


@pytest.mark.parametrize("applied", [0, 40])
def test_what_a_tick_lists_does_not_depend_on_history(tmp_path, monkeypatch, applied):
    root = tmp_path / "data"
    fake_wal(root / "db" / "wal", applied=applied, sealed=1)
    listings = Listings(monkeypatch, root)
    first = tick(dg.DagsterInstance.ephemeral(), root, None)
    assert len(first.run_requests) == 1
    assert listings.take() == [".", JOURNAL, "db/wal/segments"]


@pytest.mark.parametrize("layout", ["local root", "wal_root", "s3 root"])
def test_the_sensors_wal_folders_are_those_the_store_uses(tmp_path, monkeypatch, layout):
    monkeypatch.chdir(tmp_path)  # an S3 root keeps its WALs under data/wal/<bucket>/<prefix> by default
    root, wal_root = {"local root": (str(tmp_path / "data"), None),
                      "wal_root": ("s3://bucket/prefix", str(tmp_path / "wals")),
                      "s3 root": ("s3://bucket/prefix", None)}[layout]
    history = history_root(root, wal_root=wal_root)
    for database in ("a", "b.c"):
        fake_wal(history.wal_dir(database), applied=1, sealed=1)
    assert history.wal_dirs() == {db: str(history.wal_dir(db)) for db in ("a", "b.c")}
    assert history.databases() == ["a", "b.c"]
    # a WAL's markers land in the journal the sensor reads, naming its database
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(),
                                 resources={"history": history, "spark": SparkResource()}) as context:
        first = finished_wal_segments_sensor(context)  # (creates the journal)
    for database in ("a", "b.c"):
        assert note_change(history.wal_dir(database))
    assert [m.database for m in read_journal(journal_dir(history.wal_base()))] == ["a", "b.c"]
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), cursor=first.cursor,
                                 resources={"history": history, "spark": SparkResource()}) as context:
        second = finished_wal_segments_sensor(context)
    assert "2 listed this tick" in second.skip_reason.skip_message
    assert read_journal(journal_dir(history.wal_base())) == ()


def test_a_marker_left_between_the_read_and_the_delete_is_not_lost(tmp_path, monkeypatch):
    root = tmp_path / "data"
    for db in ("a", "b"):
        fake_wal(root / db / "wal", applied=2, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    sealed_a = seal_next(root / "a" / "wal")
    real = sensors._list_database
    sealed_meanwhile = []

    def list_and_seal_b(database, wal_dir, stamp):
        listing = real(database, wal_dir, stamp)
        if database == "a" and not sealed_meanwhile:  # b seals after the journal was read
            sealed_meanwhile.append(seal_next(root / "b" / "wal"))
        return listing

    monkeypatch.setattr(sensors, "_list_database", list_and_seal_b)
    second = tick(instance, root, first.cursor)
    assert requested(second) == [f"a.{segment_name(sealed_a)}"]
    assert [m.database for m in read_journal(journal_dir(root))] == ["b"]  # a's consumed, b's kept
    monkeypatch.setattr(sensors, "_list_database", real)
    third = tick(instance, root, second.cursor)
    assert requested(third) == [f"b.{segment_name(sealed_meanwhile[0])}"]


def test_the_periodic_full_scan_finds_a_segment_copied_in_without_a_marker(tmp_path):
    root = tmp_path / "data"
    fake_wal(root / "db" / "wal", applied=2, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    cursor = tick(instance, root, None, every=3).cursor  # full scan
    copied = seal_next(root / "db" / "wal", journal=False)  # a hand copy: no marker
    for _ in range(2):  # steady ticks read the journal only: they cannot see it
        result = tick(instance, root, cursor, every=3)
        assert result.run_requests == []
        cursor = result.cursor
    found = tick(instance, root, cursor, every=3)  # the third tick since the last full scan is one
    assert requested(found) == [f"db.{segment_name(copied)}"]
    assert SensorCursor.from_json(found.cursor).since_full_scan == 0


def test_a_missing_journal_means_a_full_scan_that_recreates_it(tmp_path):
    root = tmp_path / "data"
    fake_wal(root / "db" / "wal", applied=2, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    shutil.rmtree(journal_dir(root))  # (someone cleaned up)
    copied = seal_next(root / "db" / "wal")  # no journal: the writer leaves no marker
    second = tick(instance, root, first.cursor)
    assert requested(second) == [f"db.{segment_name(copied)}"]
    assert read_journal(journal_dir(root)) == ()


# --- the marks store: per-database state outside the Dagster cursor --------------------------------


def test_marks_store_reads_a_write_whose_cursor_was_not_stored_as_the_version_before(tmp_path):
    a1 = DatabaseMark(OLD, (SegmentMark(1, 5, True, True), SegmentMark(2, 5, False, False)))
    a2 = DatabaseMark((3, 3), (SegmentMark(2, 5, False, True),))
    with MarksStore.open(marks_path(tmp_path / "base")) as store:  # (creates its folder)
        store.start_epoch("e")
        store.write("e", 0, {"a": a1, "b": DatabaseMark(None)})  # generation 1
        assert store.read("e", 1, ["a", "b", "c"]) == {"a": a1, "b": DatabaseMark(None)}
        assert store.read("e", 0, ["a", "b"]) == {}  # a reader whose cursor predates the write sees nothing
        assert store.pending("e", 1) == ["b"]  # not settled
        assert store.pending("e", 0) == ["a", "b"]  # written by a tick whose cursor was not stored
        store.write("e", 1, {"a": a2})  # generation 2 ...
        assert store.read("e", 1, ["a"]) == {"a": a1} and store.read("e", 2, ["a"]) == {"a": a2}
        store.write("e", 1, {"a": a2})  # ... retried after Dagster lost its cursor: the version before stays
        assert store.read("e", 1, ["a"]) == {"a": a1}
        assert store.blocked("e", 5) == summarize_blocked({"a": a2, "b": DatabaseMark(None)}, 5) == BlockedSummary()
        store.write("e", 1, {"a": a1})
        assert store.blocked("e", 5) == summarize_blocked({"a": a1}, 5) == BlockedSummary(1, 1, (("a", 1),))
        store.write("e", 2, {}, gone=["a"])  # generation 3: a left the WAL base
        assert store.read_all("e", 3) == {"b": DatabaseMark(None)}
        assert store.read_all("e", 2) == {"a": a1, "b": DatabaseMark(None)}
        store.purge_gone("e", 3)
        assert store.read_all("e", 2) == {"b": DatabaseMark(None)}
        store.start_epoch("f")  # a reset cursor: a new epoch drops the old one
        assert not store.has_epoch("e") and store.has_epoch("f") and store.read_all("e", 9) == {}


def test_marks_survive_across_ticks_outside_the_cursor(tmp_path):
    root = tmp_path / "data"
    for n in range(50):
        fake_wal(root / f"db{n:02d}" / "wal", applied=2, sealed=3)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    assert len(first.run_requests) == 50 and len(requested(first)) == 150
    cursor = SensorCursor.from_json(first.cursor)
    assert cursor.generation == 1 and cursor.databases == 50 and len(first.cursor) < 100  # no per-database state
    marks = marks_of(root, first.cursor)
    assert sorted(marks) == [f"db{n:02d}" for n in range(50)]
    assert [(s.segment_id, s.done) for s in marks["db07"].segments] == [(3, True), (4, True), (5, True)]
    # a later tick (a new process, a new instance object: nothing kept in memory) knows them from the store
    sealed_id = seal_next(root / "db07" / "wal")
    second = tick(dg.DagsterInstance.ephemeral(), root, first.cursor)
    assert requested(second) == [f"db07.{segment_name(sealed_id)}"]
    assert [s.segment_id for s in marks_of(root, second.cursor)["db07"].segments] == [3, 4, 5, sealed_id]
    assert len(second.cursor) == len(first.cursor)


class StoreSpy:
    """Records the databases whose marks each tick reads and writes through the MarksStore API."""

    def __init__(self, monkeypatch):
        self.read: list[str] = []
        self.written: list[str] = []
        self.read_all = 0
        spy = self

        def read(store, epoch, committed, databases):
            databases = list(databases)
            spy.read += databases
            return real_read(store, epoch, committed, databases)

        def read_all(store, epoch, committed):
            spy.read_all += 1
            return real_read_all(store, epoch, committed)

        def write(store, epoch, committed, marks, gone=()):
            gone = list(gone)
            spy.written += [*marks, *gone]
            return real_write(store, epoch, committed, marks, gone)

        real_read, real_read_all, real_write = MarksStore.read, MarksStore.read_all, MarksStore.write
        monkeypatch.setattr(MarksStore, "read", read)
        monkeypatch.setattr(MarksStore, "read_all", read_all)
        monkeypatch.setattr(MarksStore, "write", write)

    def take(self) -> tuple[list[str], list[str], int]:
        out = (sorted(self.read), sorted(self.written), self.read_all)
        self.read, self.written, self.read_all = [], [], 0
        return out


def test_a_steady_tick_reads_and_writes_only_the_marks_of_the_databases_named(tmp_path, monkeypatch):
    root = tmp_path / "data"
    for n in range(300):
        fake_wal(root / f"tenant_{n:03d}" / "wal", applied=1, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    spy = StoreSpy(monkeypatch)
    first = tick(instance, root, None)  # a full scan: every mark
    assert spy.take()[2] == 1 and len(first.run_requests) == 300
    second = tick(instance, root, first.cursor)
    assert second.run_requests == [] and spy.take() == ([], [], 0)  # nothing named: no mark read or written
    sealed = [seal_next(root / f"tenant_{n:03d}" / "wal") for n in (17, 250)]
    third = tick(instance, root, second.cursor)
    assert requested(third) == [
        f"tenant_017.{segment_name(sealed[0])}", f"tenant_250.{segment_name(sealed[1])}"]
    assert spy.take() == (["tenant_017", "tenant_250"], ["tenant_017", "tenant_250"], 0)
    for n in (17, 250):
        age(root / f"tenant_{n:03d}" / "wal")
    fourth = tick(instance, root, third.cursor)  # changed a moment ago: pending, looked at once more
    assert spy.take() == (["tenant_017", "tenant_250"], ["tenant_017", "tenant_250"], 0)
    assert tick(instance, root, fourth.cursor).run_requests == [] and spy.take() == ([], [], 0)


def test_a_lost_cursor_neither_loses_nor_duplicates_a_run_request(tmp_path):
    """Dagster may fail to store a tick's cursor after the sensor wrote its marks (and consumed the
    markers): the next tick, given the cursor before, requests the same runs under the same keys."""
    root = tmp_path / "data"
    for db in ("a", "b"):
        fake_wal(root / db / "wal", applied=1, sealed=1)
    instance = dg.DagsterInstance.ephemeral()
    first = tick(instance, root, None)
    sealed_a = seal_next(root / "a" / "wal")
    lost = tick(instance, root, first.cursor)  # its cursor is never stored
    assert requested(lost) == [f"a.{segment_name(sealed_a)}"]
    assert read_journal(journal_dir(root)) == ()  # the marker is gone with it
    retried = tick(instance, root, first.cursor)
    assert [r.run_key for r in retried.run_requests] == [r.run_key for r in lost.run_requests]
    lost_again = tick(instance, root, first.cursor)  # lost twice: still the same request, once
    assert [r.run_key for r in lost_again.run_requests] == [r.run_key for r in lost.run_requests]
    stored = lost_again.cursor
    age(root / "a" / "wal")
    after = tick(instance, root, stored)  # once a cursor is stored, nothing is requested twice
    assert after.run_requests == []
    assert tick(instance, root, after.cursor).run_requests == []


def test_the_resource_field_sets_the_full_scan_interval_through_an_env_var(tmp_path, monkeypatch):
    root = tmp_path / "data"
    fake_wal(root / "db" / "wal", applied=1, sealed=1)
    history = HistoryRootResource(root=str(root), s3=S3Settings(),
                                  sensor_full_scan_every=dg.EnvVar.int("TEST_SENSOR_FULL_SCAN_EVERY"))
    instance = dg.DagsterInstance.ephemeral()

    def scans(cursor):
        resources = {"history": history, "spark": SparkResource()}
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
            result = finished_wal_segments_sensor(context)
        return SensorCursor.from_json(result.cursor).since_full_scan == 0, result.cursor

    monkeypatch.setenv("TEST_SENSOR_FULL_SCAN_EVERY", "1")
    full, cursor = scans(None)
    assert full and scans(cursor)[0]  # every tick
    monkeypatch.setenv("TEST_SENSOR_FULL_SCAN_EVERY", "2")
    assert [scans(cursor)[0], scans(scans(cursor)[1])[0]] == [False, True]
    monkeypatch.setenv("TEST_SENSOR_FULL_SCAN_EVERY", "0")
    with pytest.raises(HistoryError, match="sensor_full_scan_every=0"):
        scans(cursor)


def test_the_marks_stores_steady_queries_do_not_grow_with_the_number_of_databases(tmp_path):
    """Counted in SQLite virtual-machine steps (its progress handler): a steady tick's queries
    (epoch, pending, blocked, the named marks) cost the same over 100 and over 20,000 databases."""
    def steps(databases: int) -> int:
        path = marks_path(tmp_path / str(databases))
        with MarksStore.open(path) as store:
            store.start_epoch("e")
            settled = DatabaseMark(OLD, (SegmentMark(1, 1, False, True),))
            store.write("e", 0, {f"db{n:05d}": settled for n in range(databases)})
            store.write("e", 1, {"db00042": DatabaseMark(None, (SegmentMark(1, 1, True, False),))})
        with MarksStore.open(path) as store:
            counted = [0]

            def count() -> int:
                counted[0] += 1
                return 0  # (go on)

            store._db.set_progress_handler(count, 1)
            assert store.has_epoch("e") and store.pending("e", 2) == ["db00042"]
            assert store.read("e", 2, ["db00042", "db00007"])["db00007"] == settled
            assert store.blocked("e", NAMED_IN_SKIP) == BlockedSummary(1, 0, (("db00042", 1),))
            return counted[0]

    small, large = steps(100), steps(20_000)
    assert large <= small * 1.2, (small, large)
