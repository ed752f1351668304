"""Property: whatever maintenance runs, in whatever order, every answer equals the model's.

Random histories are compacted segment by segment, interleaved with merge, retention
(with a cold tier), cold-tier load-back, rebuild_catalog, cleanup (grace 0 and grace
> 0) and crashed merges and retentions. After each step every query API is compared
with the in-memory model (``model.py``) at every answerable T, and verify() finds
nothing. Sizes are small so that the whole property runs in well under a minute.
"""

from __future__ import annotations

import os
import random
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from history_pipeline import HistoryStore, PurgedTimestampError
from history_pipeline.compaction.compactor import CompactionSummary, compact_segment
from history_pipeline.io.store import open_store
from history_pipeline.maintenance import merge as merge_module
from history_pipeline.maintenance import retention as retention_module
from history_pipeline_tests.model import BaseDatabase
from history_pipeline_tests.test_compaction import _split, random_history, write

STEPS = ["compact", "merge", "retain", "load_back", "rebuild", "cleanup_now", "cleanup_grace",
         "crash_merge", "crash_retain", "snapshot", "snapshot"]

#: hypothesis examples per run (HP_EXAMPLES=60 for a longer search)
EXAMPLES = int(os.environ.get("HP_EXAMPLES", "4"))


class Crash(Exception):
    pass


def _crash(step):
    if step == "files_written":
        raise Crash(step)


def mutations_by_key(events):
    """(table uuid, key) -> [(t, is_delete)], one entry per timestamp (versions consolidate)."""
    groups: dict[tuple[str, int], list[tuple[int, bool]]] = {}  # (t, live after the mutations at t)
    for e in events:
        if e["op"] in ("insert", "update", "delete"):
            seq = groups.setdefault((e["table_uuid"], e["key"]), [])
            if seq and seq[-1][0] == e["t"]:
                seq.pop()
            seq.append((e["t"], e["op"] != "delete"))
    out = {}
    for ident, seq in groups.items():
        live, versions = False, []
        for t, live_after in seq:
            if live or live_after:  # an insert and a delete at one t leave no version
                versions.append((t, not live_after))
            live = live_after
        out[ident] = versions
    return out


def _check_diff(store, model, applied_events, name, as_of):
    """diff from as_of - 1 to as_of against the model, across row events only (a schema change in
    between compares cast values, which the model does not model)."""
    if as_of - 1 < store.earliest:
        return
    uuid = next(u for u, t in model.state_as_of(as_of).items() if t["name"] == name)
    if any(e["t"] == as_of - 1 and e.get("table_uuid") == uuid and e["op"] not in ("insert", "update", "delete")
           for e in applied_events):
        return
    before, after = model.table_as_of(name, as_of - 1), model.table_as_of(name, as_of)
    if before is None:
        return
    got = store.diff(name, from_=as_of - 1, to=as_of)
    assert [d["key"] for d in got["inserted"]] == sorted(after.keys() - before.keys()), (name, as_of)
    assert [d["key"] for d in got["deleted"]] == sorted(before.keys() - after.keys()), (name, as_of)
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert [d["key"] for d in got["changed"]] == changed, (name, as_of)
    assert all(d["after"] == after[d["key"]] for d in got["changed"] + got["inserted"]), (name, as_of)


def check(store, model, applied_events):
    """Every API against the model at every answerable T (and below it: the typed error)."""
    earliest, frontier = store.earliest, store.frontier
    if earliest > 0:
        with pytest.raises(PurgedTimestampError):
            store.query_context().check_as_of(earliest - 1)
    for as_of in range(earliest, frontier + 2):
        state = model.state_as_of(as_of)
        assert sorted(d.table_name for d in store.get_catalog(as_of)) == sorted(t["name"] for t in state.values())
        for table in state.values():
            name = table["name"]
            expected = model.table_as_of(name, as_of)
            got = store.load_table(name, as_of)
            assert got.column_names == ["synthetic_key"] + model.column_order(name, as_of), (name, as_of)
            rows = {r.pop("synthetic_key"): r for r in got.to_pylist()}
            assert rows == expected, (name, as_of)
            for key in list(expected)[:1] + [10_000]:
                assert store.fetch_row(name, key, as_of) == expected.get(key), (name, key, as_of)
            counted = store.sql(f'SELECT count(*) AS n FROM "{name}"', as_of).to_pylist()
            assert counted == [{"n": len(expected)}], (name, as_of)
            _check_diff(store, model, applied_events, name, as_of)
    for (table_uuid, key), seq in mutations_by_key(applied_events).items():
        if not any(e.table_uuid == table_uuid for e in store.get_catalog(frontier + 1)):
            continue  # a dropped table's history is not asked for here
        below = [m for m in seq if m[0] < earliest]
        wanted = [m for m in seq if m[0] >= earliest]
        if below and not below[-1][1]:
            wanted.insert(0, below[-1])  # retention keeps the newest live version as of the purge point
        got = [(v["logical_timestamp"], v["is_deleted"]) for v in store.row_history(table_uuid, key)]
        assert got == wanted, (table_uuid, key)
    assert store.verify() == []


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), steps=st.lists(st.sampled_from(STEPS), min_size=3, max_size=8))
# orders of operations that once gave wrong answers (a load-back after a merge, a rebuild after retention and load-back)
@example(seed=7, steps=["compact", "compact", "retain", "compact", "merge", "load_back", "rebuild"])
@example(seed=11, steps=["compact", "compact", "compact", "retain", "rebuild", "cleanup_now", "load_back", "rebuild"])
@example(seed=5, steps=["compact", "compact", "crash_retain", "rebuild", "compact", "crash_merge", "rebuild",
                        "cleanup_grace"])
def test_every_answer_equals_the_model_whatever_maintenance_runs(tmp_path_factory, seed, steps):
    root = tmp_path_factory.mktemp("maint")
    events = random_history(seed, n_events=14)
    segments = _split(events, random.Random(seed))
    store = HistoryStore.open(root / "root", database="db")
    cold_uri = str(root / "cold")
    cold = open_store(cold_uri)
    write(store, *segments)  # every segment sealed; "compact" applies them one by one
    pending = [ref for ref in store.segments()]
    applied: list[dict] = []
    model = BaseDatabase()
    rng = random.Random(seed)
    steps = ["compact", *steps] + ["compact"] * len(segments)  # in the end, everything is applied
    for step in steps:
        if step == "compact" and pending:
            ref = pending.pop(0)
            compact_segment(store, ref, None, CompactionSummary())
            batch = segments[len(segments) - len(pending) - 1]
            for e in batch:
                model.apply(e)
            applied += batch
        elif step == "compact":
            continue  # nothing left to apply: nothing changed
        elif step == "merge":
            store.merge(spark=False, small_file_bytes=10**9)
        elif step == "crash_merge":
            try:  # crashes once its files are written (when there is anything to merge)
                merge_module.merge(store, None, small_file_bytes=10**9, on_step=_crash)
            except Crash:
                pass
        elif step in ("retain", "crash_retain") and store.frontier + 1 > store.earliest:
            purge = rng.randint(store.earliest + 1, store.frontier + 1)
            if step == "retain":
                store.retain(purge_before=purge, cold_tier=cold_uri, spark=False)
            else:
                try:
                    retention_module.retain(store, purge, cold, on_step=_crash)
                except Crash:
                    pass
        elif step == "load_back" and store.earliest > 0:
            store.load_cold_tier(cold_uri)
        elif step == "snapshot":
            store.refresh_snapshots(force=True, spark=False)
        elif step == "rebuild":
            store.rebuild_catalog()
        elif step == "cleanup_now":
            store.cleanup(grace=timedelta(0))
        elif step == "cleanup_grace":
            store.cleanup(grace=timedelta(hours=1))
        check(store, model, applied)
