"""sql() keeps a table's live rows as of T as an in-memory table from the second query at T, for
every kind of read (closed, above an open interval's marks, layered): later queries at T answer
from memory, equal to the model; a T asked once reads the files; the sandbox's budget bounds it."""

from __future__ import annotations

import gc

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.files import is_closed_read, is_marked_read, select_files
from history_pipeline.errors import QueryError
from history_pipeline.query import sandbox
from history_pipeline_tests.model import replayed
from history_pipeline_tests.test_query_layers import CREATE, _delete, _insert, _load, _update
from history_pipeline_tests.test_read_path import damage_column

#: a snapshot after 60 versions, the open interval marked once 15 of them are unmarked
MARKED = StoreSettings(snapshot_min_versions=60, snapshot_ratio=0.2, mark_open_fraction=0.25)
#: no snapshot: every read is the versions' layers
LAYERED = StoreSettings(snapshot_min_versions=10**6)

QUERY = "SELECT count(*) AS c, sum(a) AS s, max(note) AS m FROM items"


def _read(store, as_of):
    selection = select_files(store.catalog_state(), "T", as_of)
    return ("closed" if is_closed_read(store.objects, selection)
            else "marked" if is_marked_read(store.objects, selection) else "layered")


def _files(store, as_of):
    selection = select_files(store.catalog_state(), "T", as_of)
    return selection.snapshot, selection.snapshot_as_of, selection.versions


def _history(store, marked):
    """Inserts, then batches of updates, deletes and re-inserts, each compacted; with ``marked`` a
    snapshot, then enough updates for the open interval to be marked, then a few more above the marks."""
    alive: set[int] = set()
    batches = [[CREATE] + [_insert(2, k, k) for k in range(40)]]
    for t in range(3, 9):
        batches.append([_update(t, k, 100 + t) for k in range(t % 4, 40, 4)] + [_delete(t, t)] +
                       [_insert(t, 40 + t, t)])
    events = []
    for batch in batches:
        events += _load(store, [batch], alive)
        store.refresh_snapshots(spark=False)
    if marked:
        store.refresh_snapshots(force=True, spark=False)
        t = store.frontier + 1
        for n in (20, 3):  # a marking's share of updates, then a few too few for the next one
            keys = sorted(alive)[:n]
            events += _load(store, [[_update(t + i, k, 7 * i) for i, k in enumerate(keys)]], alive)
            store.refresh_snapshots(spark=False)
            t += n
    return events


def _model(events, as_of):
    return replayed(events).table_as_of("items", as_of)


def _expected(events, as_of):
    rows = (_model(events, as_of) or {}).values()
    return [{"c": len(rows), "s": sum(r["a"] for r in rows if r["a"] is not None) if rows else None,
             "m": max((r["note"] for r in rows if r["note"] is not None), default=None)}]


@pytest.mark.parametrize("read", ["layered", "marked"])
def test_an_open_read_keeps_its_live_rows_as_a_table_from_the_second_query_at_t(tmp_path, read):
    """Above the open interval's marks, and over layers of versions with no marks, the second
    query at T keeps the live rows (every column); later queries at T then answer from them, equal
    to the model, even once the files' bytes are damaged, while a T asked only once reads the files."""
    store = HistoryStore.open(tmp_path, database="db", settings=MARKED if read == "marked" else LAYERED)
    events = _history(store, marked=read == "marked")
    as_of, other = store.frontier + 1, store.frontier
    assert _read(store, as_of) == _read(store, other) == read
    expected = _expected(events, as_of)
    assert store.sql(QUERY, as_of).to_pylist() == expected
    assert store.sql("SELECT count(*) AS c FROM items", other).to_pylist() == [{"c": _expected(events, other)[0]["c"]}]
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    before = kept.kept_bytes
    assert kept.deferred  # one query at T keeps nothing yet
    assert store.sql(QUERY, as_of).to_pylist() == expected  # the second keeps the rows
    assert kept.kept_bytes > before
    assert damage_column(store, "T", "n-1")
    assert store.sql(QUERY, as_of).to_pylist() == expected
    assert store.sql("SELECT a, note FROM items WHERE a >= 100 ORDER BY synthetic_key", as_of).num_rows > 0
    if _files(store, other) == _files(store, as_of):  # both T read the same files: their rows are kept once
        assert store.sql(QUERY, other).to_pylist() == _expected(events, other)
    else:
        with pytest.raises(QueryError):
            store.sql(QUERY, other)


def test_the_live_rows_are_not_kept_past_the_sandbox_budget(tmp_path, monkeypatch):
    """Past the sandbox's budget the second query at T keeps nothing and reads the files, so it
    still answers, and a damaged column fails it as with the files alone."""
    monkeypatch.setattr(sandbox, "KEPT_BYTES", 0)
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED)
    events = _history(store, marked=False)
    as_of = store.frontier + 1
    for _ in range(2):
        assert store.sql(QUERY, as_of).to_pylist() == _expected(events, as_of)
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    assert kept.kept_bytes == 0 and not kept.deferred
    assert damage_column(store, "T", "n-1")
    with pytest.raises(QueryError):
        store.sql(QUERY, as_of)


def test_forgetting_a_t_frees_what_it_kept_and_the_next_query_there_answers_the_same(tmp_path):
    """``QueryContext.forget(T)`` drops T's views, kept tables and idle cursors and frees their bytes
    from the sandbox's budget (another T's stay); the next queries at T keep them again, freed again.
    ``forget()`` drops the state's whole sandbox. Answers never change."""
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED)
    events = _history(store, marked=False)
    as_of, other = store.frontier + 1, store.frontier
    for t in (other, as_of):
        for _ in range(2):
            assert store.sql(QUERY, t).to_pylist() == _expected(events, t)
    key = store.query_context()._sandbox_key()
    con, kept = sandbox._sandboxes[key]
    # a state's tables kept for every T reading the same files stay; those of one T go with it
    per_t = lambda: kept.kept_bytes - sum(size for _, size in kept.intervals.values())  # noqa: E731
    both = per_t()
    schema = sandbox.AS_OF_SCHEMA.format(as_of=as_of)
    cursors = list(kept.idle[schema])
    store.query_context().forget(as_of)
    without = per_t()
    assert 0 < without < both
    assert schema not in kept.schemas and schema not in kept.idle
    assert con.sql(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name LIKE '{schema}%'").fetchall() == [(0,)]
    assert sandbox.AS_OF_SCHEMA.format(as_of=other) in kept.schemas
    for _ in range(2):
        assert store.sql(QUERY, as_of).to_pylist() == _expected(events, as_of)
    assert kept.idle[schema] and set(kept.idle[schema]) <= set(cursors)  # its cursors served T again, set up anew
    assert per_t() > without
    store.query_context().forget(as_of)  # what T kept again is freed again: nothing counted twice
    assert per_t() == without
    store.query_context().forget()
    assert key not in sandbox._sandboxes
    assert store.sql(QUERY, as_of).to_pylist() == _expected(events, as_of)


def _same_files_history(tmp_path, read: str) -> tuple[HistoryStore, list, list[int]]:
    """A store whose history ends in one compaction of updates, deletes and re-inserts at several t,
    its events, and the longest run of T that all read the same files by ``read``."""
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED if read == "layered" else MARKED)
    events = _history(store, marked=read != "layered")
    t = store.frontier + 1
    alive = set(_model(events, t) or {})
    # every T among these t reads the compaction's file
    events += _load(store, [[_update(t + i, k, 50 + i) for i, k in enumerate(sorted(alive)[:6])] +
                            [_delete(t + 6, min(alive)), _insert(t + 7, min(alive), 3)]], alive)
    if read == "closed":  # the interval below the newest snapshot, closed by it
        store.refresh_snapshots(force=True, spark=False)
    groups: dict = {}
    for t in range(1, store.frontier + 2):
        groups.setdefault(_files(store, t), []).append(t)
    times = max((ts for ts in groups.values() if _read(store, ts[0]) == read), key=len)
    return store, events, times


@pytest.mark.parametrize("read", ["layered", "marked", "closed"])
def test_the_rows_every_t_of_the_same_files_reads_are_kept_once_from_the_second_t(tmp_path, read):
    """The first query at a second T reading the same files as an earlier T keeps their rows once for
    the state, each with its key's next t; the first query at every later such T is a filter over
    them (no table kept per T), equal to the model at each T, even once the files' bytes are damaged."""
    store, events, times = _same_files_history(tmp_path, read)
    assert len(times) >= 4
    assert store.sql(QUERY, times[0]).to_pylist() == _expected(events, times[0])
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    assert not kept.intervals
    assert store.sql(QUERY, times[1]).to_pylist() == _expected(events, times[1])
    (table,) = kept.intervals.values()
    assert damage_column(store, "T", "n-1")
    for t in times[2:]:
        assert store.sql(QUERY, t).to_pylist() == _expected(events, t)
        assert store.sql("SELECT count(*) AS c FROM items WHERE a >= 100", t).to_pylist() == [
            {"c": sum(1 for r in (_model(events, t) or {}).values() if r["a"] is not None and r["a"] >= 100)}]
    assert list(kept.intervals.values()) == [table]
    per_t = {sandbox.AS_OF_SCHEMA.format(as_of=t) + "_changes" for t in times[2:]}
    assert not [s for (s,) in con.sql("SELECT schema_name FROM duckdb_tables()").fetchall() if s in per_t]


@pytest.mark.parametrize("read", ["marked", "closed"])
def test_the_first_query_at_every_later_t_of_the_same_files_reads_views_those_t_share(tmp_path, read):
    """From the third T reading the same files, a first query at T makes no schema or view of its
    own: it reads views those T share, T set as a variable of its own cursor (a DuckDB variable is
    per connection), so queries at different T open at once each answer at their own T; a second
    query at such a T makes T's own views and keeps its live rows, as before."""
    store, events, times = _same_files_history(tmp_path, read)
    assert len(times) >= 5
    for t in times[:2]:
        assert store.sql(QUERY, t).to_pylist() == _expected(events, t)
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    later = times[2:-1][:sandbox.IDLE_CURSORS]
    # one cursor each, all open before any is read; read newest first
    readers = [store.sql_reader(QUERY, t) for t in later]
    assert [r.read_all().to_pylist() for r in reversed(readers)] == [_expected(events, t) for t in reversed(later)]
    own = {sandbox.AS_OF_SCHEMA.format(as_of=t) for t in later}
    assert not own & kept.schemas
    (shared,) = [s for s in kept.schemas if s.startswith(sandbox.AS_OF_SCHEMA.format(as_of="s"))]
    cursors = kept.idle[shared]
    assert sorted(pooled.as_of for pooled in cursors) == later
    for pooled in cursors:  # each cursor kept reads its own T
        assert pooled.con.sql(QUERY).to_arrow_table().to_pylist() == _expected(events, pooled.as_of)
    # a finished query's cursor serves the next T of the shared views, its variable set anew
    t = times[-1]
    history = len([e for e in store.catalog_state().schema_history if e.logical_timestamp < t])
    both = "SELECT (SELECT count(*) FROM items) AS c, count(*) AS h FROM _history_catalog.schema_history"
    assert store.sql(both, t).to_pylist() == [{"c": _expected(events, t)[0]["c"], "h": history}]
    assert sandbox.AS_OF_SCHEMA.format(as_of=t) not in kept.schemas
    # the second query at a T the shared views served makes its own, keeping its live rows
    before = kept.kept_bytes
    assert store.sql(QUERY, later[0]).to_pylist() == _expected(events, later[0])
    assert sandbox.AS_OF_SCHEMA.format(as_of=later[0]) in kept.schemas and kept.kept_bytes > before


def _kept_alone(store, as_of) -> int:
    """The bytes the sandbox keeps for two queries at ``as_of`` in a fresh sandbox (dropped after)."""
    store.query_context().forget()
    for _ in range(2):
        store.sql(QUERY, as_of)
    kept = sandbox._sandboxes[store.query_context()._sandbox_key()][1].kept_bytes
    store.query_context().forget()
    return kept


def test_past_the_budget_what_the_least_recent_t_kept_gives_way_to_the_t_asked_now(tmp_path, monkeypatch):
    """With room for one T's kept live rows only, the second query at a newer T drops what an older
    T kept (its views and tables, their bytes freed) and keeps its own: its repeated queries read
    memory, not the files; the older T, asked again, reads the files, then keeps its rows again."""
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED)
    events = _history(store, marked=False)
    old, new = store.frontier, store.frontier + 1
    assert _files(store, old) != _files(store, new)
    sizes = {t: _kept_alone(store, t) for t in (old, new)}
    assert all(sizes.values())
    monkeypatch.setattr(sandbox, "KEPT_BYTES", max(sizes.values()))
    for _ in range(2):
        assert store.sql(QUERY, old).to_pylist() == _expected(events, old)
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    old_schema, new_schema = (sandbox.AS_OF_SCHEMA.format(as_of=t) for t in (old, new))
    assert kept.schema_bytes == {old_schema: sizes[old]}
    for _ in range(2):
        assert store.sql(QUERY, new).to_pylist() == _expected(events, new)
    assert kept.schema_bytes == {new_schema: sizes[new]} and kept.kept_bytes == sizes[new]
    assert old_schema not in kept.schemas and not kept.deferred
    assert con.sql(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name LIKE '{old_schema}%'").fetchall() == [(0,)]
    assert damage_column(store, "T", "n-1")
    assert store.sql(QUERY, new).to_pylist() == _expected(events, new)  # from memory
    with pytest.raises(QueryError):  # its rows were dropped: it reads the files
        store.sql(QUERY, old)


def _old_t_kept_within_budget(tmp_path, monkeypatch):
    """A layered history whose newest T (``old``) kept its live rows from two queries, the budget
    set to what one T keeps alone; ``new`` is the T after it. (store, events, old, new, the
    sandbox's kept state)"""
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED)
    events = _history(store, marked=False)
    old, new = store.frontier, store.frontier + 1
    monkeypatch.setattr(sandbox, "KEPT_BYTES", max(_kept_alone(store, t) for t in (old, new)))
    for _ in range(2):
        assert store.sql(QUERY, old).to_pylist() == _expected(events, old)
    _, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    return store, events, old, new, kept


def test_what_a_running_query_reads_does_not_give_way_until_it_is_done(tmp_path, monkeypatch):
    """A query still being read holds what its T kept: a newer T's second query finds no room and
    reads the files (its answer the same); once the older query is read, the newer T's next query
    keeps its rows, what the older T kept giving way, and the older T answers again."""
    store, events, old, new, kept = _old_t_kept_within_budget(tmp_path, monkeypatch)
    old_schema, new_schema = (sandbox.AS_OF_SCHEMA.format(as_of=t) for t in (old, new))
    reader = store.sql_reader(QUERY, old)
    for _ in range(2):
        assert store.sql(QUERY, new).to_pylist() == _expected(events, new)
    assert old_schema in kept.schema_bytes and new_schema not in kept.schema_bytes
    assert reader.read_all().to_pylist() == _expected(events, old)
    assert store.sql(QUERY, new).to_pylist() == _expected(events, new)
    assert new_schema in kept.schema_bytes and old_schema not in kept.schemas
    for _ in range(3):
        assert store.sql(QUERY, old).to_pylist() == _expected(events, old)


def test_a_reader_dropped_unread_holds_nothing_kept(tmp_path, monkeypatch):
    """A ``sql_reader`` dropped without being read gives its query up: what its T kept may give way
    to a newer T's rows again, as after a query read in full."""
    store, events, old, new, kept = _old_t_kept_within_budget(tmp_path, monkeypatch)
    old_schema, new_schema = (sandbox.AS_OF_SCHEMA.format(as_of=t) for t in (old, new))
    reader = store.sql_reader(QUERY, old)
    assert kept.using.get(old_schema)
    del reader
    gc.collect()
    assert not kept.using.get(old_schema)
    for _ in range(2):
        assert store.sql(QUERY, new).to_pylist() == _expected(events, new)
    assert new_schema in kept.schema_bytes and old_schema not in kept.schemas


def test_a_query_running_while_its_t_is_forgotten_answers_and_its_cursor_serves_that_t_again(tmp_path):
    """``forget(T)`` while a query at T is still being read: it answers in full, and its cursor,
    given back, is set up anew for the next queries at T."""
    store = HistoryStore.open(tmp_path, database="db", settings=LAYERED)
    events = _history(store, marked=False)
    as_of = store.frontier + 1
    for _ in range(2):
        assert store.sql(QUERY, as_of).to_pylist() == _expected(events, as_of)
    reader = store.sql_reader(QUERY, as_of)
    store.query_context().forget(as_of)
    assert reader.read_all().to_pylist() == _expected(events, as_of)
    for _ in range(3):
        assert store.sql(QUERY, as_of).to_pylist() == _expected(events, as_of)


def test_past_the_budget_the_rows_kept_for_a_set_of_files_give_way_with_the_views_over_them(tmp_path, monkeypatch):
    """The rows kept for the T reading the same files give way, when least recent, to what a T of
    other files keeps now: the views over them (each T's own and the shared ones) go with them, and
    every such T answers again, equal to the model, from the files or rows kept anew."""
    store, events, times = _same_files_history(tmp_path, "marked")
    other = next(t for t in range(store.frontier + 1, 0, -1) if _files(store, t) != _files(store, times[0]))
    alone = _kept_alone(store, other)
    for t in times[:3]:
        assert store.sql(QUERY, t).to_pylist() == _expected(events, t)
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    assert kept.intervals and any(s.startswith(sandbox.AS_OF_SCHEMA.format(as_of="s")) for s in kept.schemas)
    monkeypatch.setattr(sandbox, "KEPT_BYTES", max(kept.kept_bytes, alone))
    (interval,) = kept.intervals.values()
    for _ in range(2):
        assert store.sql(QUERY, other).to_pylist() == _expected(events, other)
    assert not kept.intervals and sandbox.AS_OF_SCHEMA.format(as_of=other) in kept.schema_bytes
    assert not [s for s in kept.schemas if s.startswith(sandbox.AS_OF_SCHEMA.format(as_of="s"))]
    assert con.sql(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name || '.' || table_name = "
                   f"'{interval[0].replace(chr(34), '')}'").fetchall() == [(0,)]
    for t in times:
        assert store.sql(QUERY, t).to_pylist() == _expected(events, t)
