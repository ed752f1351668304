"""``history-pipeline``: the main operations from a terminal.

Exit codes: 0 success, 1 an error (one clear line on stderr saying what to do; ``--debug``,
accepted anywhere on the line, shows the stack trace), 2 bad usage. Read commands never create
anything: on a database that does not exist they say so and list the databases found.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from history_pipeline.capture.cli import register_capture
from history_pipeline.errors import HistoryError, InputFileError
from history_pipeline.lsn import as_of_argument, format_lsn
from history_pipeline.service.cli import register_serve
from history_pipeline.store import HistoryStore, StoreSettings, default_wal_base, wal_dir_of
from history_pipeline.types import interval_storage

FORMATS = ["table", "csv", "json", "parquet"]
#: what a maintenance command prints: aligned lines for a person, or one JSON object for a script
SUMMARY_FORMATS = ["text", "json"]


# --- helpers ---------------------------------------------------------------------------


def _store(args: argparse.Namespace, create: bool = False) -> HistoryStore:
    """The store of ``--root``/``--database``: readers need it to exist, writers create it. Its
    Spark work runs on the root's engine when one is up (``engine start``), else on a local session."""
    from history_pipeline.engine import engine_dir, running_engine

    engine = running_engine(engine_dir(default_wal_base(args.root)))
    if engine is None:
        return HistoryStore.open(args.root, database=args.database, create=create)
    # absolute local paths: the engine is a server with a working directory of its own
    root = args.root if str(args.root).startswith("s3://") else str(Path(args.root).absolute())
    return HistoryStore.open(root, database=args.database, create=create,
                             wal_dir=wal_dir_of(args.root, args.database).absolute(),
                             settings=StoreSettings(spark_master=engine.url))


def _captured(store: HistoryStore) -> bool:
    """A database captured from PostgreSQL: its timestamps are LSNs."""
    return _has_capture_state(store.wal_dir)


def _has_capture_state(wal_dir: Path) -> bool:
    """Whether a capture keeps its state beside this WAL (``<wal>/capture/<slot>.json``)."""
    folder = wal_dir / "capture"
    return folder.is_dir() and any(folder.glob("*.json"))


def _t(store: HistoryStore, value: int | None, captured: bool | None = None) -> str:
    """A logical timestamp as its database's users write it: ``X/Y`` for a captured database."""
    if value is None:
        return "none"
    if (captured if captured is not None else _captured(store)) and 0 <= value < 2**64:
        return format_lsn(value)
    return str(value)


_TIMESTAMP_IN_MESSAGE = re.compile(
    r"(as_of[= ]|as of |frontier (?:is )?|earliest answerable as_of is |earliest |<= |history before )(\d+)")


def _lsns_in(message: str) -> str:
    """An error about a captured database with each timestamp it names also in ``X/Y`` form."""
    return _TIMESTAMP_IN_MESSAGE.sub(lambda m: f"{m.group(1)}{m.group(2)} ({format_lsn(int(m.group(2)))})"
                                     if int(m.group(2)) < 2**64 else m.group(0), message)


def _as_of(store: HistoryStore, value: int | None) -> int:
    """``--as-of`` or, when omitted, the newest answerable state (frontier + 1)."""
    return store.frontier + 1 if value is None else value


def _is_plan(table: pa.Table) -> bool:
    return table.column_names == ["explain_key", "explain_value"]


def _print_table(table: pa.Table, fmt: str) -> None:
    if fmt == "table" and _is_plan(table):  # EXPLAIN: the plan as the lines DuckDB draws
        for key, plan in zip(table.column("explain_key").to_pylist(), table.column("explain_value").to_pylist(),
                             strict=True):
            print(f"{key}:")
            print(plan)
        return
    if len(set(table.column_names)) < table.num_columns:  # SELECT 1 AS a, 2 AS a: rows by name lose one
        table = table.rename_columns(_unique_names(table.column_names))
    if fmt == "json":
        for row in table.to_pylist():
            print(json.dumps(row, default=str))
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(_stringify(table), sink)
        sys.stdout.write(sink.getvalue().to_pybytes().decode())
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(_parquet_ready(table), sys.stdout.buffer)
    else:
        rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
        widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(table.column_names)]
        print("  ".join(n.ljust(w) for n, w in zip(table.column_names, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        print(f"({table.num_rows} rows)")


def _unique_names(names: Sequence[str]) -> list[str]:
    """Repeated column names made distinct as DuckDB does in a table: a, a_1, a_2."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        candidate = name
        while candidate in seen:
            seen[name] += 1
            candidate = f"{name}_{seen[name]}"
        seen.setdefault(candidate, 0)
        seen.setdefault(name, 0)
        unique.append(candidate)
    return unique


def _parquet_ready(table: pa.Table) -> pa.Table:
    """Interval columns (Arrow's month_day_nano, which Parquet cannot hold) as the store keeps them:
    a struct of months, days and micros."""
    for index, field in enumerate(table.schema):
        if field.type == pa.month_day_nano_interval():
            table = table.set_column(index, field.name, interval_storage(table.column(index)))
    return table


def _stringify(table: pa.Table) -> pa.Table:
    """Every column as text for CSV: nested values (arrays, structs, maps) as JSON, NULL as empty."""
    columns = {}
    for name in table.column_names:
        values = table.column(name).to_pylist()
        if _nested(table.schema.field(name).type):
            columns[name] = pa.array([None if v is None else _json(v) for v in values], pa.string())
        else:
            columns[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.table(columns)


def _nested(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_struct(kind) or pa.types.is_map(kind)


def _json(value: Any) -> str:
    """A nested value as JSON text (a map's ``[(k, v)]`` pairs as an object)."""
    def plain(v: Any) -> Any:
        if isinstance(v, list):
            if v and all(isinstance(item, tuple) and len(item) == 2 for item in v):
                return {str(k): plain(x) for k, x in v}
            return [plain(item) for item in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, int | float | str | bool) or v is None:
            return v
        return str(v)

    return json.dumps(plain(value), ensure_ascii=False)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = _json(value) if isinstance(value, list | dict) else str(value)
    return "\\n".join(text.splitlines()) if "\n" in text else text


def _readable(value: Any) -> str:
    """One summary value as a person reads it: numbers with separators, lists joined, none for empty."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, list | tuple):
        return ", ".join(_readable(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_readable(v)}" for k, v in value.items()) or "none"
    return "none" if value is None else str(value)


def _print_summary(summary: dict[str, Any], fmt: str, title: str | None = None) -> None:
    """A command's outcome: aligned ``name  value`` lines (a title first), or one JSON object."""
    if fmt == "json":
        print(json.dumps(summary, indent=2, default=str))
        return
    if title:
        print(title)
    width = max((len(k) for k in summary), default=0) + 2
    for key, value in summary.items():
        print(f"  {key.replace('_', ' '):{width}s}{_readable(value)}")


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _input_lines(path: str, spool: Path) -> Any:
    """The lines of ``path`` (``-``: stdin, spooled to ``spool`` so it can be read twice), or an
    :class:`InputFileError` saying why not."""
    from history_pipeline.wal.writer import InputLines

    if path == "-":
        with open(spool, "wb") as f:
            while chunk := sys.stdin.buffer.read(1 << 20):
                f.write(chunk)
        return InputLines(spool)
    target = Path(path)
    if target.is_dir():
        raise InputFileError(f"{path} is a folder, not a JSON-lines file of events")
    try:
        with open(target, "rb"):
            pass
    except FileNotFoundError:
        raise InputFileError(f"no such file: {path} (give a JSON-lines file of events, or - for stdin)") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    return InputLines(target)


# --- commands ----------------------------------------------------------------------------


def cmd_append(args: argparse.Namespace) -> int:
    import tempfile

    from history_pipeline.wal.writer import WalPosition, check_input

    source = "<stdin>" if args.file == "-" else args.file
    with tempfile.TemporaryDirectory(prefix="history-pipeline-append-") as scratch:
        lines = _input_lines(args.file, Path(scratch) / "stdin.jsonl")
        # a bad input must not bring a database (or root) into being: check it as a new WAL would,
        # first; the writer then checks it again from its real position before writing anything
        check_input(lines, source, WalPosition(), require_uuids=True)
        with _store(args, create=True).wal_writer() as wal:
            count = wal.append_all(lines, source=source, seal=args.seal, require_uuids=True)
    print(f"appended {count} events" + (" and sealed the segment" if args.seal else ""))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from history_pipeline.wal import SegmentState

    store = _store(args)
    pending = 1 if args.segment is not None else len(store.segments(SegmentState.SEALED))
    if pending == 0 and args.format == "text":
        quarantined = store.segments(SegmentState.QUARANTINED)
        waiting = f" ({len(quarantined)} quarantined: see `segments`)" if quarantined else ""
        print(f"nothing to compact: no sealed segment is waiting{waiting}; frontier {store.frontier}")
        return 0
    # None: the store's Spark (local[*] by default); nothing pending needs no session
    spark = False if args.in_process or pending == 0 else None
    with tqdm(total=pending, desc="compacting", unit=" segments", disable=not sys.stderr.isatty()) as bar:
        summary = store.compact(
            spark=spark,
            on_step=lambda step: bar.update(1) if step == "committed" else None,
            only_segment=args.segment,
        )
    if args.format == "text":
        _print_compaction(store, summary)
    else:
        _print_summary(summary.as_dict(), args.format)
    return 0


def _print_compaction(store: HistoryStore, summary: Any) -> None:
    """A compaction's summary as aligned lines, its tables by name."""
    result = summary.as_dict()
    names = {d.table_uuid: d.table_name for d in store.get_catalog(store.frontier + 1)}
    history = sorted(store.catalog_state().schema_history, key=lambda e: e.logical_timestamp)
    # a table dropped since: by the last name it had
    dropped = {e.table_uuid: f"{e.table_name} (dropped)" for e in history if e.descriptor is not None}
    result["tables_touched"] = [names.get(u) or dropped.get(u, u) for u in result["tables_touched"]]
    applied = result["segments_applied"]
    title = f"compacted {len(applied)} segment{'s' if len(applied) != 1 else ''}" if applied else "nothing compacted"
    _print_summary(result, "text", title)


def cmd_sql(args: argparse.Namespace) -> int:
    store = _store(args)
    _print_table(store.sql(args.query, as_of=_as_of(store, args.as_of)), args.format)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    store = _store(args)
    # a person reads the rows: in key order (the API's default is the scan order)
    _print_table(store.load_table(args.table, as_of=_as_of(store, args.as_of), ordered=True), args.format)
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    store = _store(args)
    _print_table(store.sql("SHOW TABLES", as_of=_as_of(store, args.as_of)), args.format)
    return 0


def cmd_row_history(args: argparse.Namespace) -> int:
    store = _store(args)
    versions = store.row_history(args.table, args.key)
    if not versions:  # the API's answer too: no versions (a note for the person reading)
        print(f"(key {args.key} of table {args.table} has no version in the retained history of "
              f"{store.database}: frontier {_t(store, store.frontier)}, earliest {_t(store, store.earliest)})",
              file=sys.stderr)
    for version in versions:
        print(json.dumps(version, default=str))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from history_pipeline.query.diff import KINDS, diff_entries

    store = _store(args)
    if args.format == "json":
        diff = store.diff(args.table, from_=args.from_, to=args.to)
        counts = {kind: len(diff[kind]) for kind in KINDS}
        print(json.dumps({**diff, "summary": counts}, default=str, indent=2))
        return 0
    counts = dict.fromkeys(KINDS, 0)
    # streamed: a diff of millions of keys prints as it is read, a batch at a time
    for kind, item in diff_entries(store.diff_reader(args.table, from_=args.from_, to=args.to, as_stored=True)):
        counts[kind] += 1
        if kind == "inserted":
            print(f"+ key {item['key']}: {json.dumps(item['after'], default=str)}")
        elif kind == "deleted":
            print(f"- key {item['key']}: {json.dumps(item['before'], default=str)}")
        else:
            print(f"~ key {item['key']}: {json.dumps(item['before'], default=str)} -> "
                  f"{json.dumps(item['after'], default=str)}")
    print(f"{counts['inserted']} inserted, {counts['deleted']} deleted, {counts['changed']} changed "
          f"in {args.table} between as_of {_t(store, args.from_)} and {_t(store, args.to)}")
    return 0


def status_of(store: HistoryStore) -> dict[str, Any]:
    """Frontier, earliest, segments by state (quarantined with why) and the last compaction."""
    from history_pipeline.wal import SegmentState
    from history_pipeline.wal.segments import quarantine_reason

    state = store.catalog_state()
    segments = store.segments()
    last = next((c for c in store.commits() if c.operation.startswith("compact")), None)
    quarantined = []
    for ref in segments:
        if ref.state is SegmentState.QUARANTINED:
            reason = quarantine_reason(ref) or {}
            quarantined.append({"segment": ref.segment_id, "line": reason.get("line"),
                                "error": reason.get("error")})
    return {
        "database": store.database,
        "root": store.objects.uri,
        "frontier": state.frontier,
        "earliest": state.earliest,
        "answerable_as_of": f"[{state.earliest}, {state.frontier + 1}]",
        "tables": len(store.get_catalog(state.frontier + 1)) if state.frontier >= state.earliest - 1 else 0,
        "live_files": len(state.files),
        "open_segment": next((r.segment_id for r in segments if r.state is SegmentState.OPEN), None),
        "pending_segments": [r.segment_id for r in segments if r.state is SegmentState.SEALED],
        "applied_segments": sum(r.state is SegmentState.APPLIED for r in segments),
        "quarantined_segments": quarantined,
        "last_compaction": None if last is None else {
            "txn_id": last.txn_id, "at": _when(last.committed_at), "operation": last.operation},
        "catalog_version": state.txn_id,
    }


def _change_lines(batch: Any, fmt: str) -> list[str]:
    """One line per change of a ``ChangeBatch``; JSON lines carry the cursor to resume from once
    that line is processed (the next t once its transaction is complete, else its own t)."""
    rows = batch.records.to_pylist()
    lines = []
    for i, row in enumerate(rows):
        following = rows[i + 1]["t"] if i + 1 < len(rows) else None
        cursor = batch.cursor if following is None else row["t"] + 1 if following > row["t"] else row["t"]
        if row["key"] is None:  # a schema change: its descriptors, as JSON text
            row["before"] = None if row["before"] is None else json.loads(row["before"])
            row["after"] = None if row["after"] is None else json.loads(row["after"])
        if fmt == "json":
            lines.append(_json({**row, "cursor": cursor}))
        elif row["key"] is None:
            lines.append(f"{row['t']}  {row['op']}  {row['table']}")
        else:
            shown = row["after"] if row["after"] is not None else row["before"]
            lines.append(f"{row['t']}  {row['op']}  {row['table']}  key {row['key']}  {_json(shown)}")
    return lines


def cmd_changes(args: argparse.Namespace) -> int:
    store = _store(args)
    since = args.since
    if since is None and args.consumer:
        since = store.consumer_cursor(args.consumer)
    if since is None:
        raise HistoryError("give --since T (0: from the start), or a --consumer NAME whose cursor is stored "
                           f"(consumer {args.consumer!r} has none yet)" if args.consumer else
                           "give --since T (0: from the start) or --consumer NAME")
    tables = args.table or None
    if args.follow and args.until is not None:
        raise HistoryError("--follow delivers without end: give either --follow or --until, not both")
    if args.follow:
        feed = store.follow_changes(tables, since, poll_seconds=args.poll_seconds, max_seconds=args.max_seconds)
        cursor = since
    else:
        until = store.frontier + 1 if args.until is None else args.until
        feed = store.changes(tables, since=since, until=until)
        cursor = until  # where a window that holds no change leaves the consumer
    try:
        for batch in feed:
            lines = _change_lines(batch, args.format)
            if lines:
                print("\n".join(lines), flush=True)
            cursor = batch.cursor
            if args.consumer:
                store.save_consumer_cursor(args.consumer, cursor)  # after the batch is out
    except KeyboardInterrupt:
        pass
    if args.consumer and not args.follow:
        store.save_consumer_cursor(args.consumer, cursor)
    print(f"cursor {cursor} (resume with --since {cursor})", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    store = _store(args)
    status = status_of(store)
    captured = _captured(store)
    if args.format == "json":
        if captured:
            status["timestamps"] = "lsn"  # the integers are LSNs; X/Y forms beside them
            status |= {f"{k}_lsn": _t(store, status[k], True) for k in ("frontier", "earliest")}
        print(json.dumps(status, indent=2, default=str))
        return 0
    if captured:
        status["frontier"] = _t(store, status["frontier"], True)
        status["earliest"] = _t(store, status["earliest"], True)
        status["answerable_as_of"] = (f"[{_t(store, store.earliest, True)}, "
                                      f"{_t(store, store.frontier + 1, True)}]")
    for key, value in status.items():
        if key == "quarantined_segments":
            value = "none" if not value else "; ".join(f"{q['segment']}: {q['error']}" for q in value)
        elif key == "last_compaction" and value is not None:
            value = f"{value['operation']} (catalog version {value['txn_id']}, {value['at']})"
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) or "none"
        print(f"{key + ':':22s} {'none' if value is None else value}")
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    """The frontier alone, for scripts (``status`` shows the rest)."""
    print(_store(args).frontier)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    store = _store(args)
    commits = store.history(limit=args.limit)
    captured = _captured(store)
    table = pa.table(
        {
            "version": pa.array([c.txn_id for c in commits], pa.int64()),
            "timestamp": pa.array([_when(c.committed_at) for c in commits], pa.string()),
            "operation": pa.array([c.operation for c in commits], pa.string()),
            "files_added": pa.array([c.files_added for c in commits], pa.int64()),
            "files_removed": pa.array([c.files_removed for c in commits], pa.int64()),
            "rows_added": pa.array([c.rows_added for c in commits], pa.int64()),
            "frontier": (pa.array([_t(store, c.frontier, True) for c in commits], pa.string()) if captured
                         else pa.array([c.frontier for c in commits], pa.int64())),
        }
    )
    _print_table(table, args.format)
    return 0


def cmd_erasures(args: argparse.Namespace) -> int:
    entries = _store(args).erasures()
    table = pa.table(
        {
            "version": pa.array([e.txn_id for e in entries], pa.int64()),
            "timestamp": pa.array([_when(e.committed_at) for e in entries], pa.string()),
            "table_uuid": pa.array([e.table_uuid for e in entries], pa.string()),
            "keys": pa.array([e.key_count for e in entries], pa.int64()),
            "keys_found": pa.array([e.keys_found for e in entries], pa.int64()),
            "keys_sha256": pa.array([e.keys_sha256 for e in entries], pa.string()),
            "requested_by": pa.array([e.requested_by for e in entries], pa.string()),
            "reason": pa.array([e.reason for e in entries], pa.string()),
        }
    )
    _print_table(table, args.format)
    return 0


SHELL_HELP = """Statements end with ';' and may span lines. Read-only: SELECT, SHOW TABLES, DESCRIBE <table>,
EXPLAIN <select>. Commands: .as_of [T] (show or change T), .tables, .status, .help, .quit"""


def cmd_shell(args: argparse.Namespace) -> int:
    """A read-only SQL prompt over the database as of T; reads statements from stdin."""
    store = _store(args)
    as_of = _as_of(store, args.as_of)
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history at the prompt)
        except ImportError:
            pass
        print(f"{store.database} as of {as_of} (frontier {store.frontier}); .help for help, .quit to leave")
    buffer: list[str] = []
    failures = 0  # a script piped in fails as a whole when one of its statements fails
    while True:
        try:
            line = input("… " if buffer else f"{store.database}@{as_of}> ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        if not interactive and line == "":
            break
        text = line.strip()
        if not buffer and text.startswith("."):
            command, _, argument = text.partition(" ")
            if command in (".quit", ".exit"):
                break
            try:
                if command == ".as_of":
                    if argument.strip():
                        candidate = int(argument)
                        store.query_context().check_as_of(candidate)
                        as_of = candidate
                    print(f"as_of = {as_of}")
                elif command == ".tables":
                    _print_table(store.sql("SHOW TABLES", as_of), "table")
                elif command == ".status":
                    print(json.dumps(status_of(store), indent=2, default=str))
                elif command == ".help":
                    print(SHELL_HELP)
                else:
                    failures += 1
                    print(f"error: unknown command {command}; .help lists them", file=sys.stderr)
            except ValueError:
                failures += 1
                print(f"error: .as_of takes an integer logical timestamp, got {argument.strip()!r}", file=sys.stderr)
            except HistoryError as exc:
                failures += 1
                print(f"error: {_one_line(exc)}", file=sys.stderr)
            continue
        if text:
            buffer.append(line.rstrip("\n"))
        if buffer and text.endswith(";"):
            query = "\n".join(buffer)
            buffer = []
            try:
                _print_table(store.sql(query, as_of), args.format)
            except HistoryError as exc:
                failures += 1
                print(f"error: {_one_line(exc)}", file=sys.stderr)
            sys.stdout.flush()
    if buffer:
        try:
            _print_table(store.sql("\n".join(buffer), as_of), args.format)
        except HistoryError as exc:
            failures += 1
            print(f"error: {_one_line(exc)}", file=sys.stderr)
    return 1 if failures and not interactive else 0


def cmd_segments(args: argparse.Namespace) -> int:
    from history_pipeline.wal.segments import quarantine_reason

    segments = _store(args).segments()
    if not segments:
        print("(no segments)")
    for ref in segments:
        why = ""
        if ref.state.value == "quarantined":
            reason = quarantine_reason(ref) or {}
            why = f"  ({_one_line(reason.get('error', 'no reason recorded'))})"
        print(f"{ref.name}  {ref.state.value:12s} {ref.path}{why}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """An operator's act: put a quarantined segment back in line unchanged (the cause was elsewhere)."""
    ref = _store(args).release_segment(args.segment_id)
    print(f"segment {ref.name} is sealed again and waits for compaction")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    record = _store(args).repair_segment(args.segment_id, args.events, reason=args.reason)
    print(f"segment {record.segment} repaired: {record.new_records} records re-sealed"
          f" (sha256 {record.new_sha256[:12]}…),"
          f" waiting for compaction; the original is kept in {record.audit_dir}")
    return 0


def cmd_skip(args: argparse.Namespace) -> int:
    record = _store(args).skip_segment(args.segment_id, reason=args.reason)
    print(f"segment {record.segment} skipped: its events are dropped, its bounds [{record.lower}, {record.upper}] "
          f"kept; the original and the audit record are in {record.audit_dir}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    _print_summary(_store(args).merge().as_dict(), args.format, "merge")
    return 0


def cmd_snapshots(args: argparse.Namespace) -> int:
    spark = False if args.in_process else None  # None: a Spark session only when a table is due one
    _print_summary(_store(args).refresh_snapshots(force=args.force, spark=spark).as_dict(), args.format, "snapshots")
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    _print_summary(_store(args).retain(args.purge_before, cold_tier=args.cold_tier).as_dict(), args.format, "retention")
    return 0


def cmd_erase(args: argparse.Namespace) -> int:
    import warnings

    with warnings.catch_warnings(record=True):  # said once, below, without a source line
        summary = _store(args).erase(args.table, args.keys, requested_by=args.by, reason=args.reason,
                                     cold_tiers=args.cold_tier, purge_now=args.purge_now, dry_run=args.dry_run)
    _print_summary(summary.as_dict(), args.format, "erasure (dry run: nothing changed)" if args.dry_run else "erasure")
    for warning in summary.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_ttl(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.clear or args.units is not None:
        store.set_ttl(args.table, None if args.clear else args.units)
    if args.apply:
        print(json.dumps(store.apply_ttl().as_dict(), indent=2))
    else:
        print(json.dumps({"ttls": store.ttls(), "earliest": store.earliest_of(args.table)}))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    manifest = _store(args).export(as_of=args.as_of, to=args.to)
    print(json.dumps({"as_of": manifest["as_of"], "tables": [t["table_name"] for t in manifest["tables"]]}))
    return 0


def cmd_load_cold_tier(args: argparse.Namespace) -> int:
    print(f"earliest answerable as_of is now {_store(args).load_cold_tier(args.cold_tier)}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from datetime import timedelta

    _print_summary(_store(args).cleanup(grace=timedelta(seconds=args.grace_seconds)).as_dict(), args.format, "cleanup")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    problems = _store(args).verify()
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    state = _store(args).rebuild_catalog()
    print(f"rebuilt: {len(state.files)} live files, frontier {state.frontier}")
    return 0


def _write_sample(store: HistoryStore, *, list_segments: bool = True) -> None:
    from history_pipeline.sample import sample_events

    if not store.segments() and store.frontier < 0:
        with store.wal_writer() as wal:
            for event in sample_events():
                wal.append(event)
                if event["op"] == "close":
                    wal.seal()
    segments = store.segments()
    print(f"WAL of {store.database} under {store.wal_dir}: {len(segments)} segments")
    if list_segments:
        for ref in segments:
            print(f"  segment {ref.name}  {ref.state.value:8s} {ref.path.stat().st_size:>8d} bytes")


def cmd_engine(args: argparse.Namespace) -> int:
    """Start, show or stop the root's Spark engine (a local Spark Connect server)."""
    from history_pipeline.engine import engine_dir, running_engine, start_engine, stop_engine

    folder = engine_dir(default_wal_base(args.root))
    if args.action == "start":
        up = running_engine(folder)
        # the runs of the Dagster instance at $DAGSTER_HOME share one engine session: warm that one
        # (Dagster's instance root: the variable with ~ expanded)
        scope = os.path.expanduser(os.environ["DAGSTER_HOME"]) if os.environ.get("DAGSTER_HOME") else None
        if up is None:
            print(f"starting the Spark engine ({args.master}, driver memory {args.driver_memory}) and "
                  f"warming it with a first job ...", file=sys.stderr)
        info = up or start_engine(folder, port=args.port, master=args.master, driver_memory=args.driver_memory,
                                  scope=scope)
        print(f"engine up at {info.url} (pid {info.pid}{', already running' if up else ''}); log: {info.log}")
        print(f"Dagster runs use it with: export HISTORY_PIPELINE_SPARK={info.url}")
        return 0
    if args.action == "stop":
        stopped = stop_engine(folder)
        print(f"engine at {stopped.url} (pid {stopped.pid}) stopped" if stopped else "no engine was running")
        return 0
    info = running_engine(folder)
    if info is None:
        print(f"no engine running for {args.root} (history-pipeline engine start starts one)")
        return 3
    print(f"engine up at {info.url} (pid {info.pid}, {info.master}, driver memory {info.driver_memory}, "
          f"since {_when(info.started_at)}); log: {info.log}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """Write the sample workload into the WAL (sealed segments) and show what was written."""
    _write_sample(_store(args, create=True))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Write the sample workload into the WAL, compact it, and show some answers."""
    store = _store(args, create=True)
    _write_sample(store, list_segments=False)
    _print_compaction(store, store.compact())
    frontier = store.frontier
    catalog = store.get_catalog(frontier + 1)
    print("tables now")
    width = max((len(t.table_name) for t in catalog), default=0) + 2
    for table in catalog:
        print(f"  {table.table_name:{width}s}{', '.join(c.column_name for c in table.columns)}")
    print("orders by state, as of now")
    _print_table(
        store.sql('SELECT state, count(*) AS n, sum(amount) AS total FROM orders GROUP BY state ORDER BY state',
                  as_of=frontier + 1),
        "table",
    )
    print("history of order 10000 (t: the version's logical timestamp)")
    for version in store.row_history("orders", 10_000)[:5]:
        values = "deleted" if version["is_deleted"] else _readable(version["values"])
        print(f"  t {version['logical_timestamp']:<6d}{values}")
    return 0


# --- the parser --------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--root, --database and --debug, accepted before or after the command.

    On commands the defaults are suppressed, so a value given before the command is kept
    unless the same option is given again after it."""
    default: Callable[[Any], Any] = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument("--root", default=default("data"),
                       help="storage root: a local folder or s3://bucket/prefix (default: data)")
    group.add_argument("--database", default=default("tenant_a"),
                       help="the tenant database to work on (default: tenant_a)")
    group.add_argument("--debug", action="store_true", default=default(False),
                       help="show the full stack trace of an error (default: off)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default after its help, unless there is none to show (None, a flag's off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)$")


def usage_error(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's complaint as one line naming what was wrong, with the nearest valid word."""
    import difflib

    invalid = _INVALID_CHOICE.match(message)
    if invalid:
        what, given, choices = invalid.groups()
        options = re.findall(r"'([^']*)'", choices)
        near = difflib.get_close_matches(given, options, n=1, cutoff=0.6)
        hint = f"; did you mean '{near[0]}'?" if near else f" (one of: {', '.join(options)})"
        noun = "command" if what == "COMMAND" else f"value for {what}"
        return f"unknown {noun} '{given}'{hint}"
    unrecognized = _UNRECOGNIZED.match(message)
    if unrecognized:
        words = unrecognized.group(1).split()
        known = sorted({o for p in _parsers_of(parser) for a in p._actions for o in a.option_strings})
        flag = next((w for w in words if w.startswith("-")), None)
        near = difflib.get_close_matches(flag.split("=")[0], known, n=1, cutoff=0.6) if flag else []
        hint = f"; did you mean '{near[0]}'?" if near else ""
        return f"unknown argument{'s' if len(words) > 1 else ''}: {' '.join(words)}{hint}"
    return message


def _parsers_of(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_parsers_of(child))
    return found


class OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit code 2), not the usage block."""

    def error(self, message: str) -> Any:  # argparse's hook: it never returns
        self.exit(2, f"{self.prog}: {usage_error(self, message)} (see {self.prog} --help)\n")


class CommandParser(OneLineErrors):
    """The parser of every subcommand (also those other modules register): global options
    anywhere, defaults shown in ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        _global_options(self, top=False)


def _command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], help_text: str,
             description: str | None = None) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=description or help_text)
    parser.set_defaults(func=func)
    return parser


def _as_of_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--as-of", type=as_of_argument, default=None, metavar="T",
                        help="the state produced by every event with t < T; omitted: the newest (frontier + 1)")


def _non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse ``type=``: a finite number >= 0 of ``kind`` (a usage error otherwise)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
        if not 0 <= value < float("inf"):  # NaN fails this too
            raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
        return value

    return parse


def _format_option(parser: argparse.ArgumentParser, choices: Sequence[str] = FORMATS) -> None:
    parser.add_argument("--format", choices=list(choices), default=choices[0],
                        help="output: a readable table, or csv/json lines/parquet (to stdout) for scripts")


def build_parser() -> argparse.ArgumentParser:
    """The ``history-pipeline`` parser. Other modules add commands with one line each:
    ``register_<name>(sub)`` taking the subparsers object below."""
    parser = OneLineErrors(prog="history-pipeline", description=__doc__.splitlines()[0],
                           formatter_class=HelpFormatter)
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)

    p = _command(sub, "append", cmd_append, "append events (JSON lines) to the WAL, all or nothing",
                 "Append events of the WAL contract (docs/wal-format.md), one JSON object per line. Every "
                 "line is checked first; one bad line (named with its number) writes nothing. Creates the "
                 "database on first use.")
    p.add_argument("file", nargs="?", default="-", help="JSON-lines file of events; - reads stdin")
    p.add_argument("--seal", action="store_true", help="seal the open segment afterwards (the input must end "
                   "with a close record)")

    p = _command(sub, "compact", cmd_compact, "compact sealed segments into supertables (Spark)")
    p.add_argument("--in-process", action="store_true", help="run the compaction tasks without Spark")
    p.add_argument("--segment", type=int, default=None, metavar="ID",
                   help="compact only this segment (refused while an earlier one is pending); omitted: every "
                        "pending segment in order")
    _format_option(p, SUMMARY_FORMATS)

    p = _command(sub, "sql", cmd_sql, "run read-only SQL as of T",
                 "Read-only SQL (DuckDB dialect) over the tables as they were as of T: SELECT, SHOW TABLES, "
                 "DESCRIBE <table>, EXPLAIN <select>; _history_catalog.schema_history too.")
    p.add_argument("query", help="the SQL statement")
    _as_of_option(p)
    _format_option(p)

    p = _command(sub, "load", cmd_load, "a whole table as of T")
    p.add_argument("table", help="table name (as of T) or table uuid")
    _as_of_option(p)
    _format_option(p)

    p = _command(sub, "tables", cmd_tables, "the tables as of T (name, uuid, column count)")
    _as_of_option(p)
    _format_option(p)

    p = _command(sub, "row-history", cmd_row_history, "every version of a row, one JSON object per line")
    p.add_argument("table", help="table name or uuid")
    p.add_argument("key", type=int, help="the row's synthetic key")

    p = _command(sub, "diff", cmd_diff, "keys inserted, deleted and changed between two timestamps")
    p.add_argument("table", help="table name (as of --to, else --from) or uuid")
    p.add_argument("--from", dest="from_", type=as_of_argument, required=True, metavar="T1", help="the earlier as_of")
    p.add_argument("--to", type=as_of_argument, required=True, metavar="T2", help="the later as_of (>= T1)")
    _format_option(p, ["text", "json"])

    p = _command(sub, "changes", cmd_changes, "every committed change from T on, with the row before and after",
                 "Every committed row version and schema change with t in [--since, --until), in (t, table, key) "
                 "order, one line each: the table's name as of t, the key, the operation and the row before "
                 "(as of t) and after (as of t + 1). A table is followed across renames. The cursor to resume "
                 "from is printed on stderr at the end (and on each JSON line); --consumer keeps it in the "
                 "history root.")
    p.add_argument("--since", type=as_of_argument, default=None, metavar="T",
                   help="the first t delivered (a cursor); omitted: the --consumer's stored cursor")
    p.add_argument("--until", type=as_of_argument, default=None, metavar="T",
                   help="deliver t < T only; omitted: up to the frontier")
    p.add_argument("--table", action="append", default=[], metavar="NAME",
                   help="only this table (a name it bore at any time, or its uuid); repeat for more")
    p.add_argument("--follow", action="store_true",
                   help="keep delivering new commits as the frontier moves, until Ctrl-C or --max-seconds")
    p.add_argument("--poll-seconds", type=_non_negative(float), default=0.5, metavar="S",
                   help="with --follow: how often the frontier is read")
    p.add_argument("--max-seconds", type=_non_negative(float), default=None, metavar="S",
                   help="with --follow: stop after this long")
    p.add_argument("--consumer", default=None, metavar="NAME",
                   help="a named consumer: starts from its stored cursor and stores it after each batch")
    _format_option(p, ["text", "json"])

    p = _command(sub, "status", cmd_status, "frontier, earliest, pending and quarantined segments, last compaction")
    _format_option(p, ["text", "json"])

    _command(sub, "frontier", cmd_frontier, "print the frontier: the largest compacted close timestamp (-1: none)")

    p = _command(sub, "history", cmd_history, "catalog commits, newest first (like DESCRIBE HISTORY)")
    p.add_argument("--limit", type=_non_negative(int), default=None,
                   help="show only the newest N commits; omitted: all retained")
    _format_option(p)

    p = _command(sub, "erasures", cmd_erasures, "every erasure: who, when, why, how many keys, their hash",
                 "The erasure ledger, oldest first: every erasure's commit, table, how many keys were asked "
                 "for and how many had anything to erase, the SHA-256 of the key set, who asked and why. "
                 "Cleanup never prunes it; it holds no key and no value.")
    _format_option(p)

    p = _command(sub, "shell", cmd_shell, "interactive read-only SQL prompt as of T",
                 "An interactive read-only SQL prompt as of T (statements end with ';'; .help inside). "
                 "Reads stdin, so it also runs scripts: history-pipeline shell < queries.sql")
    _as_of_option(p)
    _format_option(p)

    p = _command(sub, "merge", cmd_merge, "merge small files into fewer large ones (answers unchanged)")
    _format_option(p, SUMMARY_FORMATS)
    p = _command(sub, "snapshots", cmd_snapshots, "snapshot, close and mark what is due (answers unchanged)",
                 "What the maintenance runs: snapshot the tables whose history since their last snapshot "
                 "has grown long, record where each finished interval's rows stop being current, and "
                 "mark long open intervals the same way, so that reads as of any T stay filters.")
    p.add_argument("--force", action="store_true", help="snapshot every table now, due or not")
    p.add_argument("--in-process", action="store_true", help="run the snapshot tasks without Spark")
    _format_option(p, SUMMARY_FORMATS)
    p = _command(sub, "retain", cmd_retain, "purge history before a timestamp")
    p.add_argument("purge_before", type=as_of_argument, help="as_of below this is no longer answerable")
    p.add_argument("--cold-tier", default=None, help="keep the purged files there first (path or s3://)")
    _format_option(p, SUMMARY_FORMATS)
    p = _command(sub, "export", cmd_export, "export every table as of T (Parquet + manifest)")
    p.add_argument("--as-of", type=as_of_argument, required=True, metavar="T", help="the state to export")
    p.add_argument("--to", required=True, help="destination folder or s3://bucket/prefix")
    p = _command(sub, "erase", cmd_erase, "forget every version of keys of a table (right to erasure)",
                 "Forget every version of the keys: the WAL segments on disk, the table's files, and the "
                 "purged history and exports in every cold tier or export target are rewritten without "
                 "them; the catalog records who asked, when and why (not the keys or values).")
    p.add_argument("table", help="the table's name (as of the newest state) or uuid")
    p.add_argument("keys", type=int, nargs="+", metavar="KEY", help="synthetic keys to erase")
    p.add_argument("--by", required=True, metavar="NAME", help="who requested the erasure, for the record")
    p.add_argument("--reason", default="", help="why, for the record (e.g. a ticket id)")
    p.add_argument("--cold-tier", action="append", default=[], metavar="URI",
                   help="a further cold tier or export target to clean (those this store wrote to are known)")
    p.add_argument("--purge-now", action="store_true",
                   help="delete the replaced files now (prunes time travel to before the erasure)")
    p.add_argument("--dry-run", action="store_true",
                   help="change nothing: report what would be removed and where (files, tiers, WAL segments, "
                        "audit records) and how many of the keys were found")
    _format_option(p, SUMMARY_FORMATS)
    p = _command(sub, "ttl", cmd_ttl, "set, clear or apply a table's time-to-live",
                 "A table's time-to-live in logical-timestamp units: versions older than frontier + 1 - UNITS "
                 "are dropped by TTL retention (--apply runs it for every table), as retention does.")
    p.add_argument("table", help="the table's name (as of the newest state) or uuid")
    p.add_argument("units", type=int, nargs="?", default=None, help="the TTL; omitted: show the TTLs")
    p.add_argument("--clear", action="store_true", help="remove the table's TTL")
    p.add_argument("--apply", action="store_true", help="run TTL retention for every table now")
    p = _command(sub, "load-cold-tier", cmd_load_cold_tier, "bring purged history back from a cold tier")
    p.add_argument("cold_tier", help="the cold tier given to retain (path or s3://)")
    p = _command(sub, "cleanup", cmd_cleanup, "delete tombstoned and orphan files past the grace period",
                 "Delete tombstoned and orphan files past the grace period, and what interrupted writes left "
                 "(temporary files, unfinished S3 uploads) once past the grace period and five minutes; "
                 "prune the catalog log to match (the erasure ledger is never pruned).")
    p.add_argument("--grace-seconds", type=_non_negative(float), default=3600,
                   help="only files removed/written longer ago")
    _format_option(p, SUMMARY_FORMATS)
    _command(sub, "verify", cmd_verify, "check the catalog against its files and the WAL (exit 1 on problems)")
    _command(sub, "rebuild-catalog", cmd_rebuild, "rebuild the catalog from the Parquet files alone")
    _command(sub, "segments", cmd_segments, "list WAL segments and their states (quarantined: why)")

    p = _command(sub, "repair", cmd_repair, "replace a quarantined segment's events by corrected ones",
                 "Replace a quarantined segment's events by corrected ones: they are checked first, "
                 "re-sealed with a new checksum and put back in line for compaction; the original and an "
                 "audit record are kept under the WAL's audit/ folder.")
    p.add_argument("segment_id", type=int, help="the quarantined segment's id (see `segments`)")
    p.add_argument("--events", required=True, metavar="FILE",
                   help="corrected events (JSON lines): an edited copy of the segment, or only its events")
    p.add_argument("--reason", default="", help="why, for the audit record")
    p = _command(sub, "skip", cmd_skip, "drop a quarantined segment's events, with an audit record",
                 "Drop a quarantined segment's events: its bounds stay so later segments apply; the original "
                 "and an audit record are kept under the WAL's audit/ folder.")
    p.add_argument("segment_id", type=int, help="the quarantined segment's id (see `segments`)")
    p.add_argument("--reason", required=True, help="why its events are dropped, for the audit record")
    p = _command(sub, "release", cmd_release, "release a quarantined segment unchanged (its cause was elsewhere)")
    p.add_argument("segment_id", type=int, help="the quarantined segment's id")

    p = _command(sub, "engine", cmd_engine, "start, show or stop the Spark engine the CLI and Dagster runs use",
                 "A local Spark Connect server, long-lived: compaction, merge and retention from this CLI "
                 "and from Dagster runs (HISTORY_PIPELINE_SPARK=its URL) attach to it instead of starting "
                 "a JVM each. start runs a tiny first job before it reports the engine up (in the engine "
                 "session the runs of the Dagster instance at $DAGSTER_HOME share, when that is set), so "
                 "the first runs find it warm. Its record and log are under <WAL base>/_engine/. status "
                 "exits 3 when none is running.")
    p.add_argument("action", choices=["start", "status", "stop"], help="what to do")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    p.add_argument("--master", default="local[2]", help="the engine's Spark master")
    p.add_argument("--driver-memory", default="2g", help="the engine's JVM heap")
    _command(sub, "sample", cmd_sample, "write the sample workload into the WAL (creates the database)")
    _command(sub, "demo", cmd_demo, "write the sample workload, compact it, query it")
    register_capture(sub)
    register_serve(sub)
    return parser


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


def _names_a_captured_database(args: argparse.Namespace) -> bool:
    """Whether the command's database exists and was captured (never raises: it only shapes a message)."""
    try:  # the WAL's folder only: opening the store could create its root
        return _has_capture_state(wal_dir_of(args.root, args.database))
    except Exception:
        return False


#: the commands that may start a local Spark session (a JVM whose output is set aside)
ENGINE_COMMANDS = frozenset({"compact", "merge", "snapshots", "retain", "erase", "ttl", "export", "load-cold-tier",
                             "cleanup", "rebuild-catalog", "demo"})


@contextlib.contextmanager
def _engine_output_aside(debug: bool) -> Iterator[Path | None]:
    """Keep what a local Spark JVM writes (its log lines, stage bars) off the terminal unless --debug.

    Processes started meanwhile inherit file descriptor 2, so it points at a temporary log file while
    Python's own ``sys.stderr`` (progress bars, errors) keeps the terminal. The log is removed when the
    command succeeds and named when it fails."""
    try:
        original = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr is not a file (in-process callers): nothing to set aside
        original = None
    if debug or original is None:
        yield None
        return
    import tempfile

    log_fd, log_name = tempfile.mkstemp(prefix="history-pipeline-engine-", suffix=".log")
    saved = os.dup(original)
    python_stderr = sys.stderr
    sys.stderr.flush()
    os.dup2(log_fd, original)
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=python_stderr.encoding, errors="replace")
    try:
        yield Path(log_name)
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        os.dup2(saved, original)
        os.close(saved)
        os.close(log_fd)
        sys.stderr = python_stderr


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error a user can cause is one line on stderr and exit code 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with _engine_output_aside(args.debug or args.command not in ENGINE_COMMANDS) as engine_log:
        code = _run(args)
    if engine_log is not None and code == 0:
        engine_log.unlink(missing_ok=True)
    elif engine_log is not None and engine_log.exists() and engine_log.stat().st_size == 0:
        engine_log.unlink()
    elif engine_log is not None:
        print(f"(the engine's own output is in {engine_log})", file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if args.debug:
            raise
        from history_pipeline.execution import engine_failure

        if isinstance(exc, HistoryError):
            message = _one_line(exc)
            if _names_a_captured_database(args):
                message = _lsns_in(message)
        elif engine_failure(exc):
            message = ("the Spark engine stopped answering; nothing of this work was committed: "
                       "start it again (history-pipeline engine start) and rerun")
        elif isinstance(exc, OSError):
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            message = f"{exc.strerror or _one_line(exc)}{where}"
        else:
            message = (f"unexpected {type(exc).__name__}: {_one_line(exc)} "
                       "(rerun with --debug for the stack trace and report it)")
        print(f"error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
