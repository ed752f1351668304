"""Bad input and broken machines, as a hostile user and a flaky host give them.

Every error is typed (a :class:`HistoryError`), names what is wrong and where, and on the command
line is one ``error:`` line with exit code 1 and no stack trace; nothing already committed is lost,
and an interrupted run leaves a state the next run recovers from, with answers equal to the model.
Compactions here run in-process (``spark=False``): the same tasks Spark runs."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from history_pipeline import HistoryStore
from history_pipeline.compaction import frames
from history_pipeline.errors import HistoryError, MalformedRecordError, SegmentQuarantinedError
from history_pipeline.wal import SegmentState
from history_pipeline_tests.cli_support import run_command

T = "7d6c0c1e-0000-4000-8000-00000000000a"
AMOUNT = "c0000001-0000-4000-8000-00000000000a"
NOTE = "c0000002-0000-4000-8000-00000000000a"
CREATE = {"op": "create_table", "t": 1, "table_uuid": T, "table_name": "orders",
          "columns": [{"column_uuid": AMOUNT, "column_name": "amount", "data_type": "NUMERIC(10,2)"},
                      {"column_uuid": NOTE, "column_name": "note", "data_type": "TEXT"}]}


def insert(t: int, key: int, values: dict) -> dict:
    return {"op": "insert", "t": t, "table_uuid": T, "key": key, "values": values}


def jsonl(events: list) -> str:
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)


def run(root: Path, *args: str, stdin: str | None = None):
    return run_command(["--root", str(root), "--database", "db", *args], stdin)


def one_line_error(result, *texts: str) -> None:
    """Exit code 1, one ``error:`` line naming each of ``texts``, no stack trace, no "unexpected"."""
    assert result.returncode == 1, result
    assert result.stderr.startswith("error: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr, result.stderr
    for text in texts:
        assert text in result.stderr, (text, result.stderr)


def committed_store(root: Path) -> HistoryStore:
    """A database with one committed segment: orders created at 1, key 1 inserted at 2, frontier 2."""
    store = HistoryStore.open(root, database="db")
    with store.wal_writer() as wal:
        for event in [CREATE, insert(2, 1, {AMOUNT: "1.50", NOTE: "kept"}), {"op": "close", "t": 2}]:
            wal.append(event)
        wal.seal()
    store.compact(spark=False)
    assert store.frontier == 2
    return store


def assert_committed_state_intact(store: HistoryStore) -> None:
    assert store.frontier == 2
    assert store.load_table("orders", as_of=3).to_pylist() == [
        {"synthetic_key": 1, "amount": __import__("decimal").Decimal("1.50"), "note": "kept"}]


# --- values that do not fit their type ---------------------------------------------------------


def test_a_numeric_with_a_huge_exponent_quarantines_its_segment_naming_segment_line_and_column(tmp_path):
    """'1e5000' for a NUMERIC(10,2) made the decimal quantize overflow its context: every compaction
    failed with "unexpected InvalidOperation", naming nothing, and the segment was never quarantined."""
    store = committed_store(tmp_path)
    with store.wal_writer() as wal:
        for event in [insert(3, 2, {AMOUNT: "1e5000"}), {"op": "close", "t": 3}]:
            wal.append(event)
        wal.seal()
    failed = run(tmp_path, "compact", "--in-process")
    one_line_error(failed, "segment 00000000000000000002, line 2", "column amount", "table orders",
                   "is not a valid NUMERIC(10,2): needs more than 10 digits")
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED, SegmentState.QUARANTINED]
    assert_committed_state_intact(store)


@pytest.mark.parametrize(("source", "value", "target"), [
    ("NUMERIC", "1e30", "BIGINT"),  # past the decimal context's 28 digits: InvalidOperation
    ("NUMERIC", "1e5000", "INTEGER"),
    ("NUMERIC", "1e5000", "DOUBLE PRECISION"),  # was stored as Infinity (PostgreSQL: out of range)
    ("NUMERIC", "1e-5000", "REAL"),  # was stored as 0 (PostgreSQL: out of range)
])
def test_a_column_type_change_meeting_a_value_out_of_range_is_a_cast_error_at_ingest(tmp_path, source, value,
                                                                                     target):
    store = HistoryStore.open(tmp_path, database="db")
    column = "c0000003-0000-4000-8000-00000000000a"
    events = [{**CREATE, "columns": [{"column_uuid": column, "column_name": "v", "data_type": source}]},
              insert(2, 7, {column: value}),
              {"op": "change_column_type", "t": 3, "table_uuid": T, "column_uuid": column, "data_type": target},
              {"op": "close", "t": 3}]
    with store.wal_writer() as wal:
        for event in events:
            wal.append(event)
        wal.seal()
    with pytest.raises(SegmentQuarantinedError) as caught:
        store.compact(spark=False)
    message = str(caught.value)
    assert "line 4" in message and f"to {target}" in message and "key 7" in message, message
    assert "out of range" in message, message
    assert store.frontier == -1


# --- the WAL writer ------------------------------------------------------------------------


def test_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path):
    """JSON's "\\ud800" escape parses, but UTF-8 cannot hold it: the append checked every line, then
    failed while writing, after the lines before it were written ("unexpected UnicodeEncodeError")."""
    store = committed_store(tmp_path)
    before = {p.name: p.read_bytes() for p in (store.wal_dir / "segments").iterdir()}
    lines = jsonl([insert(3, 2, {NOTE: "fine"}), insert(3, 3, {NOTE: "\ud800"}), {"op": "close", "t": 3}])
    failed = run(tmp_path, "append", "--seal", stdin=lines)
    one_line_error(failed, "<stdin>, line 2", "\\ud800", "nothing was written")
    assert {p.name: p.read_bytes() for p in (store.wal_dir / "segments").iterdir()} == before
    with store.wal_writer() as wal:  # the Python API: typed, and the writer stays usable
        with pytest.raises(MalformedRecordError, match="lone surrogate"):
            wal.append({"op": "create_table", "t": 3, "table_uuid": "7d6c0c1e-0000-4000-8000-00000000000b",
                        "table_name": "bad\udfff", "columns": []})
        wal.append(insert(3, 2, {NOTE: "fine"}))
        wal.append({"op": "close", "t": 3})
        wal.seal()
    store.compact(spark=False)
    assert store.fetch_row("orders", 2, as_of=4) == {"amount": None, "note": "fine"}
    assert isinstance(MalformedRecordError("x"), HistoryError)


# --- arguments out of range --------------------------------------------------------------------


def test_negative_or_non_finite_counts_and_durations_are_refused_and_delete_nothing(tmp_path):
    """``history --limit -1`` and ``cleanup --grace-seconds nan|inf`` were "unexpected ValueError /
    OverflowError"; a negative grace put the cleanup's cutoff in the future, so it deleted the files
    a running compaction had just written (orphans until its commit); ``retain -1`` "succeeded"."""
    from datetime import timedelta

    from history_pipeline.errors import MaintenanceInputError, QueryError

    store = committed_store(tmp_path)
    for args, option in ((["history", "--limit", "-1"], "--limit"),
                         (["cleanup", "--grace-seconds", "nan"], "--grace-seconds"),
                         (["cleanup", "--grace-seconds", "inf"], "--grace-seconds"),
                         (["cleanup", "--grace-seconds", "-5"], "--grace-seconds")):
        refused = run(tmp_path, *args)
        assert refused.returncode == 2 and f"argument {option}: expected a" in refused.stderr, refused
        assert "Traceback" not in refused.stderr and "unexpected" not in refused.stderr
    with pytest.raises(QueryError, match="history limit -1"):
        store.history(limit=-1)
    written = sorted(tmp_path.rglob("*.parquet"))
    orphan = written[0].with_name("in-flight-compaction-output.parquet")
    orphan.write_bytes(written[0].read_bytes())  # written a moment ago, not yet committed
    with pytest.raises(MaintenanceInputError, match="grace period"):
        store.cleanup(grace=timedelta(seconds=-5))
    assert orphan.exists()
    assert store.cleanup(grace=timedelta(hours=1)).orphans_deleted == []
    with pytest.raises(HistoryError, match="cannot purge before -1: logical timestamps start at 0"):
        store.retain(-1, spark=False)
    assert [c.operation.split()[0] for c in store.history()] == ["compact"]
    assert_committed_state_intact(store)
    # it is an orphan indeed: a grace of 0 (the caller's explicit choice) deletes it
    assert [p.rsplit("/", 1)[-1] for p in store.cleanup(grace=timedelta(0)).orphans_deleted] == [orphan.name]
    assert_committed_state_intact(store)


# --- damaged files -----------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    import struct

    data = bytearray(path.read_bytes())
    if how == "missing":
        path.unlink()
    elif how == "not parquet":
        path.write_bytes(b"x" * len(data))
    else:  # "pages overwritten": the footer still reads, the pages do not
        footer_length = struct.unpack("<i", data[-8:-4])[0]
        data[4 : len(data) - 8 - footer_length] = b"\xab" * (len(data) - 12 - footer_length)
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["missing", "not parquet", "pages overwritten"])
def test_a_damaged_data_file_is_a_typed_error_for_every_read_and_a_finding_of_verify(tmp_path, how):
    """A Parquet file of the catalog that is truncated or overwritten failed reads with pyarrow's
    ArrowInvalid/OSError or a DuckDB error ("unexpected ArrowInvalid" on the command line), naming
    no file; ``verify`` itself crashed with "unexpected InvalidInputException" when only the pages
    were damaged, instead of reporting the file."""
    from history_pipeline.errors import DataFileError

    store = committed_store(tmp_path)
    catalog_before = store.catalog_state()
    damaged = sorted(tmp_path.rglob("tables/*/versions-*.parquet"))[0]
    relative = damaged.relative_to(tmp_path).as_posix()
    _damage(damaged, how)
    store = HistoryStore.open(tmp_path, database="db", create=False)
    for read in (lambda: store.load_table("orders", as_of=3), lambda: store.fetch_row("orders", 1, as_of=3),
                 lambda: store.row_history("orders", 1), lambda: store.diff("orders", from_=2, to=3)):
        with pytest.raises(DataFileError, match="cannot be read: .*`history-pipeline verify` lists"):
            read()
    with pytest.raises(HistoryError):
        store.sql("SELECT sum(amount) FROM orders", as_of=3)
    one_line_error(run(tmp_path, "load", "orders"), "cannot be read")
    verified = run(tmp_path, "verify")
    assert verified.returncode == 1 and "Traceback" not in verified.stderr and verified.stderr == "", verified
    assert f"{relative}:" in verified.stdout and ("missing_file" if how == "missing" else "unreadable_file") \
        in verified.stdout, verified.stdout
    assert store.catalog_state() == catalog_before  # nothing committed was touched by the failures


def test_a_hole_in_the_catalog_log_is_named_and_no_commit_writes_over_it(tmp_path):
    """With the first transaction file gone (and no checkpoint yet), the replay stopped there: the
    database read as empty ("no table 'orders' ... tables then: none"), and the next compaction
    committed a new transaction 0 over the hole, after which every read failed on transaction 1's
    predecessor. Now the hole is an error naming the file; rebuild-catalog recovers."""
    store = committed_store(tmp_path)
    with store.wal_writer() as wal:
        for event in [insert(3, 2, {AMOUNT: "2.00"}), {"op": "close", "t": 3}]:
            wal.append(event)
        wal.seal()
    store.compact(spark=False)
    expected = store.load_table("orders", as_of=4)
    transactions = tmp_path / "db" / "_catalog" / "transactions"
    assert sorted(p.name for p in transactions.iterdir()) == [f"{i:020d}.json" for i in (0, 1)]
    second = (transactions / f"{1:020d}.json").read_bytes()
    (transactions / f"{0:020d}.json").unlink()
    with store.wal_writer() as wal:  # a later segment waits to be compacted
        for event in [insert(5, 3, {NOTE: "later"}), {"op": "close", "t": 5}]:
            wal.append(event)
        wal.seal()
    for command in (["status"], ["load", "orders"], ["compact", "--in-process"], ["verify"]):
        one_line_error(run(tmp_path, *command), f"db/_catalog/transactions/{0:020d}.json: missing, but later",
                       "rebuild-catalog")
    with pytest.raises(HistoryError, match="the log has a hole"):
        HistoryStore.open(tmp_path, database="db", create=False).compact(spark=False)
    assert sorted(p.name for p in transactions.iterdir()) == [f"{1:020d}.json"]  # nothing written over it
    assert (transactions / f"{1:020d}.json").read_bytes() == second
    assert run(tmp_path, "rebuild-catalog").returncode == 0
    store = HistoryStore.open(tmp_path, database="db", create=False)
    assert store.frontier == 3 and store.load_table("orders", as_of=4) == expected
    store.compact(spark=False)  # the waiting segment applies once, on the rebuilt catalog
    assert store.frontier == 5 and store.fetch_row("orders", 3, as_of=6) == {"amount": None, "note": "later"}
    assert store.load_table("orders", as_of=4) == expected and store.verify() == []


# --- crashes and races ---------------------------------------------------------------------------


def test_two_compactions_racing_for_one_segment_apply_it_once_and_neither_fails(tmp_path):
    """The loser of the catalog race found the segment applied (so committed nothing: right), then
    moved the segment file the winner had already moved: a bare FileNotFoundError ("No such file or
    directory" on the command line) for a run in which nothing went wrong, and a summary that said
    it had applied the segment too."""
    import threading
    from datetime import timedelta

    store = committed_store(tmp_path)
    with store.wal_writer() as wal:
        for event in [insert(3, 2, {AMOUNT: "2.00"}),
                      {"op": "update", "t": 4, "table_uuid": T, "key": 1, "values": {NOTE: "changed"}},
                      {"op": "close", "t": 4}]:
            wal.append(event)
        wal.seal()
    both_written = threading.Barrier(2, timeout=60)
    outcomes: dict[str, object] = {}

    def compaction(name: str) -> None:
        def hook(step: str) -> None:
            if step == "schema_history_written":  # both have written their files: now both commit
                both_written.wait()
        try:
            outcomes[name] = HistoryStore.open(tmp_path, database="db").compact(spark=False, on_step=hook)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcomes[name] = exc

    runs = [threading.Thread(target=compaction, args=(name,)) for name in ("a", "b")]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(timeout=120)
    assert all(not isinstance(o, BaseException) for o in outcomes.values()), outcomes
    assert sorted(o.segments_applied for o in outcomes.values()) == [[], [2]]
    assert {o.frontier for o in outcomes.values()} == {4}
    store = HistoryStore.open(tmp_path, database="db")
    assert [c.operation for c in store.history()] == [f"compact segment {2:020d}", f"compact segment {1:020d}"]
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED, SegmentState.APPLIED]
    from decimal import Decimal
    assert store.load_table("orders", as_of=5).to_pylist() == [
        {"synthetic_key": 1, "amount": Decimal("1.50"), "note": "changed"},
        {"synthetic_key": 2, "amount": Decimal("2.00"), "note": None}]
    expected = store.load_table("orders", as_of=5)
    # the loser's version file (its schema-history file has the winner's path: one per segment and txn)
    assert len(store.cleanup(grace=timedelta(0)).orphans_deleted) == 1
    assert store.verify() == [] and store.load_table("orders", as_of=5) == expected


def _killed_in_a_child(work: Callable[[], None], timeout: float = 120.0) -> None:
    """Run ``work`` in a forked child of this process (its modules loaded already: no interpreter
    starts) that SIGKILLs itself on the way: no exception handler, no finally, no atexit runs, as
    on a machine that lost power. Fails unless the child died of that signal (an error it met
    first is printed on the test's stderr)."""
    pid = os.fork()
    if pid == 0:  # the child never returns into the test run
        code = 2  # the kill was never reached
        try:
            work()
        except BaseException:  # noqa: BLE001 - reported to the parent by the exit code and stderr
            traceback.print_exc()
            code = 3
        os._exit(code)
    deadline = time.monotonic() + timeout
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child was not killed within {timeout:.0f}s")
        time.sleep(0.01)
    status = ended[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the child ended with status {status}, not killed at its step (its stderr is above)")


def _killed_at(root: Path, operation: str, step: str, *extra: str) -> None:
    """``operation`` on the store at ``root`` in a child killed when it reaches ``step``."""
    from history_pipeline.io.store import open_store
    from history_pipeline.maintenance import merge as merge_module
    from history_pipeline.maintenance import retention as retention_module

    def work() -> None:
        store = HistoryStore.open(root, database="db")

        def die(at: str) -> None:
            if at == step:
                os.kill(os.getpid(), signal.SIGKILL)

        if operation == "compact":
            store.compact(spark=False, on_step=die)
        elif operation == "merge":
            merge_module.merge(store, None, small_file_bytes=10**9, on_step=die)
        else:
            retention_module.retain(store, 6, open_store(extra[0]), on_step=die)

    _killed_in_a_child(work)


@pytest.mark.slow
@pytest.mark.parametrize(("operation", "step"), [
    ("compact", "files_written"), ("compact", "schema_history_written"), ("compact", "committed"),
    ("merge", "files_written"), ("retain", "files_written"), ("retain", "cold_tier_written"),
])
def test_a_run_killed_at_any_step_is_recovered_by_the_next_run(tmp_path, operation, step):
    """SIGKILL (no exception handler, no finally) between writing files and committing them, or
    after the commit before the WAL is told: the next ordinary run finishes the work once, answers
    equal the uninterrupted run's, and cleanup removes what the killed run left."""
    from datetime import timedelta

    from history_pipeline_tests.test_durable_maintenance import answers, history, more_history, open_store

    store = open_store(tmp_path)
    history(store)
    more_history(store)
    if operation == "compact":
        from history_pipeline_tests.test_compaction import write

        before = answers(store)
        write(store, [{"op": "update", "t": 11, "table_uuid": "tbl", "key": 4, "values": {"c": 41}},
                      {"op": "delete", "t": 12, "table_uuid": "tbl", "key": 2}])
        _killed_at(tmp_path / "root", "compact", step)
        store = open_store(tmp_path)
        assert store.frontier == (12 if step == "committed" else 9)
        summary = store.compact(spark=False)
        assert summary.segments_applied == ([] if step == "committed" else [4])
        assert {k: v for k, v in answers(store).items() if k <= 10} == before
        assert [v["is_deleted"] for v in store.row_history("t", 2)][-1] is True
        assert store.fetch_row("t", 4, 13) == {**before[10]["rows"][3], "v": 41}
        assert [h.operation.split()[0] for h in store.history()].count("compact") == 4  # each segment once
    elif operation == "merge":
        before = answers(store)
        _killed_at(tmp_path / "root", "merge", step)
        store = open_store(tmp_path)
        assert answers(store) == before  # nothing committed: the old files still answer
        store.merge(spark=False, small_file_bytes=10**9)
        assert answers(store) == before
    else:
        cold = str(tmp_path / "cold")
        before = {k: v for k, v in answers(store).items() if k >= 6}
        _killed_at(tmp_path / "root", "retain", step, cold)
        store = open_store(tmp_path)
        assert store.earliest == 0  # not purged: the killed retention committed nothing
        store.retain(purge_before=6, cold_tier=cold, spark=False)
        assert store.earliest == 6 and answers(store) == before
        assert store.load_cold_tier(cold) == 0  # the purged history comes back once, not twice
    expected = answers(store, 0)
    store.cleanup(grace=timedelta(0))
    assert store.verify() == [] and answers(store, 0) == expected
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED] * len(store.segments())


def _writer_torn_at(root: Path, events: list[dict], kill_at: int) -> None:
    """The events appended and sealed by a writer in a child whose ``kill_at``-th write reaches the
    file by half before the child is killed."""
    from history_pipeline.wal import writer as writer_module

    def work() -> None:
        store = HistoryStore.open(root, database="db")
        real_write, calls = os.write, [0]

        def torn_write(fd: int, data: bytes) -> int:
            calls[0] += 1
            if calls[0] == kill_at:  # half the line reaches the file, then the power goes
                real_write(fd, bytes(data[: len(data) // 2]))
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(fd, data)

        writer_module.os.write = torn_write  # the child's own copy of the module
        with store.wal_writer() as wal:
            for event in events:
                wal.append(event)
            wal.seal()

    _killed_in_a_child(work)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [1, 2, 4, 7])  # the opening close, an insert, a close, the seal
def test_a_wal_writer_killed_mid_line_leaves_a_torn_tail_the_next_writer_repairs(tmp_path, kill_at):
    store = committed_store(tmp_path)
    events = [insert(3, 2, {AMOUNT: "2.00"}), {"op": "close", "t": 3},
              {"op": "update", "t": 4, "table_uuid": T, "key": 1, "values": {NOTE: "changed"}},
              {"op": "delete", "t": 5, "table_uuid": T, "key": 2}, insert(5, 3, {NOTE: "new"}),
              {"op": "close", "t": 5}]
    _writer_torn_at(tmp_path, events, kill_at)
    open_segment = tmp_path / "db" / "wal" / "segments" / f"{2:020d}.open"
    assert not open_segment.read_bytes().endswith(b"\n")  # torn: a partial last line
    with store.wal_writer() as wal:  # recovers: the torn line is cut, every complete line kept
        kept = open_segment.read_bytes().decode().splitlines()[1:]  # (after the opening close)
        assert [json.loads(line) for line in kept] == [
            {k: v for k, v in e.items()} for e in events[: len(kept)]]
        for event in events[len(kept):]:  # the producer sends the rest again
            wal.append(event)
        wal.seal()
    store.compact(spark=False)
    assert store.frontier == 5 and store.verify() == []
    from decimal import Decimal
    assert store.load_table("orders", as_of=6).to_pylist() == [
        {"synthetic_key": 1, "amount": Decimal("1.50"), "note": "changed"},
        {"synthetic_key": 3, "amount": None, "note": "new"}]
    assert [v["logical_timestamp"] for v in store.row_history("orders", 2)] == [3, 5]  # once each
    assert store.load_table("orders", as_of=3).to_pylist() == [
        {"synthetic_key": 1, "amount": Decimal("1.50"), "note": "kept"}]


# --- the service -----------------------------------------------------------------------------------


@pytest.mark.daemon
def test_the_service_refuses_malformed_tickets_and_other_flight_calls_without_a_stack_trace(tmp_path):
    """A ticket whose op is a list made decode_request fail with "unhashable type: 'list'" and the
    client got the server's Python stack trace; so did every Flight call other than do_get."""
    import pyarrow.flight as flight

    from history_pipeline.client import connect
    from history_pipeline.errors import TableNotFoundError
    from history_pipeline.service.auth import Tenant, token_digest
    from history_pipeline.service.config import ServerConfig
    from history_pipeline.service.server import HistoryServer

    committed_store(tmp_path)
    config = ServerConfig(root=str(tmp_path), tenants=(Tenant("t", "db", token_digest("secret")),), port=0, workers=1)
    with HistoryServer(config) as server:
        client = flight.FlightClient(server.url)
        options = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer secret")])
        calls = {
            "a list as op": lambda: client.do_get(flight.Ticket(b'{"op": ["Sql"]}'), options).read_all(),
            "an object as op": lambda: client.do_get(flight.Ticket(b'{"op": {"a": 1}}'), options).read_all(),
            "list_flights": lambda: list(client.list_flights(options=options)),
            "get_flight_info": lambda: client.get_flight_info(flight.FlightDescriptor.for_path("x"), options),
            # ListActions answers (Flight SQL's actions); an action it does not offer is refused
            "do_action": lambda: list(client.do_action(flight.Action("drop", b""), options)),
        }
        for name, call in calls.items():
            with pytest.raises(flight.FlightServerError) as refused:
                call()
            assert "Traceback" not in str(refused.value), (name, str(refused.value))
            assert json.loads(refused.value.extra_info)["error"] == "InvalidRequestError", name
        with connect(server.url, "secret") as remote:  # and the service still answers
            assert remote.fetch_row("orders", 1, 3) == {"amount": __import__("decimal").Decimal("1.50"),
                                                         "note": "kept"}
            with pytest.raises(TableNotFoundError, match="no table 'nosuch'"):
                remote.load_table("nosuch", 3)


# --- S3 that does not answer -------------------------------------------------------------------------


def test_an_unreachable_s3_target_is_a_typed_error_naming_it_and_commits_nothing(tmp_path, monkeypatch):
    """A cold tier or export target on an S3 endpoint that does not answer failed with botocore's
    EndpointConnectionError ("unexpected EndpointConnectionError" on the command line): untyped,
    and only after a retention's whole work (an erasure's: committed locally, not in the cold tier).
    Now it is a StorageRootError naming the target, before anything changes."""
    import socket

    from history_pipeline.errors import ObjectStoreError, StorageRootError
    from history_pipeline.io.store import S3Options

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = S3Options(endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", access_key_id="k",
                       secret_access_key="s")
    store = committed_store(tmp_path)
    for call, target in ((lambda: store.export(as_of=3, to="s3://bucket/exports", s3=closed), "s3://bucket/exports"),
                         (lambda: store.retain(3, cold_tier="s3://bucket/cold", s3=closed, spark=False),
                          "s3://bucket/cold"),
                         (lambda: store.load_cold_tier("s3://bucket/cold", s3=closed), "s3://bucket/cold"),
                         # the erasure reaches its targets first: it changed the WAL and committed
                         # locally, then failed on the cold tier
                         (lambda: store.erase("orders", [1], requested_by="dpo", cold_tiers=["s3://bucket/cold"],
                                              s3=closed, spark=False), "s3://bucket/cold"),
                         (lambda: HistoryStore.open("s3://bucket/root", database="db", s3=closed), "s3://bucket/root")):
        with pytest.raises(ObjectStoreError) as caught:
            call()
        assert isinstance(caught.value, StorageRootError)
        assert f"cannot reach S3 for {target}" in str(caught.value), str(caught.value)
    assert store.earliest == 0 and [c.operation.split()[0] for c in store.history()] == ["compact"]
    assert_committed_state_intact(store)
    for name, value in (("AWS_ENDPOINT_URL", closed.endpoint_url), ("AWS_ACCESS_KEY_ID", "k"),
                        ("AWS_SECRET_ACCESS_KEY", "s"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    one_line_error(run(tmp_path, "export", "--as-of", "3", "--to", "s3://bucket/exports"),
                   "cannot reach S3 for s3://bucket/exports (to write db/exports/")
    one_line_error(run(tmp_path, "load-cold-tier", "s3://bucket/cold"), "cannot reach S3 for s3://bucket/cold")
    one_line_error(run_command(["--root", "s3://bucket/root", "--database", "db", "status"]),
                   "cannot reach S3 for s3://bucket/root")


# --- the Python API: typed errors for arguments of the wrong kind ------------------------------------


def test_query_arguments_of_the_wrong_kind_are_typed_errors_naming_them(tmp_path):
    """A key given as a str or None failed in the key-range pruning with a bare TypeError ("'<='
    not supported between instances of 'int' and 'str'"), a float key matched nothing; SQL given
    as None or bytes was a TypeError of DuckDB's parser; sql_reader gave DuckDB's ParserException
    where sql gives its one-line QueryError."""
    from history_pipeline.errors import QueryError

    store = committed_store(tmp_path)
    for key in ("1", None, 1.5, 2**70, True):
        with pytest.raises(QueryError, match=f"key {key!r} is not a synthetic key: pass a 64-bit integer"):
            store.fetch_row("orders", key, as_of=3)
        with pytest.raises(QueryError, match="is not a synthetic key"):
            store.row_history("orders", key)
    import numpy as np  # integers from numpy/pandas are keys
    assert store.fetch_row("orders", np.int64(1), as_of=3) == {"amount": __import__("decimal").Decimal("1.50"),
                                                                "note": "kept"}
    for query in (None, b"SELECT 1"):
        with pytest.raises(QueryError, match="SQL must be a string"):
            store.sql(query, as_of=3)
        with pytest.raises(QueryError, match="SQL must be a string"):
            store.sql_reader(query, as_of=3)
    with pytest.raises(QueryError, match=r'SQL syntax error: syntax error at or near "SELEC" \(line 1\)'):
        store.sql_reader("SELEC amount FROM orders", as_of=3)
    one_line_error(run(tmp_path, "row-history", "orders", str(2**70)), "is not a synthetic key")


@pytest.mark.parametrize("torn", [b"", b'{"next_segment": 3, "clo', b"\x00\x00\x00\x00", b"[]"])
def test_a_torn_wal_head_does_not_stop_the_writer(tmp_path, torn):
    """head.json was renamed into place without an fsync, so a power loss could leave it empty;
    every later append then failed with "unexpected JSONDecodeError". The head is only a hint:
    the segments say the same."""
    store = committed_store(tmp_path)
    (tmp_path / "db" / "wal" / "head.json").write_bytes(torn)
    appended = run(tmp_path, "append", "--seal", stdin=jsonl([insert(3, 2, {NOTE: "after"}), {"op": "close", "t": 3}]))
    assert appended.returncode == 0, appended.stderr
    assert [r.segment_id for r in store.segments()] == [1, 2]  # numbering continues, no id reused
    stale = run(tmp_path, "append", stdin=jsonl([insert(3, 9, {NOTE: "below the close"})]))
    one_line_error(stale, "<stdin>, line 1: t=3 is at or below the closed timestamp 3")  # the close is known
    store.compact(spark=False)
    assert store.frontier == 3 and store.fetch_row("orders", 2, as_of=4) == {"amount": None, "note": "after"}
    assert json.loads((tmp_path / "db" / "wal" / "head.json").read_text()) == {"next_segment": 3, "closed_t": 3}


def test_a_repair_interrupted_before_the_quarantined_original_is_removed_is_finished_by_running_it_again(
        tmp_path, monkeypatch):
    """Interrupted between putting the re-sealed segment in line and removing the quarantined
    original: both copies exist, the database stays blocked (saying so, with what to do), nothing is
    applied twice, and the same repair run again finishes it."""
    store = committed_store(tmp_path)
    with store.wal_writer() as wal:
        for event in [{"op": "update", "t": 3, "table_uuid": T, "key": 99, "values": {NOTE: "typo"}},
                      {"op": "close", "t": 3}]:
            wal.append(event)
        wal.seal()
    one_line_error(run(tmp_path, "compact", "--in-process"), "line 2: update of key 99, which does not exist")
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text(jsonl([{"op": "update", "t": 3, "table_uuid": T, "key": 1, "values": {NOTE: "fixed"}}]))
    unlink = Path.unlink

    def power_cut(path: Path, *args, **kwargs):
        if path.parent.name == "quarantine" and path.suffix == ".sealed":
            raise KeyboardInterrupt("power cut")
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", power_cut)
    assert run(tmp_path, "repair", "2", "--events", str(fixed)).returncode == 130
    monkeypatch.setattr(Path, "unlink", unlink)
    assert sorted(r.state.value for r in store.segments() if r.segment_id == 2) == ["quarantined", "sealed"]
    one_line_error(run(tmp_path, "compact", "--in-process"), "segment 00000000000000000002 is quarantined",
                   "history-pipeline repair")
    assert store.frontier == 2
    assert run(tmp_path, "repair", "2", "--events", str(fixed)).returncode == 0
    assert json.loads(run(tmp_path, "compact", "--in-process", "--format", "json").stdout)["segments_applied"] == [2]
    assert store.verify() == [] and store.fetch_row("orders", 1, as_of=4) == {
        "amount": __import__("decimal").Decimal("1.50"), "note": "fixed"}
    assert [v["logical_timestamp"] for v in store.row_history("orders", 1)] == [2, 3]


def test_a_cold_tier_or_export_target_that_is_a_file_is_named_as_such(tmp_path):
    """A local target that is a file gave mkdir's bare "File exists (PATH)", which reads as if the
    export found something to keep; one below a file, "Not a directory"."""
    store = committed_store(tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for args in (["export", "--as-of", "3", "--to", str(a_file)], ["load-cold-tier", str(a_file)],
                 ["retain", "2", "--cold-tier", str(a_file)]):
        one_line_error(run(tmp_path, *args), f"{a_file} is a file, not a folder")
    one_line_error(run(tmp_path, "export", "--as-of", "3", "--to", str(a_file / "below")),
                   f"cannot use {a_file / 'below'} as a storage folder: Not a directory")
    assert a_file.read_text() == "x" and store.earliest == 0
    assert_committed_state_intact(store)


@pytest.mark.parametrize(("toml", "named"), [
    ('[[tenants]]\ntoken_sha256 = "00"\n', "tenants are tables [tenants.<name>]"),  # was an AttributeError
    ("[tenants]\na = 5\n", "tenant 'a' must be a table"),
    ('port = [1]\n[tenants.a]\ntoken_sha256 = "%s"\n', "port must be an integer, got [1]"),  # was a TypeError
    ('workers = 0\n[tenants.a]\ntoken_sha256 = "%s"\n', "workers must be at least 1"),  # was accepted
    ('[tenants.a]\ntoken_sha256 = "%s"\nmax_result_rows = "many"\n', "limit max_result_rows must be a number"),
    ('[limits]\nquery_timeout_s = "1m"\n[tenants.a]\ntoken_sha256 = "%s"\n', "limit query_timeout_s must be a number"),
    ("[tenants.a]\ntoken_sha256 = 5\n", "tenant 'a': token_sha256 must be a string"),  # was a TypeError
])
def test_a_server_configuration_of_the_wrong_shape_is_refused_naming_the_setting(tmp_path, toml, named):
    """Settings of the wrong shape in the serve command's TOML were AttributeError/TypeError
    ("unexpected ..." on the command line), or were accepted and failed each query later (a limit
    given as a string compared with a number in the worker)."""
    config = tmp_path / "server.toml"
    config.write_text((toml % ("ab" * 32)) if "%s" in toml else toml)
    refused = run(tmp_path, "serve", "--config", str(config))
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: cannot serve with {config}: ")
    assert named in refused.stderr and "unexpected" not in refused.stderr, refused.stderr


def test_a_capture_dsn_that_does_not_parse_is_a_connection_error_naming_the_option(tmp_path):
    """psycopg raises ProgrammingError (not OperationalError) for a connection string it cannot
    parse: "unexpected ProgrammingError" instead of the capture's own message."""
    refused = run(tmp_path, "capture", "postgres", "--dsn", "not a dsn ===", "--once")
    one_line_error(refused, "cannot connect to PostgreSQL (missing \"=\" after \"not\"", "check --dsn")


def test_a_retention_racing_a_merge_loses_cleanly_and_runs_again(tmp_path):
    """Both plan from the same files; the merge commits first, so the retention's removal of a
    file the merge replaced no longer applies: a typed error, nothing committed by it, and the
    retention run again purges; every answer from the purge point on is the uninterrupted one."""
    import threading
    from datetime import timedelta

    from history_pipeline.errors import CommitConflictError
    from history_pipeline.maintenance import merge as merge_module
    from history_pipeline.maintenance import retention as retention_module
    from history_pipeline_tests.test_durable_maintenance import answers, history, more_history, open_store

    store = open_store(tmp_path)
    history(store)
    more_history(store)
    expected = {k: v for k, v in answers(store).items() if k >= 6}
    both_written = threading.Barrier(2, timeout=60)
    merged = threading.Event()
    outcomes: dict[str, object] = {}

    def merge_first(step: str) -> None:
        both_written.wait()

    def retain_second(step: str) -> None:
        if step == "files_written":
            both_written.wait()
            merged.wait(60)  # the merge commits first

    def run_merge() -> None:
        try:
            outcomes["merge"] = merge_module.merge(open_store(tmp_path), None, small_file_bytes=10**9,
                                                   on_step=merge_first)
        finally:
            merged.set()

    def run_retain() -> None:
        try:
            outcomes["retain"] = retention_module.retain(open_store(tmp_path), 6, None, on_step=retain_second)
        except HistoryError as exc:
            outcomes["retain"] = exc

    threads = [threading.Thread(target=run_merge), threading.Thread(target=run_retain)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert isinstance(outcomes["retain"], CommitConflictError), outcomes
    assert "is not live any more" in str(outcomes["retain"])
    store = open_store(tmp_path)
    assert store.earliest == 0 and [c.operation for c in store.history()][0] == "merge"
    store.retain(purge_before=6, spark=False)
    store.cleanup(grace=timedelta(0))  # the losing retention's files were orphans
    assert store.earliest == 6 and answers(store) == expected and store.verify() == []


@pytest.mark.parametrize(("step", "occurrence"),
                         [("files_written", 1), ("committed", 2), ("schema_history_written", 3)])
def test_a_spark_group_compaction_interrupted_mid_group_applies_each_segment_once(tmp_path, spark, step, occurrence):
    """Spark compacts pending segments as one group (one job, then one commit per segment in
    order): interrupted at the ``occurrence``-th ``step``, some segments are committed and some
    not; the next run applies the rest once, and every answer equals an in-process reference."""
    segments = [[CREATE, insert(2, 1, {AMOUNT: "1.50", NOTE: "a"}), {"op": "close", "t": 2}],
                [insert(3, 2, {AMOUNT: "2.00"}), {"op": "update", "t": 4, "table_uuid": T, "key": 1,
                                                  "values": {NOTE: "b"}}, {"op": "close", "t": 4}],
                [{"op": "delete", "t": 5, "table_uuid": T, "key": 2}, insert(6, 3, {NOTE: "c"}),
                 {"op": "close", "t": 6}]]

    def written(root: Path) -> HistoryStore:
        store = HistoryStore.open(root, database="db")
        with store.wal_writer() as wal:
            for events in segments:
                for event in events:
                    wal.append(event)
                wal.seal()
        return store

    reference = written(tmp_path / "reference")
    reference.compact(spark=False)
    store = written(tmp_path / "root")
    seen: list[str] = []

    def interrupt(at: str) -> None:
        seen.append(at)
        if at == step and seen.count(step) == occurrence:
            raise KeyboardInterrupt(f"{step} #{occurrence}")

    with pytest.raises(KeyboardInterrupt):
        store.compact(spark=spark, on_step=interrupt)
    assert seen.count("planned") == 1  # one Spark job for the group
    committed = occurrence if step == "committed" else occurrence - 1
    assert store.frontier == [-1, 2, 4, 6][committed]
    resumed = HistoryStore.open(tmp_path / "root", database="db").compact(spark=spark)
    assert resumed.segments_applied == [s for s in (1, 2, 3) if s > committed]
    store = HistoryStore.open(tmp_path / "root", database="db")
    assert store.frontier == 6 and [c.operation.split()[0] for c in store.history()] == ["compact"] * 3

    def all_answers(s: HistoryStore) -> dict:
        return {t: (s.load_table("orders", t).to_pylist() if t > 1 else None,
                    [s.row_history("orders", k) for k in (1, 2, 3)]) for t in range(0, 8)}

    assert all_answers(store) == all_answers(reference) and store.verify() == []


def test_an_interrupted_rebuild_or_a_lost_catalog_never_reads_as_an_empty_database(tmp_path, monkeypatch):
    """rebuild-catalog moved the old log aside and only then wrote the rebuilt checkpoint: stopped in
    between, the database read as empty (frontier -1, "no table 'orders'") and the next compaction
    quarantined a valid segment as "insert into unknown table". The checkpoint now goes first; and
    a compaction onto an empty catalog while segments are applied on disk refuses, saying why."""
    from history_pipeline.catalog import upkeep
    from history_pipeline.errors import CatalogError

    store = committed_store(tmp_path)
    expected = store.load_table("orders", as_of=3)
    move_aside = upkeep._move_aside

    def power_cut(*args, **kwargs):
        move_aside(*args, **kwargs)
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(upkeep, "_move_aside", power_cut)
    assert run(tmp_path, "rebuild-catalog").returncode == 130
    monkeypatch.setattr(upkeep, "_move_aside", move_aside)
    store = HistoryStore.open(tmp_path, database="db", create=False)
    assert store.frontier == 2 and store.load_table("orders", as_of=3) == expected and store.verify() == []
    with store.wal_writer() as wal:
        for event in [insert(3, 2, {NOTE: "later"}), {"op": "close", "t": 3}]:
            wal.append(event)
        wal.seal()
    for obj in store.objects.list("db/_catalog/"):  # now the catalog is lost altogether
        store.objects.delete(obj.path)
    store = HistoryStore.open(tmp_path, database="db", create=False)
    with pytest.raises(CatalogError, match="catalog of db is empty, but 1 segment.* run `history-pipeline rebuild"):
        store.compact(spark=False)
    one_line_error(run(tmp_path, "compact", "--in-process", "--segment", "2"), "the catalog was lost")
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED, SegmentState.SEALED]  # not quarantined
    assert run(tmp_path, "rebuild-catalog").returncode == 0
    store = HistoryStore.open(tmp_path, database="db", create=False)
    assert store.compact(spark=False).segments_applied == [2]
    assert store.load_table("orders", as_of=3) == expected and store.verify() == []
    assert store.fetch_row("orders", 2, as_of=4) == {"amount": None, "note": "later"}


def test_a_cleanup_interrupted_after_deleting_files_before_forgetting_them_is_finished_by_the_next(
        tmp_path, monkeypatch):
    """The tombstoned files are deleted, then their tombstones forgotten in a commit: interrupted in
    between, the catalog still lists tombstones of files that are gone; answers are unchanged and
    the next cleanup forgets them."""
    from datetime import timedelta

    from history_pipeline.catalog.log import TransactionLog
    from history_pipeline_tests.test_durable_maintenance import answers, history, more_history, open_store

    store = open_store(tmp_path)
    history(store)
    more_history(store)
    store.merge(spark=False, small_file_bytes=10**9)
    before, tombstones = answers(store), set(store.catalog_state().tombstones)
    assert tombstones
    commit = TransactionLog.commit

    def power_cut(log, operation, build, **kwargs):
        if operation == "cleanup":
            raise KeyboardInterrupt("power cut")
        return commit(log, operation, build, **kwargs)

    monkeypatch.setattr(TransactionLog, "commit", power_cut)
    with pytest.raises(KeyboardInterrupt):
        store.cleanup(grace=timedelta(0))
    monkeypatch.setattr(TransactionLog, "commit", commit)
    store = open_store(tmp_path)
    assert set(store.catalog_state().tombstones) == tombstones  # still recorded...
    assert not any((tmp_path / "root" / path).exists() for path in tombstones)  # ...but gone
    assert answers(store) == before and store.verify() == []
    assert sorted(store.cleanup(grace=timedelta(0)).tombstones_deleted) == sorted(tombstones)
    assert store.catalog_state().tombstones == {} and answers(store) == before and store.verify() == []


def test_results_with_repeated_names_print_and_a_union_result_is_a_typed_error(tmp_path):
    """``SELECT 1 AS a, 2 AS a`` printed as a table failed with "unexpected IndexError" (its rows by
    name had one value), as csv with "unexpected KeyError", and as json silently lost a column; a
    UNION-typed result failed in pyarrow with "unexpected ArrowNotImplementedError: sparse_union"."""
    from history_pipeline.errors import QueryError

    store = committed_store(tmp_path)
    for fmt, expected in (("json", ['{"a": 1, "a_1": 2}']), ("csv", ['"a","a_1"', '"1","2"']),
                          ("table", ["a  a_1", "-  ---", "1  2  ", "(1 rows)"])):
        printed = run(tmp_path, "sql", "SELECT 1 AS a, 2 AS a", "--format", fmt)
        assert printed.returncode == 0 and printed.stdout.splitlines() == expected, (fmt, printed)
    with pytest.raises(QueryError, match="sparse_union.*CAST"):
        store.sql("SELECT union_value(k := 1) AS u", as_of=3)
    one_line_error(run(tmp_path, "sql", "SELECT union_value(k := 1) AS u"), "u (sparse_union", "cast it")
    assert run(tmp_path, "sql", "SELECT CAST(union_value(k := 1) AS VARCHAR) AS u", "--format", "json").stdout == (
        '{"u": "1"}\n')


# --- a segment written by another producer that breaks the ordering rules -----------------------------

FOREIGN_SEGMENTS = {  # the second segment of committed_store's database (frontier 2), and what is wrong at its line
    "t going backwards": ([{"op": "close", "t": 2}, insert(5, 2, {NOTE: "a"}), insert(4, 3, {NOTE: "b"}),
                           {"op": "close", "t": 5}], 3, "t=4 goes backwards (last event had t=5)"),
    "an event at the compacted frontier": ([{"op": "close", "t": 1}, insert(2, 2, {NOTE: "a"}),
                                            {"op": "close", "t": 5}], 2, "t=2 is at or below the closed timestamp 2"),
    "an event above the upper bound": ([{"op": "close", "t": 2}, insert(7, 2, {NOTE: "a"}), {"op": "close", "t": 5}],
                                       2, "t=7 is above the segment's upper bound 5"),
    "a schema change sharing its t": ([{"op": "close", "t": 2}, insert(3, 2, {NOTE: "a"}),
                                       {"op": "rename_table", "t": 3, "table_uuid": T, "new_name": "x"},
                                       {"op": "close", "t": 5}], 3, "t=3 is shared with the previous event"),
}


def _foreign_segment(root: Path, events: list) -> None:
    from history_pipeline.wal.segments import sealing_line

    body = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)
    (root / "db" / "wal" / "segments" / f"{2:020d}.sealed").write_bytes(body + sealing_line(events[-1]["t"], body))


@pytest.mark.parametrize("case", sorted(FOREIGN_SEGMENTS))
def test_a_sealed_segment_breaking_the_ordering_rules_is_quarantined_naming_its_line(tmp_path, case):
    """The writer refuses these events, but a sealed segment from another producer that held them
    was compacted as it was: history below the frontier rewritten (answers already given for
    as_of 3 changed), versions out of order, a frontier below data. The compaction now checks the
    writer's rules again."""
    events, line, reason = FOREIGN_SEGMENTS[case]
    store = committed_store(tmp_path)
    _foreign_segment(tmp_path, events)
    one_line_error(run(tmp_path, "compact", "--in-process"), f"segment {2:020d}, line {line}: {reason}")
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED, SegmentState.QUARANTINED]
    assert_committed_state_intact(store)


@pytest.mark.parametrize("routing", ["driver", "spark"])
@pytest.mark.parametrize("case", sorted(FOREIGN_SEGMENTS))
def test_the_spark_compaction_quarantines_a_segment_breaking_the_ordering_rules_as_in_process(
    tmp_path, spark, monkeypatch, case, routing
):
    """The DataFrame path compacted such a segment as it was (its driver routes rows by a regex,
    its executors parse the lines; nothing re-checked the order). It now checks the rules where
    the lines already are (the driver's routing read, or the Spark-parsed lines) and quarantines
    the segment naming the same line with the same message as the in-process check."""
    events, line, reason = FOREIGN_SEGMENTS[case]
    if routing == "spark":  # any line that is not a row event sends the segment to Spark's routing
        monkeypatch.setattr(frames, "MAX_SCANNED_RECORDS", 0)
    store = committed_store(tmp_path)
    _foreign_segment(tmp_path, events)
    with pytest.raises(SegmentQuarantinedError, match=re.escape(f"segment {2:020d}, line {line}: {reason}")):
        store.compact(spark=spark)
    assert [r.state for r in store.segments()] == [SegmentState.APPLIED, SegmentState.QUARANTINED]
    assert_committed_state_intact(store)
