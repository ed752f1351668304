"""The capture loop: a PostgreSQL database's changes -> the history store's WAL (effectful).

Row changes come from a logical replication slot with the built-in ``pgoutput`` plugin, read
through the SQL interface (``pg_logical_slot_peek_binary_changes``); schema changes from rows
that the capture's event triggers write into ``history_capture.ddl_log`` (same stream, so in
commit order). One batch is: peek, append every new transaction's events and its ``close`` to the
WAL, fsync, save the capture state beside the WAL, then advance the slot to the last written
commit. A crash anywhere in between loses nothing (the slot still holds the transactions) and
duplicates nothing (transactions at or below the WAL's closed timestamp are not written again).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from history_pipeline.capture.live_keys import history_keys
from history_pipeline.capture.model import (
    CAPTURE_SCHEMA,
    CaptureOptions,
    CaptureState,
    split_transactions,
    transaction_events,
)
from history_pipeline.capture.pgoutput import Relation, decode_message
from history_pipeline.capture.values import SESSION_SETTINGS
from history_pipeline.errors import HistoryError
from history_pipeline.lsn import format_lsn, parse_lsn
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState, list_segments

SETUP_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {CAPTURE_SCHEMA};
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.ddl_log (
    id bigserial PRIMARY KEY,
    relid oid NOT NULL,
    dropped boolean NOT NULL DEFAULT false,
    description jsonb
);
-- a table's last description, which the trigger compares a DDL command's result with
CREATE INDEX IF NOT EXISTS ddl_log_relid ON {CAPTURE_SCHEMA}.ddl_log (relid, id);
-- attnum 0 names the table itself; a UUID is assigned once and kept while the object lives
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.ids (
    relid oid NOT NULL,
    attnum int2 NOT NULL,
    id uuid NOT NULL,
    PRIMARY KEY (relid, attnum)
);
-- the capture commits here when caught up, so that the LSNs users read are closed (answerable) too
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.heartbeat (id int PRIMARY KEY, at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.id_of(r oid, n int2) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE found uuid;
BEGIN
    SELECT id INTO found FROM {CAPTURE_SCHEMA}.ids WHERE relid = r AND attnum = n;
    IF found IS NULL THEN
        found := gen_random_uuid();
        INSERT INTO {CAPTURE_SCHEMA}.ids VALUES (r, n, found);
    END IF;
    RETURN found;
END $$;
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.describe(r oid) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object(
        'schema', n.nspname,
        'name', c.relname,
        'table_uuid', {CAPTURE_SCHEMA}.id_of(r, 0::int2),
        'key', (SELECT to_jsonb(conkey) FROM pg_constraint WHERE conrelid = r AND contype = 'p'),
        'columns', (
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                'attnum', a.attnum, 'name', a.attname, 'type_oid', a.atttypid::bigint, 'typmod', a.atttypmod,
                'type_name', format_type(a.atttypid, a.atttypmod), 'not_null', a.attnotnull,
                'column_uuid', {CAPTURE_SCHEMA}.id_of(r, a.attnum), 'has_default', a.atthasdef,
                'missing', CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END
            ) ORDER BY a.attnum), '[]'::jsonb)
            FROM pg_attribute a
            WHERE a.attrelid = r AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
        ))
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = r
$$;
-- a table's rows as they are now, for tables whose rows the stream never showed being written (tables that
-- existed before capture, CREATE TABLE AS): the description marked "snapshot", then rows holding the table's rows
-- as a two-dimensional array (a row per table row, as a one-dimensional array before) of every column's text
-- output, printed with the capture's session settings
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.snapshot_rows (id bigserial PRIMARY KEY, relid oid NOT NULL, vals text[]);
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.snapshot(r oid) RETURNS void LANGUAGE plpgsql
SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'iso_8601' SET TimeZone = 'UTC' SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
DECLARE cols text;
BEGIN
    -- writers that started earlier commit first (so their changes precede the snapshot); later ones wait
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', r::regclass);
    INSERT INTO {CAPTURE_SCHEMA}.ddl_log (relid, description)
    VALUES (r, {CAPTURE_SCHEMA}.describe(r) || '{{"snapshot": true, "has_rows": false}}'::jsonb);
    -- format's %s prints through the type's output function, as logical decoding does (::text would not:
    -- it trims CHAR(n) padding)
    SELECT string_agg(format('CASE WHEN %1$I IS NULL THEN NULL ELSE format(''%%s'', %1$I) END', attname), ', '
                      ORDER BY attnum) INTO cols
    FROM pg_attribute WHERE attrelid = r AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
    IF cols IS NULL THEN  -- no column: one empty array per row (a two-dimensional array cannot hold them)
        EXECUTE format('INSERT INTO {CAPTURE_SCHEMA}.snapshot_rows (relid, vals) SELECT %s, ARRAY[]::text[] FROM %s',
                       r, r::regclass);
    ELSE
        -- many rows per message (a two-dimensional array of about 1 MB): the capture's cost is per
        -- message as much as per value, so a row per message would make the snapshot several times slower
        EXECUTE format('INSERT INTO {CAPTURE_SCHEMA}.snapshot_rows (relid, vals) SELECT %s, array_agg(v) FROM ('
                       'SELECT v, sum(pg_column_size(v)) OVER (ROWS UNBOUNDED PRECEDING) / 1048576 AS chunk '
                       'FROM (SELECT ARRAY[%s]::text[] AS v FROM %s) AS t) AS c GROUP BY chunk',
                       r, cols, r::regclass);
    END IF;
    DELETE FROM {CAPTURE_SCHEMA}.snapshot_rows WHERE relid = r;
END $$;
-- Did this command change a column's type in a way whose result the capture cannot compute by CAST? A
-- plain ALTER TABLE ... TYPE (no USING) runs PostgreSQL's assignment casts, which the contract's CAST
-- repeats exactly as a session with the default output settings and TimeZone UTC computes them. Not so:
-- a USING expression; a time zone other than UTC where timestamptz is the old or new type; output
-- settings other than the defaults (DateStyle ISO, IntervalStyle postgres, extra_float_digits >= 1,
-- bytea_output hex), which print a value changed to text; a json column, whose text the capture keeps
-- only as its jsonb value. The statement text is the whole client query: a function or DO block hides
-- it, and then any type change counts.
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.retyped_inexactly(r oid, now_described jsonb) RETURNS boolean
LANGUAGE sql AS $$
    WITH before AS (
        SELECT description FROM {CAPTURE_SCHEMA}.ddl_log WHERE relid = r AND description IS NOT NULL
        ORDER BY id DESC LIMIT 1
    ), retyped AS (
        SELECT (o.value->>'type_oid')::oid AS was, (n.value->>'type_oid')::oid AS now
        FROM before, jsonb_array_elements(before.description->'columns') o
        JOIN jsonb_array_elements(now_described->'columns') n ON (o.value->'attnum') = (n.value->'attnum')
        WHERE (o.value->'type_oid', o.value->'typmod') IS DISTINCT FROM (n.value->'type_oid', n.value->'typmod')
    )
    SELECT EXISTS (SELECT 1 FROM retyped) AND (
        current_query() !~* '^\\s*alter\\s+table\\s' OR current_query() ~* '\\musing\\M'
        OR current_setting('DateStyle') NOT LIKE 'ISO%' OR current_setting('IntervalStyle') <> 'postgres'
        OR current_setting('extra_float_digits')::int < 1 OR current_setting('bytea_output') <> 'hex'
        OR EXISTS (SELECT 1 FROM retyped WHERE was IN (114, 199))  -- json, json[]
        OR (EXISTS (SELECT 1 FROM retyped WHERE 1184 IN (was, now) OR 1185 IN (was, now))  -- timestamptz(, [])
            AND current_setting('TimeZone') NOT IN ('UTC', 'Etc/UTC', 'GMT', 'Etc/GMT', 'UCT', 'Etc/UCT',
                                                    'Universal', 'Etc/Universal', 'Zulu', 'Etc/Zulu', 'GMT0',
                                                    'Etc/GMT0'))
    )
$$;
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.on_ddl_end() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE r oid; nonempty boolean; first_seen boolean;
BEGIN
    FOR r IN
        SELECT DISTINCT d.objid FROM pg_event_trigger_ddl_commands() d JOIN pg_class k ON k.oid = d.objid
        WHERE d.classid = 'pg_class'::regclass AND k.relkind IN ('r', 'p')
          AND d.schema_name IS DISTINCT FROM '{CAPTURE_SCHEMA}'
    LOOP
        first_seen := NOT EXISTS (SELECT 1 FROM {CAPTURE_SCHEMA}.ids WHERE relid = r AND attnum = 0);
        IF (SELECT relpersistence FROM pg_class WHERE oid = r) <> 'p' THEN
            -- temporary and unlogged tables write no WAL, so logical decoding never shows their rows: they
            -- are not captured, and a table set UNLOGGED leaves the history as if dropped
            IF NOT first_seen THEN
                INSERT INTO {CAPTURE_SCHEMA}.ddl_log (relid, dropped) VALUES (r, true);
                DELETE FROM {CAPTURE_SCHEMA}.ids WHERE relid = r;
            END IF;
            CONTINUE;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', r::regclass) INTO nonempty;
        IF first_seen AND nonempty THEN  -- CREATE TABLE AS, SELECT INTO: rows the stream showed before the table
            PERFORM {CAPTURE_SCHEMA}.snapshot(r);
        ELSIF nonempty AND {CAPTURE_SCHEMA}.retyped_inexactly(r, {CAPTURE_SCHEMA}.describe(r)) THEN
            -- the rows as the change left them (the stream shows no row of a table rewrite): the capture
            -- writes them as updates right after the type change
            PERFORM {CAPTURE_SCHEMA}.snapshot(r);
        ELSE
            INSERT INTO {CAPTURE_SCHEMA}.ddl_log (relid, description)
            VALUES (r, {CAPTURE_SCHEMA}.describe(r) || jsonb_build_object('has_rows', nonempty));
        END IF;
    END LOOP;
END $$;
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.on_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE o record;
BEGIN
    FOR o IN
        SELECT * FROM pg_event_trigger_dropped_objects()
        WHERE object_type = 'table' AND schema_name IS DISTINCT FROM '{CAPTURE_SCHEMA}'
    LOOP
        INSERT INTO {CAPTURE_SCHEMA}.ddl_log (relid, dropped) VALUES (o.objid, true);
        DELETE FROM {CAPTURE_SCHEMA}.ids WHERE relid = o.objid;
    END LOOP;
END $$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'history_capture_ddl') THEN
        CREATE EVENT TRIGGER history_capture_ddl ON ddl_command_end EXECUTE FUNCTION {CAPTURE_SCHEMA}.on_ddl_end();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'history_capture_drop') THEN
        CREATE EVENT TRIGGER history_capture_drop ON sql_drop EXECUTE FUNCTION {CAPTURE_SCHEMA}.on_drop();
    END IF;
END $$;
"""


_PG_EPOCH = 946_684_800.0  # 2000-01-01 UTC in UNIX seconds: PostgreSQL's timestamps count from there


class CaptureSetupError(HistoryError):
    """The database cannot be captured as configured (settings, privileges, connection)."""


@dataclass(frozen=True)
class CaptureConfig:
    """Where to capture from and how."""

    dsn: str
    slot: str = "history_capture"
    publication: str = "history_capture"
    options: CaptureOptions = field(default_factory=CaptureOptions)
    #: most decoded messages read per batch (a batch always ends at a transaction boundary)
    batch_messages: int = 10_000
    poll_interval_s: float = 0.5
    #: when caught up, commit a heartbeat this often so the frontier reaches the server's current LSN
    heartbeat_interval_s: float = 10.0


#: the WAL's row changes; every other operation but ``close`` changes a table's schema
_ROW_OPS = ("insert", "update", "delete")


@dataclass(frozen=True)
class CaptureProgress:
    """Where a capture run stands: what it captured, counted as the database's changes."""

    batches: int = 0
    transactions: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    schema_changes: int = 0
    last_t: int = -1
    lag_bytes: int | None = None
    #: how old the newest captured commit was when captured (0 when nothing was waiting)
    lag_seconds: float | None = None

    def counting(self, records: Iterable[Mapping[str, Any]]) -> CaptureProgress:
        """This progress with one more transaction: its WAL ``records``' row and schema changes (a
        transaction of no change, such as the capture's own heartbeat, is not counted)."""
        ops = Counter(record["op"] for record in records if record["op"] != "close")
        schema = sum(n for op, n in ops.items() if op not in _ROW_OPS)
        return replace(
            self, transactions=self.transactions + (1 if ops else 0), inserts=self.inserts + ops["insert"],
            updates=self.updates + ops["update"], deletes=self.deletes + ops["delete"],
            schema_changes=self.schema_changes + schema,
        )

    def line(self) -> str:
        """One line for a terminal."""
        last = format_lsn(self.last_t) if self.last_t >= 0 else "-"
        lag = "?" if self.lag_bytes is None else f"{self.lag_bytes} bytes"
        if self.lag_seconds is not None:
            lag += f", {self.lag_seconds:.1f} s"
        counts = ", ".join(
            _counted(n, noun) for n, noun in (
                (self.inserts, "insert"), (self.updates, "update"), (self.deletes, "delete"),
                (self.schema_changes, "schema change"),
            )
        )
        return (f"captured {_counted(self.transactions, 'transaction')} ({counts}) in "
                f"{_counted(self.batches, 'batch')}; last commit {last}; lag {lag}")


def _counted(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith('ch') else 's'}"


def default_slot_name(database: str) -> str:
    """A replication slot name for a history database (slot names allow [a-z0-9_])."""
    return "history_" + re.sub(r"[^a-z0-9_]", "_", database.lower())[:50]


def state_path(store: HistoryStore, slot: str) -> Path:
    """Where the capture state of ``slot`` is kept: beside the WAL it writes."""
    return store.wal_dir / "capture" / f"{slot}.json"


def load_state(path: Path) -> CaptureState:
    """The saved capture state, or the empty state before the first batch."""
    return CaptureState.from_json(path.read_text()) if path.exists() else CaptureState()


def save_state(path: Path, state: CaptureState) -> None:
    """Write the state durably (temp file, fsync, rename, fsync the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(state.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_unclosed_tail(wal_dir: Path) -> int:
    """Cut the records after the open segment's last ``close``: a transaction half-appended when a
    capture died. The slot still holds that transaction, so it is written again in full. Returns the
    number of records cut."""
    cut = 0
    for ref in list_segments(wal_dir, SegmentState.OPEN):
        data = ref.path.read_bytes()
        lines = data[: data.rfind(b"\n") + 1].splitlines(keepends=True)  # a torn last line goes too
        end = len(lines)
        while end > 0 and json.loads(lines[end - 1]).get("op") != "close":
            end -= 1
        keep = b"".join(lines[:end])
        if len(keep) != len(data):
            cut += len(lines) - end
            with open(ref.path, "r+b") as f:
                f.truncate(len(keep))
                os.fsync(f.fileno())
    return cut


@contextmanager
def _capture_lock(path: Path) -> Iterator[None]:
    """One capture per slot and WAL at a time (it also guards the tail repair before the writer opens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CaptureSetupError(f"another capture is running on {path.parent} (lock {path.name})") from None
        yield
    finally:
        os.close(fd)


def connect(dsn: str) -> Any:
    """An autocommit connection whose text output is what the value parsers read."""
    import psycopg

    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:  # (a DSN that does not parse: the latter)
        raise CaptureSetupError(f"cannot connect to PostgreSQL ({exc}); check --dsn") from None
    for name, value in SESSION_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    return conn


def setup(conn: Any, config: CaptureConfig) -> None:
    """Install the DDL capture, the publication and the slot (idempotent; needs a superuser)."""
    import psycopg

    level = conn.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        raise CaptureSetupError(
            f"the server runs with wal_level={level}; capture needs wal_level=logical (and max_replication_slots "
            ">= 1): set them in postgresql.conf and restart the server"
        )
    try:
        conn.execute(SETUP_SQL)
        exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (config.publication,)).fetchone()
        if not exists:
            conn.execute(f'CREATE PUBLICATION "{config.publication}" FOR ALL TABLES')
        slot = conn.execute(
            "SELECT plugin, database = current_database() FROM pg_replication_slots WHERE slot_name = %s",
            (config.slot,),
        ).fetchone()
        if slot is None:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (config.slot,))
            slot = ("pgoutput", True)
        if slot != ("pgoutput", True):
            raise CaptureSetupError(
                f"replication slot {config.slot!r} exists but is not a pgoutput slot of this database; "
                "choose another --slot"
            )
        # tables the capture has never described (they existed before it): their rows as they are now
        unseen = conn.execute(
            f"SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND n.nspname = ANY(%s) AND NOT EXISTS "
            f"(SELECT 1 FROM {CAPTURE_SCHEMA}.ids i WHERE i.relid = c.oid AND i.attnum = 0) ORDER BY c.oid",
            (list(config.options.schemas),),
        ).fetchall()
        for relid, name in unseen:
            if name not in config.options.exclude:
                conn.execute(f"SELECT {CAPTURE_SCHEMA}.snapshot(%s)", (relid,))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise CaptureSetupError(f"capture setup needs a superuser: {exc}") from None
    except psycopg.Error as exc:
        raise CaptureSetupError(f"capture setup failed: {exc}".strip()) from None


def _peek(conn: Any, config: CaptureConfig) -> list[Any]:
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, "
        "'proto_version', '1', 'publication_names', %s)",
        (config.slot, config.batch_messages, config.publication),
    ).fetchall()
    return [decode_message(bytes(row[0])) for row in rows]


def _heartbeat(conn: Any) -> None:
    # A commit after every LSN read so far: once captured, its close makes those LSNs answerable.
    conn.execute(
        f"INSERT INTO {CAPTURE_SCHEMA}.heartbeat VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now()"
    )


def _lag_bytes(conn: Any, slot: str) -> int | None:
    row = conn.execute(
        "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def run_capture(
    store: HistoryStore,
    config: CaptureConfig,
    *,
    once: bool = False,
    max_seconds: float | None = None,
    max_transactions: int | None = None,
    on_progress: Callable[[CaptureProgress], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> CaptureProgress:
    """Capture until stopped (Ctrl-C), or until caught up (``once``), a time or a transaction count.

    ``on_step`` is told "appended" after each WAL record, then "written" (WAL fsynced), "saved" (state
    saved) and "advanced" (slot moved) after each batch: the points a crash can fall between.
    """
    import psycopg

    step = on_step or (lambda name: None)
    conn = connect(config.dsn)
    started = time.monotonic()
    progress = CaptureProgress()
    path = state_path(store, config.slot)
    try:
        setup(conn, config)
        state = load_state(path)
        with _capture_lock(path.with_suffix(".lock")), _opened_writer(store) as wal:
            last_seal = time.monotonic()
            last_heartbeat = -float("inf")

            def live_keys(table_uuid: str, up_to: int) -> set[int]:
                wal.flush()  # the records of this batch's earlier transactions are history too
                return history_keys(store, table_uuid, up_to)

            heartbeat_pending = False
            while True:
                messages = _peek(conn, config)
                transactions, _ = split_transactions(messages)
                relations: dict[int, Relation] = {}
                counted = progress
                for txn in transactions:
                    if txn.commit_lsn <= state.last_t:  # in the saved state already; the slot was not advanced
                        relations.update({m.relid: m for m in txn.messages if isinstance(m, Relation)})
                        continue
                    decoded = transaction_events(state, txn, relations, config.options, live_keys)
                    state, relations = decoded.state, dict(decoded.relations)
                    if txn.commit_lsn <= wal.closed_t:  # written before a crash: the WAL has it
                        continue
                    for record in decoded.records:
                        wal.append(record)
                        step("appended")
                    counted = counted.counting(decoded.records)
                if transactions:
                    wal.flush()
                    step("written")
                    save_state(path, state)
                    step("saved")
                    target = max(t.end_lsn for t in transactions)
                    conn.execute(
                        "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (config.slot, format_lsn(target))
                    )
                    step("advanced")
                lag_bytes = _lag_bytes(conn, config.slot)
                newest = transactions[-1].commit_time / 1e6 + _PG_EPOCH if transactions else time.time()
                lag_seconds = max(time.time() - newest, 0.0)  # 0 when the peek found nothing waiting
                progress = replace(
                    counted, batches=progress.batches + (1 if transactions else 0), last_t=state.last_t,
                    lag_bytes=lag_bytes, lag_seconds=lag_seconds,
                )
                if transactions and on_progress:
                    on_progress(progress)
                if time.monotonic() - last_seal >= store.settings.max_segment_age_s:
                    wal.seal()  # age-based sealing also while the database is idle
                    last_seal = time.monotonic()
                if max_transactions is not None and progress.transactions >= max_transactions:
                    break
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                if not transactions:
                    if once and heartbeat_pending:
                        break  # caught up, and the heartbeat that closes the current LSN is written
                    if once or time.monotonic() - last_heartbeat >= config.heartbeat_interval_s:
                        _heartbeat(conn)
                        last_heartbeat, heartbeat_pending = time.monotonic(), True
                    else:
                        time.sleep(config.poll_interval_s)
            wal.seal()  # the last record is a close: what was captured can be compacted now
    except psycopg.Error as exc:
        raise CaptureSetupError(
            f"PostgreSQL failed during capture: {exc}".strip() + "; run the capture again: it resumes after the "
            "last transaction it wrote"
        ) from None
    finally:
        conn.close()
    return progress


@contextmanager
def _opened_writer(store: HistoryStore) -> Iterator[Any]:
    drop_unclosed_tail(store.wal_dir)  # under the capture lock, before the writer adopts the open segment
    with store.wal_writer() as wal:
        yield wal


def current_lsn(conn: Any) -> int:
    """``pg_current_wal_lsn()`` as an integer timestamp."""
    return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
