"""Erasure: erased keys vanish from every answer, file and tier; nothing else changes.

The property runs random histories through compaction, merge and retention (with a cold
tier), erases random keys of one table, and compares every query API at every answerable
T with the model fed the same history without those keys, also after the remaining
segments are compacted, a load-back and a rebuild. Other tests crash an erasure at each
step, search every byte under the root, the WAL and the S3 cold tier for an erased value,
and run the console command.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import time
from datetime import timedelta

import boto3
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog import RecordErasure
from history_pipeline.compaction.compactor import CompactionSummary, compact_segment
from history_pipeline.errors import HistoryError, PurgedTimestampError, TransactionNotFoundError
from history_pipeline.io.store import open_store
from history_pipeline.maintenance import erasure as erasure_module
from history_pipeline.maintenance.erasure import ErasureInputError, ErasureRequest
from history_pipeline.maintenance.export import list_exports, load_export
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import read_segment
from history_pipeline_tests.cli_support import run_command
from history_pipeline_tests.model import BaseDatabase
from history_pipeline_tests.test_compaction import _split, random_history, write
from history_pipeline_tests.test_maintenance_properties import check

ROW_OPS = ("insert", "update", "delete")

#: hypothesis examples per run (HP_EXAMPLES=60 for a longer search)
EXAMPLES = int(os.environ.get("HP_EXAMPLES", "5"))


def _without(events, table_uuid, keys):
    return [e for e in events if not (e["op"] in ROW_OPS and e["table_uuid"] == table_uuid and e["key"] in keys)]


def _keys_of(events, table_uuid):
    return sorted({e["key"] for e in events if e["op"] in ROW_OPS and e["table_uuid"] == table_uuid})


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), maintenance=st.sampled_from(["none", "merge", "retain", "retain_merge", "snapshot",
                                           "snapshot_merge_retain"]),
       applied_before=st.integers(1, 4))
def test_erasure_removes_exactly_the_erased_keys_from_every_answer(tmp_path_factory, seed, maintenance,
                                                                   applied_before):
    root = tmp_path_factory.mktemp("erase")
    rng = random.Random(seed)
    events = random_history(seed, n_events=16)
    segments = _split(events, rng)
    store = HistoryStore.open(root / "root", database="db")
    cold_uri = str(root / "cold")
    write(store, *segments)
    pending = store.segments()
    applied_count = min(applied_before, len(pending))
    for ref in pending[:applied_count]:
        compact_segment(store, ref, None, CompactionSummary())
    if "snapshot" in maintenance:  # two snapshots: the interval between them is closed
        for ref in pending[applied_count:applied_count + 1]:
            store.refresh_snapshots(force=True, spark=False)
            compact_segment(store, ref, None, CompactionSummary())
            applied_count += 1
        store.refresh_snapshots(force=True, spark=False)
    if "merge" in maintenance:
        store.merge(spark=False, small_file_bytes=10**9)
    if "retain" in maintenance and store.frontier + 1 > 1:
        store.retain(purge_before=rng.randint(1, store.frontier + 1), cold_tier=cold_uri, spark=False)
    store.export(as_of=store.frontier + 1, to=cold_uri)
    tables = sorted({e.table_uuid for e in store.catalog_state().schema_history})  # known to the catalog
    table = rng.choice(tables)
    keys = _keys_of(events, table)
    erased = set(rng.sample(keys, rng.randint(1, len(keys)))) if keys else {10**6}
    summary = store.erase(table, sorted(erased), requested_by="dpo", reason="test", spark=False)
    assert summary.key_count == len(erased)

    def expect(applied_segments):
        model = BaseDatabase()
        applied = _without([e for batch in applied_segments for e in batch], table, erased)
        for e in applied:
            model.apply(e)
        check(store, model, applied)
        for key in erased:
            assert store.row_history(table, key) == []
            for as_of in range(store.earliest, store.frontier + 2):
                if any(d.table_uuid == table for d in store.get_catalog(as_of)):
                    assert store.fetch_row(table, key, as_of) is None

    expect(segments[:applied_count])
    export_as_of = list_exports(open_store(cold_uri), "db")[-1]
    names = [d.table_name for d in store.get_catalog(export_as_of) if d.table_uuid == table]
    exported = load_export(open_store(cold_uri), "db", export_as_of)
    for name in names:  # the erased table's export holds none of the keys, the others are untouched
        assert not set(exported[name].column("synthetic_key").to_pylist()) & erased
    store.compact(spark=False)  # the rest of the WAL: masked, so the erased keys never come back
    expect(segments)
    if store.earliest > 0:
        store.load_cold_tier(cold_uri)
        expect(segments)
    store.rebuild_catalog()
    expect(segments)


T = "tbl"
SECRET = "ERASE-ME-7f3a9c51-unique-personal-data"
COLS = [{"column_uuid": "c", "column_name": "v", "data_type": "INTEGER"},
        {"column_uuid": "n", "column_name": "name", "data_type": "TEXT"}]


def _history(store, secret=SECRET):
    """Key 2 carries the secret in every version; keys 1 and 3 are other people."""
    write(
        store,
        [
            {"op": "create_table", "t": 1, "table_uuid": T, "table_name": "people", "columns": COLS},
            {"op": "insert", "t": 2, "table_uuid": T, "key": 1, "values": {"c": 10, "n": "alice"}},
            {"op": "insert", "t": 2, "table_uuid": T, "key": 2, "values": {"c": 20, "n": secret}},
            {"op": "add_column", "t": 3, "table_uuid": T, "default": 7,
             "column": {"column_uuid": "d", "column_name": "w", "data_type": "INTEGER"}},
        ],
        [
            {"op": "update", "t": 5, "table_uuid": T, "key": 2, "values": {"c": 21, "n": secret + "-2"}},
            {"op": "insert", "t": 6, "table_uuid": T, "key": 3, "values": {"c": 30, "n": "carol"}},
        ],
        [
            {"op": "update", "t": 8, "table_uuid": T, "key": 1, "values": {"c": 11}},
            {"op": "update", "t": 9, "table_uuid": T, "key": 2, "values": {"c": 22}},
        ],
    )


def _answers(store, keys=(1, 3)):
    out = {}
    for as_of in range(max(store.earliest, 2), store.frontier + 2):
        out[as_of] = {
            "table": [r for r in store.load_table("people", as_of).to_pylist() if r["synthetic_key"] in keys],
            "rows": [store.fetch_row("people", k, as_of) for k in keys],
            "sql": store.sql("SELECT * FROM people WHERE synthetic_key IN (1, 3) ORDER BY 1", as_of).to_pylist(),
        }
    out["history"] = [store.row_history("people", k) for k in keys]
    return out


def _gone(store, key=2):
    for as_of in range(store.earliest, store.frontier + 2):
        if as_of >= 2:
            assert key not in store.load_table("people", as_of).column("synthetic_key").to_pylist()
            assert store.fetch_row("people", key, as_of) is None
            assert store.sql(f"SELECT count(*) AS n FROM people WHERE synthetic_key = {key}",
                             as_of).to_pylist() == [{"n": 0}]
    assert store.row_history("people", key) == []
    for as_of in range(max(store.earliest, 2), store.frontier + 2):
        changes = store.diff("people", store.earliest, as_of)
        assert key not in [c["key"] for kind in changes.values() for c in kind]


class Crash(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("step", ["wal_masked", "files_written", "committed", "cold_tier_written"])
def test_a_crashed_erasure_leaves_a_recoverable_state_and_running_it_again_finishes(tmp_path, step):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    full = _answers(store)
    cold = str(tmp_path / "cold")
    store.retain(purge_before=4, cold_tier=cold, spark=False)
    store.export(as_of=store.frontier + 1, to=cold)
    before = _answers(store)

    def hook(name):
        if name == step:
            raise Crash(name)

    request = ErasureRequest(T, (2,), "dpo", "ticket 1", (open_store(cold),))
    with pytest.raises(Crash):
        erasure_module.erase(store, request, on_step=hook)
    assert _answers(store) == before  # whatever the step: nobody else's answer changed
    assert store.verify() == []
    for ref in store.segments():
        read_segment(ref)  # every segment still verifies (masked ones were re-sealed)
    store.erase("people", [2], requested_by="dpo", reason="ticket 1", spark=False)
    _gone(store)
    assert _answers(store) == before
    assert store.verify() == []
    store.load_cold_tier(cold)
    _gone(store)
    assert _answers(store) == full  # the purged history of everyone else is back, exactly


def _bytes_contain(data: bytes, secret: str) -> bool:
    if secret.encode() in data:
        return True
    if data[:4] == b"PAR1":  # compressed pages hide text from a raw search: read the values too
        table = pq.read_table(io.BytesIO(data))
        return secret in json.dumps(table.to_pylist(), default=str)
    return False


def test_after_erase_and_cleanup_no_file_anywhere_holds_an_erased_value(tmp_path, s3_bucket, s3_options):
    store = HistoryStore.open(tmp_path / "root", database="db", s3=s3_options)
    _history(store)
    store.compact(spark=False)
    store.merge(spark=False, small_file_bytes=10**9)
    store.retain(purge_before=6, cold_tier=s3_bucket, spark=False)  # key 2's first versions go to S3
    store.export(as_of=7, to=s3_bucket)
    with store.wal_writer() as wal:  # a pending segment and an open one hold the key too
        wal.append({"op": "update", "t": 11, "table_uuid": T, "key": 2, "values": {"n": SECRET + "-3"}})
        wal.append({"op": "close", "t": 11})
        wal.seal()
        wal.append({"op": "update", "t": 12, "table_uuid": T, "key": 2, "values": {"n": SECRET + "-4"}})
        wal.append({"op": "close", "t": 12})
    before = _answers(store)

    bucket, prefix = s3_bucket[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=s3_options.endpoint_url, region_name=s3_options.region,
                          aws_access_key_id="test", aws_secret_access_key="test")

    def holders():
        found = [str(p) for p in (tmp_path / "root").rglob("*") if p.is_file() and _bytes_contain(p.read_bytes(),
                                                                                                   SECRET)]
        for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
            if _bytes_contain(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read(), SECRET):
                found.append("s3://" + obj["Key"])
        return found

    assert len(holders()) >= 5  # the search finds it where it is: WAL, warehouse, cold tier, export
    summary = store.erase("people", [2], requested_by="dpo", reason="GDPR art. 17", spark=False)
    assert summary.wal_files_masked >= 3 and summary.cold_files_rewritten >= 1 and summary.export_files_rewritten == 1
    store.cleanup(grace=timedelta(0))
    assert holders() == []
    assert _answers(store) == before
    _gone(store)
    store.compact(spark=False)  # the masked pending segment still applies (key 2's event is gone)
    _gone(store)
    assert store.verify() == []
    exported = load_export(open_store(s3_bucket, s3_options), "db", 7)["people"]
    assert exported.column("synthetic_key").to_pylist() == [1, 3]
    assert store.load_cold_tier(s3_bucket) == 0
    _gone(store)
    assert holders() == []


def test_the_record_says_who_when_why_and_how_many_but_not_which_or_what(tmp_path):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    summary = store.erase(T, [2, 2, 987654321], requested_by="dpo@example.com", reason="ticket 42", spark=False)
    txn = store.catalog.read_transaction(summary.txn_id)
    [record] = [a for a in txn.actions if isinstance(a, RecordErasure)]
    assert (record.table_uuid, record.key_count, record.requested_by, record.reason) == (T, 2, "dpo@example.com",
                                                                                         "ticket 42")
    assert record.keys_sha256 == erasure_module.keys_digest(T, [2, 987654321]) and record.files_rewritten >= 1
    stored = store.objects.get(store.catalog.transaction_path(summary.txn_id))
    assert b"987654321" not in stored and SECRET.encode() not in stored
    assert store.history(limit=1)[0].operation.startswith("erase 2 key(s)")
    with pytest.raises(ErasureInputError, match="64-bit integers"):
        store.erase(T, ["2"], requested_by="dpo")
    with pytest.raises(ErasureInputError, match="who requested"):
        store.erase(T, [1], requested_by=" ")
    with pytest.raises(HistoryError, match="no table 'nope'"):
        store.erase("nope", [1], requested_by="dpo")


@pytest.mark.slow
def test_rebuild_and_load_back_never_bring_erased_keys_back_and_purge_now_ends_time_travel(tmp_path):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    cold = str(tmp_path / "cold")
    store.retain(purge_before=6, cold_tier=cold, spark=False)
    before = _answers(store)
    old_txn = store.catalog_state().txn_id
    store.erase("people", [2], requested_by="dpo", spark=False)  # old files stay as tombstones (grace)
    assert store.catalog.state_at(old_txn).files  # time travel still reads the old state in the grace period
    store.rebuild_catalog()
    _gone(store)
    assert _answers(store) == before
    store.load_cold_tier(cold)
    _gone(store)
    store.rebuild_catalog()
    _gone(store)
    store.merge(spark=False, small_file_bytes=10**9)
    old_txn = store.catalog_state().txn_id
    assert store.catalog.state_at(old_txn).files
    summary = store.erase("people", [3], requested_by="dpo", spark=False, purge_now=True)
    assert summary.files_deleted >= 1
    with pytest.raises(TransactionNotFoundError, match="pruned"):
        store.catalog.state_at(old_txn)
    assert store.fetch_row("people", 3, store.frontier + 1) is None
    assert store.fetch_row("people", 1, store.frontier + 1) == {"v": 11, "name": "alice", "w": 7}
    assert store.verify() == []


def test_cli_erase(tmp_path, spark):  # the erasure runs on the test run's session
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)

    def run(*args):
        return run_command(["--root", str(tmp_path / "root"), "--database", "db", *args])

    done = run("erase", "people", "2", "--by", "dpo", "--reason", "ticket 7", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["key_count"] == 1
    reopened = HistoryStore.open(tmp_path / "root", database="db")
    assert reopened.fetch_row("people", 2, 3) is None and reopened.fetch_row("people", 1, 3) is not None
    missing_by = run("erase", "people", "2")
    assert missing_by.returncode == 2 and "--by" in missing_by.stderr  # argparse's usage error
    for args, message in [(("erase", "nope", "1", "--by", "x"), "no table 'nope'"),
                          (("erase", "people", "1", "--by", " "), "who requested")]:
        failed = run(*args)
        assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and message in failed.stderr, failed.stderr


def test_erasure_job_erases_through_the_store(tmp_path):
    from history_pipeline.orchestration.definitions import defs
    from history_pipeline.orchestration.erasure import erasure_job
    from history_pipeline.orchestration.resources import SparkResource, history_root

    assert defs.resolve_job_def("erasure_job")
    store = HistoryStore.open(tmp_path / "data", database="db")
    _history(store)
    store.compact(spark=False)
    before = _answers(store)
    run = erasure_job.execute_in_process(
        resources={"history": history_root(str(tmp_path / "data")), "spark": SparkResource(enabled=False)},
        run_config={"ops": {"erase_op": {"config": {"database": "db", "table": "people", "keys": [2],
                                                    "requested_by": "dpo", "reason": "ticket 9"}}}},
    )
    assert run.success
    assert run.output_for_node("erase_op")["files_rewritten"] >= 1
    _gone(store)
    assert _answers(store) == before
    [record] = [a for a in store.catalog.read_transaction(store.catalog_state().txn_id).actions
                if isinstance(a, RecordErasure)]
    assert (record.requested_by, record.reason) == ("dpo", "ticket 9")


# --- per-table time-to-live -----------------------------------------------------------------


def _all_answers(store, table_uuid, low):
    out = {}
    for as_of in range(low, store.frontier + 2):
        names = [d.table_name for d in store.get_catalog(as_of) if d.table_uuid == table_uuid]
        if names:
            out[as_of] = (store.load_table(names[0], as_of, ordered=True).to_pylist(),
                          store.sql(f'SELECT * FROM "{names[0]}" ORDER BY 1', as_of).to_pylist())
    return out


@pytest.mark.parametrize("seed", [3, 17, 4242])
def test_ttl_purges_one_table_like_retention_and_leaves_the_others_alone(tmp_path, seed):
    events = random_history(seed, n_events=30)
    store = HistoryStore.open(tmp_path / "root", database="db")
    write(store, *_split(events, random.Random(seed)))
    store.compact(spark=False)
    tables = sorted({e.table_uuid for e in store.catalog_state().schema_history})
    target = random.Random(seed).choice(tables)
    before = {t: _all_answers(store, t, 0) for t in tables}
    ttl = max(1, (store.frontier + 1) // 2)
    store.set_ttl(target, ttl)
    assert store.ttls() == {target: ttl}
    summary = store.apply_ttl(spark=False)
    point = store.frontier + 1 - ttl
    assert summary.purged == {target: point} and store.earliest_of(target) == point and store.earliest == 0
    for table_uuid in tables:
        low = point if table_uuid == target else 0
        after = _all_answers(store, table_uuid, low)
        assert after == {t: a for t, a in before[table_uuid].items() if t >= low}, table_uuid
    named_below = [(d.table_name, t) for t in range(point) for d in store.get_catalog(t) if d.table_uuid == target]
    assert named_below or seed != 3  # seed 3 has the table below its purge point, so the error is checked
    for name, as_of in named_below[-1:]:
        with pytest.raises(PurgedTimestampError, match=f"purge point of table '{name}'"):
            store.load_table(name, as_of)
        with pytest.raises(PurgedTimestampError):
            store.sql(f'SELECT count(*) FROM "{name}"', as_of)
    assert store.verify() == []
    store.rebuild_catalog()
    assert store.earliest_of(target) == point and store.ttls() == {target: ttl}
    assert _all_answers(store, target, point) == {t: a for t, a in before[target].items() if t >= point}
    assert store.apply_ttl(spark=False).purged == {}  # nothing new below the frontier: nothing to do
    store.set_ttl(target, 1)  # retention applies TTLs too, after its own purge point
    assert store.retain(purge_before=1, spark=False).ttl_purged == {target: store.frontier}
    assert store.earliest_of(target) == store.frontier and store.earliest == 1
    with pytest.raises(HistoryError, match="positive number"):
        store.set_ttl(target, 0)


def test_cli_ttl(tmp_path, spark):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    done = run_command(["--root", str(tmp_path / "root"), "--database", "db", "ttl", "people", "4", "--apply"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["purged"] == {T: store.frontier + 1 - 4}
    bad = run_command(["--root", str(tmp_path / "root"), "--database", "db", "ttl", "people", "-1"])
    assert bad.returncode == 1 and "positive number" in bad.stderr.splitlines()[-1]


@pytest.mark.spark
def test_a_compaction_racing_an_erasure_commits_nothing_and_its_rerun_has_no_erased_key(tmp_path):
    """The compaction read its segment before the erasure masked it: committing would bring the
    erased key back, so the commit is refused and the rerun reads the masked segment."""
    store = HistoryStore.open(tmp_path, database="db")
    columns = [{"column_uuid": "v", "column_name": "v", "data_type": "TEXT"}]
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": columns},
        {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"v": "erase me"}},
    ], [
        {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"v": "erase me too"}},
        {"op": "insert", "t": 3, "table_uuid": "T", "key": 2, "values": {"v": "keep"}},
    ])
    first, second = store.segments()
    compact_segment(store, first, None, CompactionSummary())

    def erase_meanwhile(step):
        if step == "files_written":
            store.erase("t", [1], requested_by="test")

    with pytest.raises(HistoryError, match="changed while it was compacted"):
        compact_segment(store, second, None, CompactionSummary(), on_step=erase_meanwhile)
    assert 2 not in {r["synthetic_key"] for r in store.load_table("t", store.frontier + 1).to_pylist()}
    store.compact(spark=False)
    for as_of in range(2, store.frontier + 2):
        assert store.fetch_row("t", 1, as_of) is None
    assert store.row_history("t", 1) == []
    assert store.load_table("t", 4).to_pylist() == [{"synthetic_key": 2, "v": "keep"}]


@pytest.mark.spark
def test_a_quarantine_reason_quoting_an_erased_value_is_redacted(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    columns = [{"column_uuid": "v", "column_name": "v", "data_type": "INTEGER"}]
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": columns},
        {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"v": 1}},
    ], [
        {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"v": "SECRET-XYZ"}},  # not an integer
    ])
    with pytest.raises(HistoryError):
        store.compact(spark=False)
    reasons = list(store.wal_dir.rglob("*.error.json"))
    assert reasons and "SECRET-XYZ" in reasons[0].read_text()  # the reason quotes the value
    store.erase("t", [1], requested_by="test")
    reason = json.loads(reasons[0].read_text())
    assert "SECRET-XYZ" not in json.dumps(reason) and reason["line"] is None and "redacted" in reason["error"]
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and b"SECRET-XYZ" in p.read_bytes()]


def _quarantined_then_repaired(store, secret="SECRET-XYZ"):
    """Key 1's value is not an integer: its segment is quarantined (the reason quotes the value),
    then repaired with corrected events that keep key 1 (an audit copy keeps the original)."""
    columns = [{"column_uuid": "v", "column_name": "v", "data_type": "INTEGER"}]
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": columns},
        {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"v": 1}},
        {"op": "insert", "t": 2, "table_uuid": "T", "key": 2, "values": {"v": 2}},
    ], [
        {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"v": secret}},  # not an integer
    ])
    with pytest.raises(HistoryError):
        store.compact(spark=False)
    [ref] = [r for r in store.segments() if r.state.value == "quarantined"]
    fix = store.wal_dir.parent / "fix.jsonl"
    fix.write_text(json.dumps({"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"v": 3}}) + "\n")
    record = store.repair_segment(ref.segment_id, fix, reason="ticket 7: bad value from the app")
    fix.unlink()
    assert secret in (record.quarantine_error or "")
    store.compact(spark=False)


def test_an_erased_value_quoted_by_a_repaired_segments_audit_records_is_redacted(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    _quarantined_then_repaired(store)
    [audit] = [p for p in (store.wal_dir / "audit").iterdir()]
    assert b"SECRET-XYZ" in (audit / "error.json").read_bytes()
    assert b"SECRET-XYZ" in (audit / "repair.json").read_bytes()
    store.erase("t", [1], requested_by="dpo", purge_now=True, spark=False)
    store.cleanup(grace=timedelta(0))
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and b"SECRET-XYZ" in p.read_bytes()]
    [repair] = store.repairs()
    assert repair.quarantine_error is not None and "redacted" in repair.quarantine_error
    assert repair.reason == "ticket 7: bad value from the app"  # the operator's words stay
    assert json.loads((audit / "error.json").read_text())["line"] is None
    assert store.load_table("t", store.frontier + 1).to_pylist() == [{"synthetic_key": 2, "v": 2}]


def _leave_temporaries(store, root, age_s):
    """Temporary files as crashed writers leave them (a commit's, a masking's, a redaction's), naming
    an erased key, last written ``age_s`` ago; returns their paths."""
    left = [root / "db" / "_catalog" / "transactions" / f".{9:020d}.json.{'ab' * 16}.tmp",
            store.wal_dir / "segments" / f".{3:020d}.sealed.mask.tmp",
            store.wal_dir / "quarantine" / f".{3:020d}.error.json.tmp"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"key": 2, "values": {"n": "' + SECRET + '"}}')
        os.utime(path, (time.time() - age_s,) * 2)
    return left


def test_cleanup_removes_the_temporary_files_interrupted_writes_left_but_not_one_in_flight(tmp_path):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    crashed = _leave_temporaries(store, tmp_path / "root", age_s=3600)
    in_flight = crashed[0].with_name(f".{10:020d}.json.{'cd' * 16}.tmp")
    in_flight.write_text("a write in flight")
    assert store.objects.list("db/_catalog/transactions/") and not [
        o for o in store.objects.list("db/") if ".tmp" in o.path]  # the listing never shows them
    report = store.cleanup(grace=timedelta(0))
    assert not [p for p in crashed if p.exists()] and len(report.temporaries_deleted) >= len(crashed)
    assert in_flight.exists()  # last written just now: its writer may still rename it into place
    assert store.verify() == []


def test_a_purge_now_removes_what_an_earlier_crashed_purge_left(tmp_path):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    crashed = _leave_temporaries(store, tmp_path / "root", age_s=3600)
    store.erase("people", [2], requested_by="dpo", purge_now=True, spark=False)
    assert not [p for p in crashed if p.exists()]
    assert not [p for p in (tmp_path / "root").rglob("*") if p.is_file() and _holds(p.read_bytes(), SECRET)]


@pytest.mark.s3
def test_cleanup_removes_leftover_temporaries_and_unfinished_uploads_on_s3(tmp_path, s3_bucket, s3_options,
                                                                           monkeypatch):
    import history_pipeline.store as store_module

    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options)
    _history(store)
    store.compact(spark=False)
    store.objects.put("db/_catalog/transactions/.00000000000000000009.json.0123.tmp", SECRET.encode())
    bucket, prefix = s3_bucket[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=s3_options.endpoint_url, region_name=s3_options.region,
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/db/tables/T/part.parquet")
    wal_temps = [str(p) for p in _leave_temporaries(store, tmp_path / "unused", age_s=3600)[1:]]
    report = store.cleanup(grace=timedelta(0))
    assert set(wal_temps) <= set(report.temporaries_deleted)
    assert store.objects.exists("db/_catalog/transactions/.00000000000000000009.json.0123.tmp")  # new: kept
    later = time.time() + 3600
    monkeypatch.setattr(store_module, "now", lambda: later)
    report = store.cleanup(grace=timedelta(0))
    assert "db/_catalog/transactions/.00000000000000000009.json.0123.tmp" in report.temporaries_deleted
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")  # (moto dates every upload 2010)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    assert keys and not [k for k in keys if k.endswith(".tmp")]


def test_the_erasure_ledger_outlives_log_pruning_even_after_a_crash_before_its_entry(tmp_path, monkeypatch):
    import history_pipeline.catalog.log as log_module
    from history_pipeline.catalog.ledger import erasures_of

    store = HistoryStore.open(tmp_path / "root", database="db", settings=StoreSettings(checkpoint_interval=2))
    _history(store)
    store.compact(spark=False)
    first = store.erase("people", [2, 987654321], requested_by="dpo@example.com", reason="ticket 42", spark=False)
    real = log_module.write_entries

    def crash(store_, prefix, txn):
        if erasures_of(txn):
            raise Crash("after the commit, before its ledger entry")
        return real(store_, prefix, txn)

    monkeypatch.setattr(log_module, "write_entries", crash)
    with pytest.raises(Crash):
        store.erase("people", [3], requested_by="dpo", reason="ticket 43", spark=False)
    monkeypatch.setattr(log_module, "write_entries", real)
    store.compact(spark=False)
    store.cleanup(grace=timedelta(0))
    store.cleanup(grace=timedelta(0))
    assert store.catalog.earliest_retained() > first.txn_id + 1  # the log no longer holds either erasure
    assert not [a for i in store.catalog.transaction_ids() for a in store.catalog.read_transaction(i).actions
                if isinstance(a, RecordErasure)]
    ledger = store.erasures()
    assert [(e.txn_id, e.table_uuid, e.key_count, e.keys_found, e.requested_by, e.reason) for e in ledger] == [
        (first.txn_id, T, 2, 1, "dpo@example.com", "ticket 42"), (first.txn_id + 1, T, 1, 1, "dpo", "ticket 43")]
    assert ledger[0].keys_sha256 == erasure_module.keys_digest(T, [2, 987654321])
    kept = b"".join(store.objects.get(o.path) for o in store.objects.list("db/_history_catalog/erasures/"))
    assert b"987654321" not in kept and SECRET.encode() not in kept and b"carol" not in kept
    shown = run_command(["--root", str(tmp_path / "root"), "--database", "db", "erasures", "--format", "json"])
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["version"], r["keys"], r["requested_by"]) for r in rows] == [
        (first.txn_id, 2, "dpo@example.com"), (first.txn_id + 1, 1, "dpo")]


def test_erasing_keys_that_nothing_holds_says_so_and_counts_what_was_found(tmp_path):
    from history_pipeline import NothingToEraseWarning

    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    before = _answers(store, keys=(1, 2, 3))
    with pytest.warns(NothingToEraseWarning, match="1 of the 1 key"):
        summary = store.erase("people", [424242], requested_by="dpo", spark=False)
    assert (summary.keys_found, summary.files_rewritten, summary.places) == (0, 0, [])
    assert "changed no file" in summary.warnings[0]
    with pytest.warns(NothingToEraseWarning, match="1 of the 2 key"):
        summary = store.erase("people", [3, 434343], requested_by="dpo", spark=False)
    assert summary.keys_found == 1 and summary.files_rewritten >= 1
    assert [e.keys_found for e in store.erasures()] == [0, 1]
    assert store.fetch_row("people", 2, store.frontier + 1) == before[store.frontier + 1]["rows"][1]  # untouched
    shown = run_command(["--root", str(tmp_path / "root"), "--database", "db", "erase", "people", "555",
                         "--by", "dpo", "--dry-run", "--format", "json"])
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["keys_found"] == 0
    assert shown.stderr.startswith("warning: 1 of the 1 key(s)") and shown.stderr.count("\n") == 1


def _every_file(root, client=None, bucket_prefix=None):
    """{path: bytes} of every file under the local folders ``root`` and the S3 prefix."""
    found = {str(p): p.read_bytes() for folder in root for p in sorted(folder.rglob("*")) if p.is_file()}
    if client is not None:
        bucket, prefix = bucket_prefix
        for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
            found["s3://" + obj["Key"]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return found


def test_a_dry_run_changes_nothing_and_names_every_place_the_erasure_then_changes(tmp_path):
    store = HistoryStore.open(tmp_path / "root", database="db")
    _history(store)
    store.compact(spark=False)
    store.merge(spark=False, small_file_bytes=10**9)  # the merged files' originals are tombstones holding key 2
    cold = str(tmp_path / "cold")
    store.retain(purge_before=6, cold_tier=cold, spark=False)
    store.export(as_of=7, to=cold)
    with store.wal_writer() as wal:  # a pending segment holds the key too
        wal.append({"op": "update", "t": 11, "table_uuid": T, "key": 2, "values": {"n": SECRET + "-3"}})
        wal.append({"op": "close", "t": 11})
        wal.seal()
    files = _every_file([tmp_path])
    plan = store.erase("people", [2, 99], requested_by="dpo", spark=False, purge_now=True, dry_run=True)
    assert _every_file([tmp_path]) == files  # not one byte changed, nothing added or removed
    assert plan.dry_run and plan.txn_id is None and plan.keys_found == 1 and plan.warnings
    tiers = {p.tier for p in plan.places}
    assert {"warehouse", "tombstone", "wal", "cold tier", "export"} <= tiers, plan.places
    assert all(p.count > 0 for p in plan.places if p.tier != "audit")
    done = store.erase("people", [2, 99], requested_by="dpo", spark=False, purge_now=True)
    assert sorted(map(repr, done.places)) == sorted(map(repr, plan.places))
    for name in ("files_rewritten", "versions_removed", "wal_files_masked", "wal_events_removed",
                 "cold_files_rewritten", "export_files_rewritten", "keys_found"):
        assert getattr(done, name) == getattr(plan, name), name
    assert done.files_deleted >= plan.files_rewritten
    _gone(store)


def _holds(data: bytes, secret: str) -> bool:
    """Does a file hold ``secret``: in its bytes, or (Parquet, whose pages are compressed) in any value,
    column name or key-value metadata once decoded?"""
    if secret.encode() in data:
        return True
    if data[:4] == b"PAR1" and data[-4:] == b"PAR1":
        table = pq.read_table(io.BytesIO(data))
        decoded = json.dumps([table.to_pylist(), table.schema.to_string(show_schema_metadata=True),
                              {k.decode(): v.decode(errors="replace")
                               for k, v in (pq.read_metadata(io.BytesIO(data)).metadata or {}).items()}],
                             default=str)
        return secret in decoded
    return False


@pytest.mark.s3
@pytest.mark.parametrize("where", ["local", "s3"])
def test_after_erase_and_cleanup_not_one_byte_of_an_erased_value_is_left_under_the_root(
        tmp_path, where, s3_bucket, s3_options, monkeypatch):
    """Quarantine and repair, snapshots, merge, retention to a cold tier, an export, pending and open
    segments and a purge that crashed halfway (on a local root; on an S3 root the erasure rewrites the
    files on S3 and purges them at once): afterwards every file under the root, the WAL, the cold tier
    and the S3 prefix is searched for the erased values, byte by byte and Parquet decoded."""
    import history_pipeline.io.store as io_store
    import history_pipeline.store as store_module

    root = s3_bucket if where == "s3" else str(tmp_path / "root")
    cold = str(tmp_path / "cold") if where == "s3" else s3_bucket.replace("/warehouse", "/cold")
    store = HistoryStore.open(root, database="db", wal_dir=tmp_path / "wal" if where == "s3" else None, s3=s3_options)
    _history(store)
    write(store, [{"op": "update", "t": 10, "table_uuid": T, "key": 2, "values": {"c": SECRET + "-q"}}])
    with pytest.raises(HistoryError):
        store.compact(spark=False)  # quarantined: the reason quotes the value
    [ref] = store.segments(SegmentState.QUARANTINED)
    fix = tmp_path / "fix.jsonl"
    fix.write_text(json.dumps({"op": "update", "t": 10, "table_uuid": T, "key": 2,
                               "values": {"c": 23, "n": SECRET + "-r"}}) + "\n")
    store.repair_segment(ref.segment_id, fix, reason="app bug: sent " + SECRET + "-q as c")
    fix.unlink()
    store.compact(spark=False)
    store.refresh_snapshots(force=True, spark=False)
    store.merge(spark=False, small_file_bytes=10**9)
    store.retain(purge_before=6, cold_tier=cold, s3=s3_options, spark=False)
    store.export(as_of=8, to=cold, s3=s3_options)
    with store.wal_writer() as wal:  # a pending segment and an open one hold the key too
        wal.append({"op": "update", "t": 12, "table_uuid": T, "key": 2, "values": {"n": SECRET + "-3"}})
        wal.append({"op": "close", "t": 12})
        wal.seal()
        wal.append({"op": "update", "t": 13, "table_uuid": T, "key": 2, "values": {"n": SECRET + "-4"}})
        wal.append({"op": "close", "t": 13})
    before = _answers(store)
    client = boto3.client("s3", endpoint_url=s3_options.endpoint_url, region_name=s3_options.region,
                          aws_access_key_id="test", aws_secret_access_key="test")
    bucket = s3_bucket[len("s3://"):].split("/", 1)[0]
    if where == "s3":  # a write to the root that never finished
        upload = client.create_multipart_upload(Bucket=bucket, Key="warehouse/db/tables/T/crashed.parquet")
        client.upload_part(Bucket=bucket, Key="warehouse/db/tables/T/crashed.parquet", PartNumber=1,
                           UploadId=upload["UploadId"], Body=SECRET.encode())

    def holders():
        files = _every_file([tmp_path], client, (bucket, ""))
        return sorted(path for path, data in files.items() if _holds(data, SECRET))

    assert len(holders()) >= 8  # the search finds the value where it is before the erasure
    real_replace = os.replace

    def crash_on_checkpoint(src, dst, *args, **kwargs):  # a crash inside the purge's writes
        if "/checkpoints/" in str(dst):
            raise Crash("during the purge")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(io_store.os, "replace", crash_on_checkpoint)
    with pytest.raises(Crash) if where == "local" else contextlib.nullcontext():
        summary = store.erase("people", [2], requested_by="dpo", reason="GDPR art. 17", purge_now=True, spark=False)
    if where == "s3":  # on an S3 root: the files it replaced, and the older tombstones that may hold the key
        assert summary.files_rewritten >= 1 and summary.files_deleted >= summary.files_rewritten
    monkeypatch.setattr(io_store.os, "replace", real_replace)
    store.erase("people", [2], requested_by="dpo", reason="GDPR art. 17", purge_now=True, spark=False)
    later = time.time() + 3600  # past every grace, the temporary files' too
    monkeypatch.setattr(store_module, "now", lambda: later)
    store.cleanup(grace=timedelta(0))
    assert holders() == []
    left = [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert left == [] and not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert _answers(store) == before
    _gone(store)
    assert store.verify() == []
    [entry] = [e for e in store.erasures() if e.files_rewritten]
    assert (entry.key_count, entry.keys_found, entry.requested_by) == (1, 1, "dpo")


def test_dagster_is_never_shown_a_value_it_would_keep_beyond_an_erasure(tmp_path):
    """Dagster's event log is not under the root: a quarantine's reason (on the failed run, on the
    partition, from the sensor), a compaction's preview and the checks name no value there."""
    import dagster as dg

    from history_pipeline.orchestration.assets import compacted_batches, wal_segments
    from history_pipeline.orchestration.checks import catalog_verifies_check
    from history_pipeline.orchestration.partitions import segment_partitions
    from history_pipeline.orchestration.resources import SparkResource, history_root
    from history_pipeline_tests.test_orchestration import Daemon

    root = tmp_path / "data"
    store = HistoryStore.open(root, database="db")
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": T, "table_name": "people", "columns": COLS},
        {"op": "insert", "t": 2, "table_uuid": T, "key": 1, "values": {"c": 10, "n": SECRET}},
    ], [
        {"op": "update", "t": 3, "table_uuid": T, "key": 1, "values": {"c": SECRET + "-q"}},  # not an INTEGER
    ])
    resources = {"history": history_root(str(root)), "spark": SparkResource(enabled=False)}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000001", "db.00000000000000000002"])
    ok = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                        partition_key="db.00000000000000000001")
    preview = ok.asset_materializations_for_node("compacted_batches")[0].metadata["preview"].value
    assert "| people | 1 |" in preview and SECRET not in preview
    failed = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000002", raise_on_error=False)
    assert not failed.success and store.segments(SegmentState.QUARANTINED)
    error = str(next(e for e in failed.all_events if e.is_step_failure).step_failure_data.error)
    assert "quarantined" in error and "line 2" in error and "<value>" in error and "INTEGER" in error
    daemon = Daemon(root, instance)
    daemon.tick()
    check = catalog_verifies_check(history=history_root(str(root)))
    shown = [dg.serialize_value(entry) for run in instance.get_runs() for entry in instance.all_logs(run.run_id)]
    shown += [dg.serialize_value(record.asset_observation) for key in ("wal_segments", "compacted_batches")
              for record in instance.fetch_observations(dg.AssetKey(key), limit=10).records]
    shown += [str(daemon.tick().skip_reason), str(check.metadata)]
    assert len(shown) > 20 and not check.passed
    assert [s for s in shown if "<value>" in s]  # the reason is shown, without the value
    assert not [s for s in shown if SECRET in s]
    assert SECRET in (store.wal_dir / "quarantine" / "00000000000000000002.error.json").read_text()  # the WAL's own


def test_a_reason_shown_outside_the_wal_withholds_every_value_of_the_failing_event():
    from history_pipeline.wal.segments import without_values

    line = json.dumps({"op": "update", "t": 3, "table_uuid": T, "key": 7,
                       "values": {"c": "12.5e", "n": "Ann O'Neil", "d": 4.25}}).encode()
    error = ("segment 2, line 4: column c (c) of table people: value '12.5e' is not a valid INTEGER; "
             "n was \"Ann O'Neil\"")
    shown = without_values(error, line)
    assert shown == ("segment 2, line 4: column c (c) of table people: value <value> is not a valid INTEGER; "
                     "n was <value>")
    assert without_values("delete of key 7, which does not exist", line) == "delete of key 7, which does not exist"
    assert "12.5e" not in without_values("line 4: unreadable JSON near '12.5e'", b'{"op": "upd 12.5e')
