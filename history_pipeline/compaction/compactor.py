"""Compaction, effectful part: verified segments in, committed Parquet files out, exactly once.

Per sealed segment, in id order:

1. the driver reads and verifies it, and plans it (``plan_segment``);
2. one task per touched table (run on Spark executors when a session is
   given) reads the prior images of the keys it touches, folds the mutations,
   and writes version and snapshot files through the object store;
3. the driver writes the schema-history file and commits every file, the
   schema entries, the new frontier and the segment id in one catalog
   transaction;
4. only then is the segment moved to ``applied/``.

A crash before step 3 leaves only orphan files (garbage collection removes
them) and the segment pending; a crash after it leaves a segment the catalog
already lists as applied, which the next run just moves.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from history_pipeline.catalog.files import live_rows, write_parquet
from history_pipeline.catalog.handle import CompactionHandle
from history_pipeline.catalog.model import (
    AddFile,
    AddSchemaHistory,
    AdvanceFrontier,
    ApplySegments,
    CatalogState,
    FileEntry,
    FileKind,
)
from history_pipeline.compaction import frames
from history_pipeline.compaction.order import above_upper_reason, order_runs
from history_pipeline.compaction.plan import SegmentPlan, TablePlan, fold_table, images_from_rows, plan_segment
from history_pipeline.errors import (
    CatalogError,
    HistoryError,
    MalformedRecordError,
    SegmentCorruptedError,
    SegmentQuarantinedError,
    TimestampOrderError,
)
from history_pipeline.execution import (
    check_paths_visible,
    executor_store_config,
    map_tasks,
    open_executor_store,
    share_credentials,
    store_for_tasks,
)
from history_pipeline.io.store import ObjectStore
from history_pipeline.schema import SchemaHistoryEntry, Supercolumn, replay_schema_history
from history_pipeline.supertable import (
    FileMetadata,
    new_file_path,
    schema_history_table,
    versions_to_arrow,
)
from history_pipeline.types import from_arrow_value
from history_pipeline.wal.segments import (
    SealedSegment,
    SegmentContents,
    SegmentRef,
    SegmentState,
    list_segments,
    move_segment,
    quarantine_segment,
    read_segment,
)

StepHook = Callable[[str], None]


@dataclass(frozen=True)
class TableTask:
    """Everything one executor needs to fold and write one table of one segment (picklable)."""

    store_config: dict[str, Any]
    database: str
    plan: TablePlan
    files: tuple[FileEntry, ...]
    supercolumns_before: tuple[Supercolumn, ...]
    supercolumns_after: tuple[Supercolumn, ...]
    prior_as_of: int
    txn_hint: int
    segment_id: int
    attempt: str | None = None


@dataclass(frozen=True)
class TaskOutcome:
    entries: tuple[FileEntry, ...] = ()
    versions: int = 0
    error: tuple[str, str, int | None, str] | None = None  # (class, segment, line, message)


def run_table_task(task: TableTask) -> TaskOutcome:
    """Read prior images, fold, write files. Errors come back as data, not as executor crashes."""
    try:
        return _run_table_task(task)
    except MalformedRecordError as exc:
        return TaskOutcome(error=(type(exc).__name__, exc.segment or task.plan.segment, exc.line, exc.reason))


def _run_table_task(task: TableTask) -> TaskOutcome:
    store = open_executor_store(task.store_config)
    plan = task.plan
    keys = None if plan.needs_all_keys else sorted(plan.touched_keys)
    prior: dict = {}
    if task.files and (keys is None or keys):
        state = CatalogState(files=MappingProxyType({f.path: f for f in task.files}))
        rows = live_rows(store, state, plan.table_uuid, task.supercolumns_before, task.prior_as_of, keys)
        types = {s.name: s.data_type for s in task.supercolumns_before}
        decoded = [
            {name: (from_arrow_value(types[name], v) if name in types else v) for name, v in row.items()}
            for row in rows.to_pylist()
        ]
        prior = images_from_rows(decoded, types)
    result = fold_table(plan, prior)
    entries: list[FileEntry] = []
    segments = (task.segment_id,)
    if result.versions:
        table = versions_to_arrow(result.versions, task.supercolumns_after)
        entries.append(_write(store, task, table, FileKind.VERSIONS, None, segments))
    for as_of, rows_then in result.snapshots:
        table = versions_to_arrow(rows_then, task.supercolumns_after)
        entries.append(_write(store, task, table, FileKind.SNAPSHOT, as_of, segments))
    return TaskOutcome(entries=tuple(entries), versions=len(result.versions))


def _write(
    store: ObjectStore,
    task: TableTask,
    table: pa.Table,
    kind: FileKind,
    snapshot_as_of: int | None,
    segments: tuple[int, ...],
) -> FileEntry:
    meta = FileMetadata(
        database=task.database,
        table_uuid=task.plan.table_uuid,
        kind=kind,
        txn_id=task.txn_hint,
        lower=task.prior_as_of,
        upper=task.plan.mutations[-1].t + 1 if task.plan.mutations else task.prior_as_of,
        segments=segments,
        snapshot_as_of=snapshot_as_of,
        attempt=task.attempt,
    )
    path = new_file_path(task.database, task.plan.table_uuid, kind, task.txn_hint)
    return write_parquet(store, path, table, meta)


def run_tasks(tasks: Sequence[TableTask], spark: Any | None) -> list[TaskOutcome]:
    """Run table tasks on Spark executors (one partition each), or in-process without a session."""
    return map_tasks(spark, run_table_task, tasks)


# --- the driver ------------------------------------------------------------------


@dataclass(frozen=True)
class AppliedSegment:
    """What applying one segment did (its own catalog transaction): the figures of that segment
    alone, however many segments the compaction applied."""

    segment_id: int
    versions_written: int
    files_written: int
    bytes_written: int
    tables_touched: frozenset[str]
    schema_changes: int
    #: the frontier before and after its commit
    frontier_before: int
    frontier: int


@dataclass
class CompactionSummary:
    """What a compaction did."""

    segments_applied: list[int] = field(default_factory=list)
    versions_written: int = 0
    files_written: int = 0
    bytes_written: int = 0
    tables_touched: set[str] = field(default_factory=set)
    frontier: int = -1
    schema_changes: int = 0
    #: each segment this compaction applied, in the order applied
    applied: list[AppliedSegment] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "segments_applied": list(self.segments_applied),
            "versions_written": self.versions_written,
            "files_written": self.files_written,
            "bytes_written": self.bytes_written,
            "tables_touched": sorted(self.tables_touched),
            "frontier": self.frontier,
            "schema_changes": self.schema_changes,
        }


def pending_segments(wal_dir: Any, state: CatalogState) -> tuple[list[SegmentRef], SegmentRef | None]:
    """Sealed segments not yet applied, in order, cut at the first quarantined one before them."""
    refs = list_segments(wal_dir)
    quarantined = [r for r in refs if r.state is SegmentState.QUARANTINED]
    blocker = quarantined[0] if quarantined else None
    pending = [
        r
        for r in refs
        if r.state is SegmentState.SEALED and (blocker is None or r.segment_id < blocker.segment_id)
    ]
    return pending, blocker


@dataclass(frozen=True)
class SegmentResult:
    """What applying one segment produced, ready to commit."""

    segment_id: int
    segment: str
    lower: int
    upper: int
    schema_entries: tuple[SchemaHistoryEntry, ...]
    entries: tuple[FileEntry, ...]
    versions: int
    tables: frozenset[str]


def check_order(contents: SegmentContents, frontier: int) -> None:
    """The writer's ordering rules, checked again on a sealed segment (one written by another
    producer may break them): timestamps never go backwards, nothing at or below the compacted
    frontier or the segment's lower bound, nothing above its upper bound, a schema change has a
    timestamp of its own. A :class:`TimestampOrderError` names the segment and line."""
    from history_pipeline.wal.writer import WalPosition

    position = WalPosition(closed_t=max(contents.lower, frontier))
    for line, event in contents.events[1:]:
        try:
            if event.t > contents.upper:
                raise TimestampOrderError(above_upper_reason(event.t, contents.upper))
            position = position.admit(event)
        except TimestampOrderError as exc:
            raise TimestampOrderError(exc.reason, segment=contents.ref.name, line=line) from None


def _apply_in_process(
    store: CompactionHandle, ref: SegmentRef, state: CatalogState, on_step: StepHook, spark: Any | None, attempt: str
) -> SegmentResult:
    """The per-event path: plan on the driver, fold in table tasks (on Spark executors when a session is given)."""
    contents = read_segment(ref)
    check_order(contents, state.frontier)
    schema = replay_schema_history(state.schema_history)
    plan = plan_segment(contents, schema)
    on_step("planned")
    tasks = _tasks(store, state, plan, attempt, store_for_tasks(spark, store.objects))
    outcomes = run_tasks(tasks, spark)
    failed = next((o.error for o in outcomes if o.error is not None), None)
    if failed is not None:
        raise MalformedRecordError(failed[3], segment=failed[1], line=failed[2])
    return SegmentResult(
        plan.segment_id, plan.segment, plan.lower, plan.upper, plan.schema_entries,
        tuple(e for o in outcomes for e in o.entries), sum(o.versions for o in outcomes),
        frozenset(t.plan.table_uuid for t in tasks),
    )


def files_per_table(rows: int) -> int:
    """How many files (write tasks, split by key range) a table's versions of one segment get."""
    return max(1, min(SPLIT_BUCKETS, -(-rows // SPLIT_THRESHOLD)))


def _apply_frames(
    store: CompactionHandle, ref: SegmentRef, state: CatalogState, spark: Any, on_step: StepHook, attempt: str
) -> SegmentResult:
    """The DataFrame path: the driver verifies, routes and plans; Spark decodes, folds and writes."""
    # one read verifies the seal and routes the row events in the writer's form (no Spark job)
    sealed, routed = frames.verify_and_route(ref)
    schema = replay_schema_history(state.schema_history)
    ctx = frames.FrameContext(
        store_config=executor_store_config(store.objects),
        database=store.database,
        prior_as_of=state.frontier + 1,
        txn_hint=state.txn_id + 1,
        segment_id=ref.segment_id,
        attempt=attempt,
    )
    if routed is not None:  # a group of one
        try:
            plan = frames.plan_frames(sealed, routed.records, routed.touched, schema, state)
            plan = plan.with_order(routed.order, state.frontier)
            on_step("planned")
            outcome = frames.run_group(spark, [frames.GroupMember(plan, routed, ctx)], files_per_table)[0]
        finally:
            routed.remove()
    else:
        # routing and every table's decode read the parsed lines: split and parse the file once
        parsed = frames.parsed_lines(spark, sealed).persist()
        try:
            records, touched = frames.route(spark, parsed)
            plan = frames.plan_frames(sealed, records, touched, schema, state)
            plan = plan.with_order(order_runs(parsed, sealed.upper), state.frontier)
            on_step("planned")
            outcome = frames.run_segment(spark, plan, parsed, ctx, files_per_table)
        finally:
            parsed.unpersist()
    if outcome.error is not None:
        for entry in outcome.entries:  # written beside the failing line's check: never committed
            store.objects.delete(entry.path)
        raise outcome.error
    return SegmentResult(
        ref.segment_id, ref.name, sealed.lower, sealed.upper, plan.schema_entries, outcome.entries,
        outcome.versions, frozenset(w.table_uuid for w in plan.tables if w.rows or w.backfills),
    )


def compact_segment(
    store: CompactionHandle,
    ref: SegmentRef,
    spark: Any | None,
    summary: CompactionSummary,
    on_step: StepHook = lambda step: None,
) -> None:
    """Apply one sealed segment exactly once (see the module docstring)."""
    state = store.catalog.latest()
    if ref.segment_id in state.applied_segments:
        move_segment(ref, SegmentState.APPLIED, store.wal_dir)  # committed earlier; finish the move
        return
    attempt = uuid.uuid4().hex  # every file this attempt writes says so: rebuild adopts one attempt only
    read = _file_identity(ref.path)  # an erasure that masks the segment meanwhile replaces the file
    try:
        if spark is not None and store.settings.compaction_engine == "dataframes":
            plan = _apply_frames(store, ref, state, spark, on_step, attempt)
        else:
            plan = _apply_in_process(store, ref, state, on_step, spark, attempt)
    except (MalformedRecordError, SegmentCorruptedError) as exc:
        line = getattr(exc, "line", None)
        quarantine_segment(ref, store.wal_dir, str(exc), line)
        raise SegmentQuarantinedError(ref.name, str(exc)) from exc
    _commit(store, ref, read, state, plan, attempt, summary, on_step)


def _commit(
    store: CompactionHandle,
    ref: SegmentRef,
    read: tuple[int, int, int] | None,
    state: CatalogState,
    plan: SegmentResult,
    attempt: str,
    summary: CompactionSummary,
    on_step: StepHook,
) -> CatalogState:
    """Commit one segment's written files, schema entries, frontier and id in one catalog
    transaction (refused when the catalog moved on from ``state``), then move it to ``applied/``;
    returns the state the commit made."""
    on_step("files_written")
    entries = list(plan.entries)
    history_entry = _write_schema_history(store, state, plan, attempt)
    on_step("schema_history_written")

    applied_here = False  # did this run's transaction apply the segment (not a concurrent run's)?

    def build(current: CatalogState) -> list[Any] | None:
        nonlocal applied_here
        applied_here = False
        if plan.segment_id in current.applied_segments:
            return None
        if _file_identity(ref.path) != read:
            # checked on every commit attempt, so also after a racing erasure's commit
            raise HistoryError(
                f"segment {plan.segment} of {store.database} changed while it was compacted (an erasure masked "
                "it?); nothing was committed: run the compaction again"
            )
        if current.schema_history != state.schema_history or current.frontier != state.frontier:
            raise HistoryError(
                f"the catalog of {store.database} changed under compaction of segment {plan.segment}; run again"
            )
        actions: list[Any] = [AddFile(e) for e in [*entries, history_entry]]
        if plan.schema_entries:
            actions.append(AddSchemaHistory(plan.schema_entries))
        actions.append(AdvanceFrontier(max(plan.upper, current.frontier)))
        actions.append(ApplySegments((plan.segment_id,)))
        applied_here = True
        return actions

    committed = store.catalog.commit(f"compact segment {plan.segment}", build)
    on_step("committed")
    move_segment(ref, SegmentState.APPLIED, store.wal_dir)
    if not applied_here:  # a concurrent compaction applied it first: this run's files are orphans for cleanup
        summary.frontier = max(summary.frontier, committed.frontier)
        return committed
    applied = AppliedSegment(
        segment_id=plan.segment_id,
        versions_written=plan.versions,
        files_written=len(entries) + 1,
        bytes_written=sum(e.size_bytes for e in entries) + history_entry.size_bytes,
        tables_touched=frozenset(plan.tables) | {e.table_uuid for e in plan.schema_entries},
        schema_changes=len(plan.schema_entries),
        frontier_before=state.frontier,
        frontier=max(plan.upper, state.frontier),
    )
    summary.applied.append(applied)
    summary.segments_applied.append(plan.segment_id)
    summary.versions_written += applied.versions_written
    summary.files_written += applied.files_written
    summary.bytes_written += applied.bytes_written
    summary.tables_touched.update(applied.tables_touched)
    summary.schema_changes += applied.schema_changes
    summary.frontier = max(summary.frontier, plan.upper)
    return committed


@dataclass(frozen=True)
class _Pending:
    """A segment of a group: its ref, its file identity when read, its attempt and its member."""

    ref: SegmentRef
    read: tuple[int, int, int] | None
    attempt: str
    member: frames.GroupMember


#: segments of a group the driver verifies and routes at once (threads: the read, the checksum and
#: the Arrow and numpy kernels of routing leave the GIL, so a second core is not idle meanwhile)
ROUTE_THREADS = 2


def _read_and_route(ref: SegmentRef) -> tuple[tuple[int, int, int] | None, SealedSegment, frames.Routed | None]:
    """A segment's file identity (before the read), its verified bounds and its route."""
    read = _file_identity(ref.path)
    sealed, routed = frames.verify_and_route(ref)
    return read, sealed, routed


def _plan_group(store: CompactionHandle, refs: Sequence[SegmentRef], state: CatalogState) -> list[_Pending]:
    """The longest run of pending segments, from the first, that can share one Spark job: each
    verified and routed on the driver (one read each, ``ROUTE_THREADS`` segments at a time, in
    order of use) and planned from the schema the ones before it leave and the catalog as it is
    now, within the group's bounds. A segment that cannot join (corrupt, routed by Spark, applied
    already) ends the group; a segment whose schema records fail joins it as its last (it is
    quarantined in turn). Segments routed ahead that do not join leave no route file."""
    group: list[_Pending] = []
    schema = replay_schema_history(state.schema_history)
    frontier, rows = state.frontier, 0
    candidates: list[SegmentRef] = []
    for ref in refs[: frames.MAX_GROUP_SEGMENTS]:
        if ref.segment_id in state.applied_segments:
            break
        candidates.append(ref)
    pool = ThreadPoolExecutor(ROUTE_THREADS, thread_name_prefix="route")
    ahead: list[Future[tuple[tuple[int, int, int] | None, SealedSegment, frames.Routed | None]]] = []
    try:
        for j, ref in enumerate(candidates):
            while len(ahead) < min(j + ROUTE_THREADS, len(candidates)):
                ahead.append(pool.submit(_read_and_route, candidates[len(ahead)]))
            try:
                read, sealed, routed = ahead[j].result()
            except (SegmentCorruptedError, MalformedRecordError):
                break  # compact_segment quarantines it
            if routed is None:
                break
            plan = frames.plan_frames(sealed, routed.records, routed.touched, schema, state)
            plan = plan.with_order(routed.order, frontier)
            rows += sum(w.rows for w in plan.tables)
            if group and rows > frames.MAX_GROUP_ROWS:
                routed.remove()  # it leads the next group
                break
            attempt = uuid.uuid4().hex
            ctx = frames.FrameContext(
                store_config=executor_store_config(store.objects),
                database=store.database,
                prior_as_of=frontier + 1,
                txn_hint=state.txn_id + 1 + len(group),
                segment_id=ref.segment_id,
                attempt=attempt,
            )
            group.append(_Pending(ref, read, attempt, frames.GroupMember(plan, routed, ctx)))
            if plan.error is not None or plan.order_error is not None:
                break
            schema, frontier = plan.schema_after, max(frontier, sealed.upper)
    except BaseException:
        for pending in group:
            pending.member.routed.remove()
        raise
    finally:  # routed (ahead) but not joining: their files go (a failed read leaves none)
        for future in ahead[len(group) :]:
            _drop_route(future)
        pool.shutdown(wait=True)
    return group


def _drop_route(future: Future[tuple[Any, Any, frames.Routed | None]]) -> None:
    try:
        routed = future.result()[2]
    except Exception:  # its own error is reported when it leads a group
        return
    if routed is not None:
        routed.remove()


def _compact_group(
    store: CompactionHandle,
    state: CatalogState,
    group: Sequence[_Pending],
    spark: Any,
    summary: CompactionSummary,
    on_step: StepHook,
) -> None:
    """Apply a group of segments with one Spark job: then each is committed on its own, in order
    (its own catalog transaction, as ``compact_segment``), until the first bad one, which is
    quarantined alone; the files written for it and for the segments after it are deleted (those
    stay pending and are compacted again by the next run). ``state`` is the catalog the group
    was planned from."""
    try:
        on_step("planned")
        outcomes = frames.run_group(spark, [p.member for p in group], files_per_table)
    finally:  # the tasks have read them; a crash before this line leaves them to sweep_routes
        for pending in group:
            pending.member.routed.remove()
    for i, (pending, outcome) in enumerate(zip(group, outcomes, strict=True)):
        plan = pending.member.plan
        if outcome.error is not None:
            for later in outcomes[i:]:  # never committed: written beside a failing line or after it
                for entry in later.entries:
                    store.objects.delete(entry.path)
            exc = outcome.error
            quarantine_segment(pending.ref, store.wal_dir, str(exc), exc.line)
            raise SegmentQuarantinedError(pending.ref.name, str(exc)) from exc
        sealed = plan.segment
        result = SegmentResult(
            pending.ref.segment_id, pending.ref.name, sealed.lower, sealed.upper, plan.schema_entries,
            outcome.entries, outcome.versions, frozenset(w.table_uuid for w in plan.tables if w.rows or w.backfills),
        )
        state = _commit(store, pending.ref, pending.read, state, result, pending.attempt, summary, on_step)


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, modification time, size), None when gone: a file replaced or rewritten is told apart."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


#: a table's mutations are split by key into this many tasks once they are this many
SPLIT_BUCKETS = 4
SPLIT_THRESHOLD = 20_000


def split_by_key(plan: TablePlan, buckets: int) -> list[TablePlan]:
    """Independent pieces of a table's work: keys never straddle two (backfills need all keys)."""
    if plan.backfills or buckets <= 1 or len(plan.mutations) < SPLIT_THRESHOLD:
        return [plan]
    pieces = [TablePlan(plan.table_uuid, plan.segment) for _ in range(buckets)]
    for mutation in plan.mutations:
        pieces[mutation.key % buckets].mutations.append(mutation)
    return [p for p in pieces if p.mutations]


def _tasks(
    store: CompactionHandle, state: CatalogState, plan: SegmentPlan, attempt: str, store_config: dict[str, Any]
) -> list[TableTask]:
    tasks = []
    txn_hint = state.txn_id + 1
    pieces = [
        piece
        for table_plan in plan.tables.values()
        if table_plan.mutations or table_plan.backfills
        for piece in split_by_key(table_plan, SPLIT_BUCKETS)
    ]
    for table_plan in pieces:
        table_uuid = table_plan.table_uuid
        tasks.append(
            TableTask(
                store_config=store_config,
                database=store.database,
                plan=table_plan,
                files=tuple(state.files_of(table_uuid)),
                supercolumns_before=tuple(plan.schema_before.supercolumns.get(table_uuid, ())),
                supercolumns_after=tuple(plan.schema_after.supercolumns.get(table_uuid, ())),
                prior_as_of=state.frontier + 1,
                txn_hint=txn_hint,
                segment_id=plan.segment_id,
                attempt=attempt,
            )
        )
    return tasks


def _write_schema_history(store: CompactionHandle, state: CatalogState, plan: SegmentResult, attempt: str) -> FileEntry:
    """The commit's own record: its schema entries, segment and frontier, rebuildable from the file."""
    meta = FileMetadata(
        database=store.database,
        table_uuid=None,
        kind=FileKind.SCHEMA_HISTORY,
        txn_id=state.txn_id + 1,
        lower=plan.lower + 1,
        upper=plan.upper + 1,
        segments=(plan.segment_id,),
        frontier=plan.upper,
        attempt=attempt,
    )
    path = f"{store.database}/_history_catalog/schema_history/{plan.segment_id:020d}-{state.txn_id + 1:010d}.parquet"
    entry = write_parquet(store.objects, path, schema_history_table(plan.schema_entries), meta)
    return FileEntry(
        path=entry.path,
        kind=FileKind.SCHEMA_HISTORY,
        table_uuid=None,
        size_bytes=entry.size_bytes,
        row_count=entry.row_count,
        min_t=plan.lower + 1,
        max_t=plan.upper,
        segments=(plan.segment_id,),
    )


def check_catalog_not_lost(store: CompactionHandle, state: CatalogState) -> None:
    """Refuse to compact onto an empty catalog while segments are applied on disk: the catalog was
    lost (or replaced), and compacting on would quarantine valid segments as "unknown table"."""
    if state.txn_id >= 0:
        return
    applied = list_segments(store.wal_dir, SegmentState.APPLIED)
    if applied:
        raise CatalogError(
            f"the catalog of {store.database} is empty, but {len(applied)} segment(s) of its WAL are applied "
            f"(up to {applied[-1].name}): the catalog was lost; run `history-pipeline rebuild-catalog` first"
        )


def compact_pending(
    store: CompactionHandle, spark: Any | None = None, on_step: StepHook = lambda s: None
) -> CompactionSummary:
    """Compact every pending sealed segment of ``store`` in order; quarantine stops the line."""
    summary = CompactionSummary(frontier=store.catalog.latest().frontier)
    state = store.catalog.latest()
    check_catalog_not_lost(store, state)
    pending, blocker = pending_segments(store.wal_dir, state)
    compact_in_order(store, pending, spark, summary, on_step)
    if blocker is not None:
        from history_pipeline.wal.segments import quarantine_reason

        reason = quarantine_reason(blocker) or {}
        raise SegmentQuarantinedError(blocker.name, str(reason.get("error", "see its .error.json")))
    return summary


def compact_in_order(
    store: CompactionHandle,
    refs: Sequence[SegmentRef],
    spark: Any | None,
    summary: CompactionSummary,
    on_step: StepHook = lambda s: None,
) -> None:
    """Apply these sealed segments in order, each exactly once and in its own catalog transaction
    (``summary`` records each as it commits); on Spark, consecutive segments share one job where
    they can (``_plan_group``). The caller checked that no pending segment comes before or between
    them. A quarantine or any other failure stops at that segment, the ones before it applied."""
    if spark is not None and refs:
        check_paths_visible(spark, store.objects, store.wal_dir, getattr(store.settings, "shared_paths", False))
        share_credentials(spark, store.objects)
    grouped = spark is not None and store.settings.compaction_engine == "dataframes"
    at = 0
    try:
        while at < len(refs):
            state = store.catalog.latest()
            group = _plan_group(store, refs[at:], state) if grouped else []
            if group:  # planned from ``state``: each commit is refused if the catalog moved on from it
                _compact_group(store, state, group, spark, summary, on_step)
                at += len(group)
            else:
                compact_segment(store, refs[at], spark, summary, on_step)
                at += 1
    finally:  # route files a crashed run left for segments applied or quarantined since
        frames.sweep_routes(store.wal_dir, pending_segments(store.wal_dir, store.catalog.latest())[0])
