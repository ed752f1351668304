"""finished_wal_segments_sensor: one compaction run per database for its newly sealed segments (a
batch, in order, at most one run of a database in flight), at a cost per tick
that follows what changed, not how many databases there are nor how long their history is.

A steady tick reads one folder: the change journal ``<wal base>/_changes/``
(:mod:`history_pipeline.wal.journal`), where every seal, quarantine, repair, skip and release
leaves an empty marker naming its database. Only the databases named there (and those pending:
not settled when last listed) are looked at: their two folders (``segments/`` and
``quarantine/``) are stat-ed and listed, their marks read from and written to the
:class:`~history_pipeline.orchestration.sensor_marks.MarksStore` (``<wal base>/_sensor/``), then
the markers read are deleted. The Dagster cursor holds four numbers (:class:`SensorCursor`), not
per-database state. A full scan (the WAL base read once, two folder stats per database, only
changed databases listed) runs on the first tick, when the journal is missing, and every
``HistoryRootResource.sensor_full_scan_every`` ticks, to catch WALs written by tools that do not
journal. ``applied/`` is never listed, no segment's contents are read, and no catalog or object
store is opened. The decision is a pure function of the listings, the marks and the cursor
(:func:`plan_tick`); the sensor body only gathers them and turns the plan into requests.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from history_pipeline.errors import HistoryError
from history_pipeline.orchestration.assets import compacted_batches, wal_segments
from history_pipeline.orchestration.partitions import (
    parse_segment_partition_key,
    segment_partition_key,
    segment_partitions,
)
from history_pipeline.orchestration.resources import (
    FULL_SCAN_EVERY,
    HistoryRootResource,
    SparkResource,
    folder_stamp,
)
from history_pipeline.orchestration.segment_runs import batch_run_config, compact_segments_job
from history_pipeline.orchestration.sensor_marks import (
    BlockedSummary,
    DatabaseMark,
    MarksStore,
    SegmentMark,
    Stamp,
    marks_path,
    summarize_blocked,
)
from history_pipeline.store import _DATABASE_RE
from history_pipeline.wal import SegmentState
from history_pipeline.wal.journal import Marker, consume, ensure_journal, journal_dir, read_journal
from history_pipeline.wal.segments import applied_dir, list_segments, public_reason, segment_name

#: materializes one partition from the UI or the CLI; the sensor requests ``compact_segments_job``
compact_segment_job = dg.define_asset_job(
    "compact_segment_job",
    selection=[wal_segments, compacted_batches],
    description="Verify one sealed segment and compact exactly it (earlier segments of its database first).",
    # both steps in the run's own process: a process per step costs ~2 s each and buys nothing
    # (the work runs on the Spark engine; the steps run one after the other anyway)
    executor_def=dg.in_process_executor,
)

#: runs of one database carry its name here; ``dagster.yaml`` serializes them per database
DATABASE_TAG = "history_pipeline/database"
#: every compaction run carries this tag; ``dagster.yaml`` caps how many run at once, over all databases
COMPACTION_TAG = "history_pipeline/compaction"

#: a folder changed less than this long before the tick is listed again on the next tick: folder
#: times are coarse (a kernel tick), so two changes close together can leave the same time
SETTLE_NS = 2_000_000_000
#: at most this many blocked databases are named in a skip reason
NAMED_IN_SKIP = 5
#: a run compacts at most this many segments, and (beyond its first) this many bytes of them, so
#: one run stays bounded in time and memory; the rest go to the database's next run
BATCH_MAX_SEGMENTS = 16
BATCH_MAX_BYTES = 64 * 1024 * 1024
#: run states in which a database's compaction run counts as in flight: no other is requested then
IN_FLIGHT = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)
#: the compaction tag's value on the runs the sensor requests
BATCH_TAG_VALUE = "segments"
#: the first and last segment of a run, for the run list
SEGMENTS_TAG = "history_pipeline/segments"

@dataclass(frozen=True)
class SegmentView:
    """What the sensor needs to know of one sealed or quarantined WAL segment."""

    database: str
    segment_id: int
    name: str
    state: SegmentState
    changed_ns: int  # the file's change time: a repaired or released segment is a new file
    reason: str | None = None  # why it is quarantined
    size_bytes: int = 0

    @property
    def key(self) -> str:
        return segment_partition_key(self.database, self.name)

    @property
    def version(self) -> str:
        return f"{self.key}@{self.changed_ns}"


@dataclass(frozen=True)
class RunBatch:
    """One run to request: sealed segments of one database, in id order."""

    database: str
    segments: tuple[SegmentView, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(v.key for v in self.segments)

    @property
    def run_key(self) -> str:
        """The first and last partition and a digest of every segment version: the same batch of
        the same files is the same run; a touched (repaired, retried) segment makes a new one."""
        digest = hashlib.sha256("\n".join(v.version for v in self.segments).encode()).hexdigest()[:16]
        return f"{self.segments[0].key}..{self.segments[-1].name}@{digest}"


@dataclass(frozen=True)
class SensorCursor:
    """The sensor's Dagster cursor: four numbers, whatever the number of databases (their marks
    are in the :class:`MarksStore`, whose rows this cursor commits)."""

    #: names this cursor's rows in the marks store; None: start afresh (a new epoch, a full scan)
    epoch: str | None = None
    #: ticks committed in this epoch: marks written at a higher generation belong to a tick whose
    #: cursor Dagster did not store, and are read as their previous version
    generation: int = 0
    #: ticks since the last full scan; None: no full scan yet (the next tick makes one)
    since_full_scan: int | None = None
    #: how many databases have a mark (for the skip reason)
    databases: int = 0

    def to_json(self) -> str:
        """Compact JSON: ``{"v": 2, "e": epoch, "g": generation, "n": since_full_scan, "d": databases}``."""
        return json.dumps({"v": 2, "e": self.epoch, "g": self.generation, "n": self.since_full_scan,
                           "d": self.databases}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> SensorCursor:
        """The cursor a tick stored; an empty, unreadable or older-format cursor starts afresh
        (every database is listed once, every pending segment registered and requested again:
        run keys keep that from launching twice)."""
        try:
            body = json.loads(text) if text else None
        except json.JSONDecodeError:
            return cls()
        if not isinstance(body, dict) or body.get("v") != 2 or not isinstance(body.get("e"), str):
            return cls()
        since, gen, count = body.get("n"), body.get("g"), body.get("d")
        return cls(body["e"], gen if isinstance(gen, int) else 0, since if isinstance(since, int) else None,
                   count if isinstance(count, int) else 0)


@dataclass(frozen=True)
class DatabaseListing:
    """One database's ``segments/`` and ``quarantine/`` folders as listed this tick."""

    database: str
    stamp: Stamp  # taken before listing, so a change during the listing shows on the next tick
    segments: tuple[SegmentView, ...]  # sealed and quarantined (open segments do not matter)


@dataclass(frozen=True)
class TickFacts:
    """What the sensor body looked up beside the listings (each only when a listing asks for it)."""

    #: versions of quarantines the failing run already reported on the partition itself
    observed: frozenset[str] = frozenset()
    #: keys of segments that left ``segments/`` for ``applied/`` (the others left the WAL)
    applied: frozenset[str] = frozenset()
    #: partition keys of databases that left the WAL base
    partitions_of_gone: tuple[str, ...] = ()
    #: databases with a compaction run queued or running: their new segments wait for its end
    in_flight: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TickPlan:
    """What one sensor evaluation does."""

    add_partitions: tuple[str, ...]
    delete_partitions: tuple[str, ...]
    runs: tuple[RunBatch, ...]
    report_quarantined: tuple[SegmentView, ...]
    cursor: SensorCursor
    marks: Mapping[str, DatabaseMark]  # the new marks of the databases listed this tick
    gone: tuple[str, ...]  # databases that left the WAL base: their marks go
    listed: tuple[str, ...]  # databases listed this tick
    reasons: Mapping[str, str] = field(default_factory=dict)  # why a listed database is held up
    #: listed databases with due segments that wait for their run in flight (or a batch's cap)
    held: tuple[str, ...] = ()


def databases_to_list(marks: Mapping[str, DatabaseMark], stamps: Mapping[str, Stamp]) -> list[str]:
    """Databases (of a full scan) whose folders may hold something new: without a mark, not
    settled when last listed, or with a folder time that moved since."""
    out = []
    for database, stamp in sorted(stamps.items()):
        mark = marks.get(database)
        if mark is None or mark.stamp is None or mark.stamp != stamp:
            out.append(database)
    return out


def full_scan_due(cursor: SensorCursor, journal_present: bool, every: int = FULL_SCAN_EVERY) -> bool:
    """Whether this tick scans every WAL: no full scan yet, no journal to read, or the
    ``every``-th tick since the last full scan."""
    return not journal_present or cursor.since_full_scan is None or cursor.since_full_scan + 1 >= every


def databases_to_check(pending: Iterable[str], named: Iterable[str]) -> list[str]:
    """Databases a steady tick (one that reads the journal instead of scanning) stats and lists:
    those named by journal markers, and the pending ones (:meth:`MarksStore.pending`)."""
    return sorted(set(pending) | {db for db in named if _DATABASE_RE.match(db)})


def plan_tick(
    cursor: SensorCursor,
    marks: Mapping[str, DatabaseMark],
    stamps: Mapping[str, Stamp],
    listings: Iterable[DatabaseListing],
    facts: TickFacts = TickFacts(),
    now_ns: int = 0,
    full_scan: bool = True,
    engine_ready: bool = True,
    max_segments: int = BATCH_MAX_SEGMENTS,
    max_bytes: int = BATCH_MAX_BYTES,
) -> TickPlan:
    """Partitions to add (newly seen sealed or quarantined segments) and remove (segments that
    left the WAL other than by being applied, and databases that left it), runs to request (per
    database without a run in flight, one batch of its sealed segments not requested before, in id
    order, none behind a quarantined one, at most ``max_segments`` and, beyond the first,
    ``max_bytes``; the others stay due and the database pending, for its next run),
    quarantines to report on their partition (once each, once the partition exists), the new marks
    of the databases listed, and the new cursor. ``marks`` holds the marks of every database looked
    at this tick (all of them on a full scan), ``stamps`` those of them still present: a database
    with a mark and no stamp left the WAL base. ``full_scan`` says whether this tick scanned every WAL.
    While the Spark engine does not answer (``engine_ready`` False) no run is requested: the
    segments stay due and their databases pending, so a later tick requests them.
    """
    adds: list[str] = []
    deletes: list[str] = list(facts.partitions_of_gone)
    runs: list[RunBatch] = []
    reports: list[SegmentView] = []
    reasons: dict[str, str] = {}
    held: list[str] = []
    new_marks: dict[str, DatabaseMark] = {}
    for listing in sorted(listings, key=lambda x: x.database):
        db = listing.database
        before = {s.segment_id: s for s in (marks[db].segments if db in marks else ())}
        views = sorted(listing.segments, key=lambda v: v.segment_id)
        segments: list[SegmentMark] = []
        blocked, settled = False, True
        batch: list[SegmentView] = []
        batch_bytes, full = 0, db in facts.in_flight
        for v in views:
            old = before.get(v.segment_id)
            # the same file as last tick, in the same state (a release or repair makes a new file)
            same = old is not None and old.changed_ns == v.changed_ns and old.quarantined == (
                v.state is SegmentState.QUARANTINED)
            if old is None:
                adds.append(v.key)
            if v.state is SegmentState.QUARANTINED:
                blocked = True
                reasons.setdefault(db, f"{v.key} is quarantined ({v.reason or 'no reason recorded'})")
                done = (same and old is not None and old.done) or v.version in facts.observed
                if not done and old is not None:  # its partition exists: say why on it
                    reports.append(v)
                    done = True
                settled = settled and done  # a partition added just now is reported on the next tick
                segments.append(SegmentMark(v.segment_id, v.changed_ns, True, done))
            else:
                done = same and old is not None and old.done
                if not done and not blocked:
                    full = full or len(batch) >= max_segments or (
                        bool(batch) and batch_bytes + v.size_bytes > max_bytes)
                    if engine_ready and not full:
                        batch.append(v)
                        batch_bytes += v.size_bytes
                        done = True
                    else:  # listed again next tick, whatever its folder times
                        settled = False
                        if engine_ready and (not held or held[-1] != db):
                            held.append(db)
                        reasons.setdefault(db, f"{v.key} waits for the Spark engine" if not engine_ready
                                           else f"{v.key} waits for the run of {db} in flight")
                segments.append(SegmentMark(v.segment_id, v.changed_ns, False, done))
        if batch:
            runs.append(RunBatch(db, tuple(batch)))
        seen = {v.segment_id for v in views}
        deletes += [segment_partition_key(db, segment_name(i)) for i in sorted(before)
                    if i not in seen and segment_partition_key(db, segment_name(i)) not in facts.applied]
        recent = max(listing.stamp) > now_ns - SETTLE_NS
        new_marks[db] = DatabaseMark(None if recent or not settled else listing.stamp, tuple(segments))
    gone = tuple(sorted(db for db in marks if db not in stamps))
    added = sum(db not in marks for db in new_marks)
    count = len(stamps) if full_scan else max(0, cursor.databases + added - len(gone))
    since = 0 if full_scan else (cursor.since_full_scan or 0) + 1
    new_cursor = SensorCursor(cursor.epoch, cursor.generation + 1, since, count)
    return TickPlan(tuple(adds), tuple(deletes), tuple(runs), tuple(reports), new_cursor, new_marks, gone,
                    tuple(sorted(new_marks)), reasons, tuple(held))


def skip_reason(plan: TickPlan, blocked: BlockedSummary) -> str:
    """Why no run was requested: how much was looked at, and which databases wait on an operator
    (``blocked``: the databases with a quarantined segment after this tick, from the marks store)."""
    head = "no run requested" if plan.held else "no sealed segment is waiting to be requested"
    skip = f"{head} ({plan.cursor.databases} database(s), {len(plan.listed)} listed this tick"
    if plan.held:
        skip += f"; {len(plan.held)} database(s) wait for their run in flight: " + "; ".join(
            plan.reasons[db] for db in plan.held[:NAMED_IN_SKIP])
    if blocked.databases:
        named = [plan.reasons.get(db, f"{segment_partition_key(db, segment_name(first))} is quarantined "
                                      "(the reason is on its partition)") for db, first in blocked.first]
        skip += "; " + "; ".join(named[:NAMED_IN_SKIP])
        if blocked.databases > NAMED_IN_SKIP:
            skip += f"; and {blocked.databases - NAMED_IN_SKIP} more quarantined database(s)"
        skip += (f"; {blocked.waiting} sealed segment(s) wait behind them" if blocked.waiting else "")
        skip += "; repair or skip them"
    return skip + ")"


# --- gathering (the only part that touches the file system and the instance) -----------------------


def _list_database(database: str, wal_dir: Path, stamp: Stamp) -> DatabaseListing:
    """The sealed and quarantined segments of one WAL: two folder reads, one stat per segment."""
    views = []
    for state in (SegmentState.SEALED, SegmentState.QUARANTINED):
        for ref in list_segments(wal_dir, state):  # lists that state's folder only
            try:
                stat = ref.path.stat()
            except FileNotFoundError:  # moved while listing (a run is applying it): seen next tick
                continue
            reason = None
            if state is SegmentState.QUARANTINED:
                # Dagster keeps what it is shown for good, beyond an erasure's reach: no value
                reason = public_reason(ref) or None
            views.append(SegmentView(database, ref.segment_id, ref.name, state, stat.st_ctime_ns, reason,
                                     stat.st_size))
    return DatabaseListing(database, stamp, tuple(views))


def _already_observed(instance: dg.DagsterInstance, view: SegmentView) -> bool:
    """True when the partition's newest observation already says it is quarantined for this reason."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=compacted_batches.key, asset_partitions=[view.key]), limit=1
    ).records
    if not records or records[0].asset_observation is None:
        return False
    metadata = records[0].asset_observation.metadata
    return (
        getattr(metadata.get("state"), "value", None) == "quarantined"
        and getattr(metadata.get("reason"), "value", None) == (view.reason or "no reason recorded")
    )


def _databases_in_flight(instance: dg.DagsterInstance) -> frozenset[str]:
    """Databases with a compaction run (one the sensor requested) queued or running: one query
    whose answer is bounded by the run queue, not by the number of databases."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(IN_FLIGHT), tags={COMPACTION_TAG: BATCH_TAG_VALUE}))
    return frozenset(run.tags[DATABASE_TAG] for run in runs if DATABASE_TAG in run.tags)


def full_scan_every(history: HistoryRootResource) -> int:
    """Ticks between full scans: the resource's ``sensor_full_scan_every`` (a whole number >= 1)."""
    every = history.sensor_full_scan_every
    if every < 1:
        raise HistoryError(f"HistoryRootResource.sensor_full_scan_every={every} is not a whole number of ticks "
                           f">= 1; set it to e.g. {FULL_SCAN_EVERY} (1: scan every WAL on every tick)")
    return every


@dataclass(frozen=True)
class _Gathered:
    marks: dict[str, DatabaseMark]  # of every database looked at
    stamps: dict[str, Stamp]
    listings: list[DatabaseListing]
    facts: TickFacts
    full_scan: bool
    journal: str
    consumed: tuple[Marker, ...]  # markers to delete once the tick is planned


def listen_due(cursor: SensorCursor, journal_present: bool, named: Iterable[str], in_flight: Iterable[str],
               every: int = FULL_SCAN_EVERY) -> bool:
    """Whether a tick keeps listening instead of looking: a steady tick (no full scan due) where
    every database it would look at (``named``: by a journal marker or pending) has a compaction
    run in flight, whose end it waits for (none named: it waits for a marker)."""
    if cursor.epoch is None or full_scan_due(cursor, journal_present, every):
        return False
    return frozenset(named) <= frozenset(in_flight)


#: seconds between two looks at the change journal (and at the runs in flight) while a tick listens
LISTEN_POLL_S = 0.1


def _listen(context: dg.SensorEvaluationContext, history: HistoryRootResource, store: MarksStore,
            cursor: SensorCursor, every: int) -> float:
    """Wait (up to ``sensor_listen_seconds``) while nothing can be requested yet: until a journal
    marker names a database without a run in flight, or the run in flight of a database the tick
    would look at ends. A segment sealed meanwhile, or the next batch of a database whose run just
    ended, is requested within a poll, not at the daemon's next loop. Returns the seconds waited."""
    seconds = history.sensor_listen_seconds
    if seconds <= 0:
        return 0.0
    journal = journal_dir(history.wal_base())
    pending = store.pending(cursor.epoch or "", cursor.generation)
    started = time.monotonic()
    while True:
        markers = read_journal(journal)
        named = set(pending) | {m.database for m in markers or ()}
        in_flight = _databases_in_flight(context.instance) if named else frozenset()
        waited = time.monotonic() - started
        if waited >= seconds or not listen_due(cursor, markers is not None, named, in_flight, every):
            return waited
        time.sleep(min(LISTEN_POLL_S, seconds - waited))


def _gather(context: dg.SensorEvaluationContext, history: HistoryRootResource, store: MarksStore,
            cursor: SensorCursor, every: int) -> _Gathered:
    base = str(history.wal_base())
    journal = journal_dir(base)
    # asked before any listing: a run that ends after this is seen as in flight, which only delays
    in_flight = _databases_in_flight(context.instance)
    markers = read_journal(journal)  # read before any WAL: a marker left after this survives the tick
    full = full_scan_due(cursor, markers is not None, every)
    if markers is None:
        # writers journal from now on; this tick's full scan sees everything that came before
        ensure_journal(base)
        markers = ()
    epoch, committed = cursor.epoch or "", cursor.generation
    if full:
        marks = store.read_all(epoch, committed)
        wal_dirs = history.wal_dirs()
        to_stamp = list(wal_dirs)
    else:
        to_stamp = databases_to_check(store.pending(epoch, committed), {m.database for m in markers})
        marks = store.read(epoch, committed, to_stamp)
        wal_dirs = {db: str(history.wal_dir(db)) for db in to_stamp}
    stamps: dict[str, Stamp] = {}
    unreadable: set[str] = set()
    for database in to_stamp:
        try:
            stamp = folder_stamp(wal_dirs[database])
        except OSError as exc:  # one unreadable WAL must not hold up the others: it is tried again next tick
            context.log.warning(f"could not read the WAL folder of {database} ({exc}); trying again next tick")
            unreadable.add(database)
            continue
        if stamp is not None:
            stamps[database] = stamp
    # a full scan lists what moved; a steady tick what a marker named or was pending, whatever its times
    to_list = databases_to_list(marks, stamps) if full else sorted(stamps)
    listings = []
    for database in to_list:
        try:
            listings.append(_list_database(database, Path(wal_dirs[database]), stamps[database]))
        except OSError as exc:  # its mark is kept as it was: the next tick lists it again if still changed
            context.log.warning(f"could not list the WAL of {database} ({exc}); trying again next tick")
            unreadable.add(database)
    # an unreadable WAL is still there: its mark (and its partitions) stay until it reads again
    for database in unreadable & set(marks):
        stamps[database] = marks[database].stamp or (0, 0)
    observed, applied = set(), set()
    for listing in listings:
        before = marks.get(listing.database, DatabaseMark(None))
        done = {(s.segment_id, s.changed_ns) for s in before.segments if s.quarantined and s.done}
        for v in listing.segments:
            if (v.state is SegmentState.QUARANTINED and (v.segment_id, v.changed_ns) not in done
                    and _already_observed(context.instance, v)):
                observed.add(v.version)
        seen = {v.segment_id for v in listing.segments}
        for s in before.segments:
            if s.segment_id not in seen and (applied_dir(Path(wal_dirs[listing.database]))
                                             / f"{segment_name(s.segment_id)}.sealed").exists():
                applied.add(segment_partition_key(listing.database, segment_name(s.segment_id)))
    gone: list[str] = []
    left = set(marks) - set(stamps)
    if left:  # rare: a database left the root; find its partitions
        gone = sorted(k for k in context.instance.get_dynamic_partitions(segment_partitions.name)
                      if parse_segment_partition_key(k)[0] in left)
    # a marker of a WAL that could not be read stays: the next tick tries that database again
    consumed = tuple(m for m in markers if m.database not in unreadable)
    facts = TickFacts(frozenset(observed), frozenset(applied), tuple(gone), in_flight)
    return _Gathered(marks, stamps, listings, facts, full, journal, consumed)


def _segments_tag(batch: RunBatch) -> str:
    first, last = batch.segments[0], batch.segments[-1]
    return first.name if first is last else f"{first.name}..{last.name} ({len(batch.segments)})"


def _begin(store: MarksStore, cursor: SensorCursor) -> SensorCursor:
    """The cursor to plan from: the stored one, or a new epoch (with a full scan) when there is
    none, it is of an older format, or the marks store no longer holds its epoch."""
    if cursor.epoch is not None and store.has_epoch(cursor.epoch):
        return cursor
    fresh = SensorCursor(uuid.uuid4().hex)
    store.start_epoch(fresh.epoch or "")
    return fresh


#: seconds between the sensor's ticks: a steady tick reads one folder, so ticking often is cheap and
#: a sealed segment waits at most this long for its run to be requested
SENSOR_INTERVAL_S = 1


@dg.sensor(job=compact_segments_job, minimum_interval_seconds=SENSOR_INTERVAL_S,
           default_status=dg.DefaultSensorStatus.RUNNING)
def finished_wal_segments_sensor(context: dg.SensorEvaluationContext, history: HistoryRootResource,
                                 spark: SparkResource) -> dg.SensorResult:
    """Register every sealed segment as a partition and request, per database without a compaction
    run in flight, one run for a batch of its sealed segments, in id order.

    Per database, the marks store remembers its folder times and its pending segments, and a tick
    reads the change journal to learn which databases to look at (a full scan of every WAL on the
    first tick and every ``sensor_full_scan_every`` ticks), so it lists only databases whose WAL
    changed and requests only segments not requested before. The run key names the batch's
    partitions and digests each segment file's change time: a segment an operator repaired,
    skipped or released (a new file) runs again. Partitions of segments that left the WAL are
    removed; a quarantined segment's partition gets an observation saying so and why.
    """
    every = full_scan_every(history)
    with MarksStore.open(marks_path(history.wal_base())) as store:
        cursor = _begin(store, SensorCursor.from_json(context.cursor))
        listened = _listen(context, history, store, cursor, every)
        now_ns = time.time_ns()
        looked = time.monotonic()
        got = _gather(context, history, store, cursor, every)
        gathered = time.monotonic()
        # probed after the runs in flight are read: a run that failed because the engine went away
        # is seen failed only after that, so the probe cannot predate the loss and retry at once
        engine_ready = spark.reachable()  # a socket connect to a Connect server or master, no session
        probed = time.monotonic()
        plan = plan_tick(cursor, got.marks, got.stamps, got.listings, got.facts, now_ns, got.full_scan,
                         engine_ready)
        epoch = cursor.epoch or ""
        if got.full_scan:
            store.purge_gone(epoch, cursor.generation)
        # written at the plan's generation: they count only once Dagster stores the plan's cursor
        store.write(epoch, cursor.generation, plan.marks, plan.gone)
        skip = None if plan.runs else skip_reason(plan, store.blocked(epoch, NAMED_IN_SKIP))
    done = time.monotonic()
    context.log.info(f"{plan.cursor.databases} database(s), {'full scan' if got.full_scan else 'journal read'}, "
                     f"{len(plan.listed)} listed, {len(plan.runs)} run(s) requested; listened {listened:.2f} s, "
                     f"looked in {gathered - looked:.3f} s, engine probe {probed - gathered:.3f} s, "
                     f"planned and marked in {done - probed:.3f} s")
    if not engine_ready:
        skip = f"the Spark engine at {spark.master} does not answer: sealed segments wait for it; {skip}"
    if skip:
        context.log.info(skip)  # in the tick's logs too, beside the tick's skip reason
    requests = [
        dg.RunRequest(run_key=batch.run_key, run_config=batch_run_config(list(batch.keys)),
                      tags={DATABASE_TAG: batch.database, COMPACTION_TAG: BATCH_TAG_VALUE,
                            SEGMENTS_TAG: _segments_tag(batch)})
        for batch in plan.runs
    ]
    partition_requests: list = []
    if plan.add_partitions:
        partition_requests.append(segment_partitions.build_add_request(list(plan.add_partitions)))
    if plan.delete_partitions:
        partition_requests.append(segment_partitions.build_delete_request(list(plan.delete_partitions)))
    observations = [
        dg.AssetObservation(
            asset_key=asset,
            partition=v.key,
            metadata={
                "state": "quarantined",
                "reason": dg.MetadataValue.text(v.reason or "no reason recorded"),
                "what to do": dg.MetadataValue.text(
                    f"history-pipeline --database {v.database} repair {v.segment_id} --events FILE, "
                    f"or skip {v.segment_id} --reason TEXT"
                ),
            },
        )
        for v in plan.report_quarantined
        for asset in (wal_segments.key, compacted_batches.key)
    ]
    # the marks are written: delete the markers read. If Dagster then fails to store the cursor, the
    # next tick reads the rows written here as uncommitted: it lists those databases again and plans
    # from their previous marks, so the same runs are requested again under the same run keys
    consume(got.journal, got.consumed)
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=partition_requests,
        asset_events=observations,
        cursor=plan.cursor.to_json(),
        skip_reason=skip,
    )


__all__ = [
    "BATCH_MAX_BYTES", "BATCH_MAX_SEGMENTS", "COMPACTION_TAG", "DATABASE_TAG", "FULL_SCAN_EVERY", "BlockedSummary",
    "DatabaseListing", "DatabaseMark", "MarksStore", "RunBatch", "SegmentMark", "SegmentView", "SensorCursor",
    "TickFacts", "TickPlan", "compact_segment_job", "compact_segments_job", "databases_to_check",
    "databases_to_list", "finished_wal_segments_sensor", "full_scan_due", "full_scan_every",
    "parse_segment_partition_key", "plan_tick", "skip_reason", "summarize_blocked",
]
