"""The catalog's transaction log on local disk and on a real S3 endpoint."""

import multiprocessing
import threading

import pytest

from history_pipeline.catalog import (
    AddFile,
    AdvanceFrontier,
    ApplySegments,
    CatalogState,
    FileEntry,
    FileKind,
    RemoveFile,
    TransactionLog,
)
from history_pipeline.errors import (
    CommitConflictError,
    CorruptTransactionError,
    ObjectExistsError,
    TransactionNotFoundError,
)
from history_pipeline.io.store import open_store


def entry(path, table="t1", rows=10, min_t=1, max_t=5):
    return FileEntry(path, FileKind.VERSIONS, table, 100, rows, min_t, max_t, 0, 9, (1,))


def add(path, frontier=None):
    def build(state):
        actions = [AddFile(entry(path))]
        if frontier is not None:
            actions.append(AdvanceFrontier(frontier))
        return actions

    return build


def test_put_if_absent_refuses_a_second_create(object_store):
    object_store.put_if_absent("x/a.json", b"one")
    with pytest.raises(ObjectExistsError):
        object_store.put_if_absent("x/a.json", b"two")
    assert object_store.get("x/a.json") == b"one"
    assert [o.path for o in object_store.list("x/")] == ["x/a.json"]


def test_commit_and_read_back(object_store):
    log = TransactionLog(object_store, "db/_catalog", checkpoint_interval=0)
    log.commit("add", add("f1", frontier=5))
    state = log.commit("add", add("f2", frontier=9))
    assert state.txn_id == 1 and state.frontier == 9
    fresh = TransactionLog(object_store, "db/_catalog").latest()
    assert fresh == state
    assert set(fresh.files) == {"f1", "f2"}
    txn = log.read_transaction(1)
    assert txn.previous_uuid == log.read_transaction(0).uuid


def test_time_travel_to_every_past_id(object_store):
    log = TransactionLog(object_store, "db/_catalog", checkpoint_interval=3)
    for i in range(8):
        log.commit("add", add(f"f{i}", frontier=i))
    log.commit("remove", lambda s: [RemoveFile("f0", 1.0)])
    for i in range(8):
        state = log.state_at(i)
        assert set(state.files) == {f"f{j}" for j in range(i + 1)}
        assert state.frontier == i
    assert "f0" not in log.state_at(8).files and "f0" in log.state_at(8).tombstones
    assert log.transaction_at_timestamp(4) == 4
    assert log.transaction_at_timestamp(100) == 8


def test_checkpoint_equals_replay(object_store):
    with_cp = TransactionLog(object_store, "db/_catalog", checkpoint_interval=4)
    for i in range(10):
        with_cp.commit("add", add(f"f{i}", frontier=i))
    with_cp.commit("segments", lambda s: [ApplySegments((1, 2))])
    assert with_cp.checkpoint_ids() == [4, 8]
    replayed = CatalogState()
    from history_pipeline.catalog.model import apply_transaction

    for i in range(11):
        replayed = apply_transaction(replayed, with_cp.read_transaction(i))
    assert TransactionLog(object_store, "db/_catalog").latest() == replayed
    assert with_cp.read_checkpoint(8) == with_cp.state_at(8)
    assert CatalogState.from_json(replayed.to_json()) == replayed


def test_conflicting_change_fails_cleanly_and_appends_retry(object_store):
    a = TransactionLog(object_store, "db/_catalog", checkpoint_interval=0)
    b = TransactionLog(object_store, "db/_catalog", checkpoint_interval=0)
    a.commit("add", add("f1"))
    b.latest()
    a.commit("merge", lambda s: [RemoveFile("f1", 1.0), AddFile(entry("m1"))])
    with pytest.raises(CommitConflictError, match="not live"):
        b.commit("merge", lambda s: [RemoveFile("f1", 1.0), AddFile(entry("m2"))])
    state = b.commit("add", add("f2"))  # appending still applies after refreshing
    assert set(state.files) == {"m1", "f2"}
    with pytest.raises(CommitConflictError, match="already applied"):
        a.commit("x", lambda s: [ApplySegments((3,))]) and a.commit("x", lambda s: [ApplySegments((3,))])


def test_many_threads_racing_lose_nothing(object_store):
    log_count, per_thread = 4, 5
    errors = []

    def worker(n):
        log = TransactionLog(object_store, "db/_catalog", checkpoint_interval=0)
        try:
            for i in range(per_thread):
                log.commit("add", add(f"t{n}-{i}"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(log_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state = TransactionLog(object_store, "db/_catalog").latest()
    assert state.txn_id == log_count * per_thread - 1
    assert len(state.files) == log_count * per_thread


def _commit_many(config, n, per_process):
    log = TransactionLog(open_store(config), "db/_catalog", checkpoint_interval=0)
    for i in range(per_process):
        log.commit("add", add(f"p{n}-{i}"))


@pytest.mark.slow
def test_many_processes_racing_lose_nothing(object_store):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_commit_many, args=(object_store.config(), n, 4)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    state = TransactionLog(object_store, "db/_catalog").latest()
    assert len(state.files) == 12 and state.txn_id == 11
    for i in range(12):
        TransactionLog(object_store, "db/_catalog").read_transaction(i)


def test_pruning_only_from_the_beginning_and_only_where_covered(object_store):
    log = TransactionLog(object_store, "db/_catalog", checkpoint_interval=5)
    for i in range(12):
        log.commit("add", add(f"f{i}", frontier=i))
    assert log.prune(3) == 0  # no checkpoint at or below 3 covers anything
    assert log.prune(7) == 5  # checkpoint 5 covers 0..4
    with pytest.raises(TransactionNotFoundError):
        log.state_at(4)
    for i in range(5, 12):
        assert set(log.state_at(i).files) == {f"f{j}" for j in range(i + 1)}
    assert TransactionLog(object_store, "db/_catalog").latest().txn_id == 11
    assert log.earliest_retained() == 5


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupted_transaction_is_a_typed_error_naming_the_file(object_store, damage):
    log = TransactionLog(object_store, "db/_catalog", checkpoint_interval=0)
    log.commit("add", add("f1"))
    log.commit("add", add("f2"))
    path = log.transaction_path(1)
    data = object_store.get(path)
    broken = data[: len(data) // 2] if damage == "truncate" else data.replace(b"f2", b"f3")
    object_store.put(path, broken)
    with pytest.raises(CorruptTransactionError) as info:
        TransactionLog(object_store, "db/_catalog").latest()
    assert path in str(info.value)
