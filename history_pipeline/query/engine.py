"""The query operations of ``HistoryStore`` (as of T), over one catalog state.

Every operation resolves names and schemas as of ``T`` from the schema
history, checks ``T`` against the frontier (``T <= frontier + 1``) and the
purge point, and reads only the files the catalog lists.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import itertools
import operator
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.catalog.files import is_closed_read, live_row, live_rows, select_files
from history_pipeline.catalog.model import CatalogState
from history_pipeline.errors import (
    FutureTimestampError,
    NegativeTimestampError,
    PurgedTimestampError,
    QueryError,
    SandboxViolationError,
    TableNotFoundError,
)
from history_pipeline.io.store import LocalStore, ObjectStore
from history_pipeline.query.exact_numeric import ResultQuotient, exact_numeric_rewrite, quotient_texts
from history_pipeline.query.sandbox import (
    AS_OF_SCHEMA,
    PooledCursor,
    SandboxViews,
    parser_cursor,
    reader_cursor,
    register_schema_history,
    sandbox_cursor,
)
from history_pipeline.query.sandbox import (
    forget as sandbox_forget,
)
from history_pipeline.query.scan import (
    AS_OF_VARIABLE,
    CHANGES_TOKEN,
    COLUMNS_TOKEN,
    interval_filter,
    key_versions,
    live_sql,
    live_view,
)
from history_pipeline.schema import (
    SchemaHistoryEntry,
    TableDescriptor,
    replay_schema_history,
    tables_at,
)
from history_pipeline.supertable import DELETED, KEY, LT, schema_history_table, supertable_schema
from history_pipeline.supertable.read import read_key
from history_pipeline.types import (
    INTERVAL_ARROW,
    ArrayResultType,
    DataType,
    TypeKind,
    array_result_array,
    from_arrow_value,
    from_arrow_values,
    interval_values,
    jsonb_result_array,
    map_leaves,
    numeric_result_array,
)

#: schema epochs whose tables a state keeps (the first asked goes first)
_TABLES_KEPT = 64


@dataclass(frozen=True)
class QueryContext:
    """A frozen catalog state to answer from."""

    store: ObjectStore
    database: str
    state: CatalogState

    # --- guards and resolution ---------------------------------------------------

    def check_as_of(self, as_of: int) -> None:
        """Refuse as_of beyond the frontier or below the purge point."""
        if isinstance(as_of, bool) or not isinstance(as_of, int):
            raise TypeError(f"as_of must be an integer logical timestamp, got {as_of!r}")
        if as_of < 0:
            # checked first: a negative as_of is malformed whatever retention did
            raise NegativeTimestampError(
                f"as_of={as_of} is negative: logical timestamps start at 0, so as_of must be >= 0 "
                "(as_of=0 is the empty state before the first event)"
            )
        frontier = self.state.frontier
        if as_of > frontier + 1:
            raise FutureTimestampError(
                f"as_of={as_of} is in the future of the compacted history: the frontier is {frontier}, "
                f"so as_of must be <= {frontier + 1}; seal and compact newer segments first"
            )
        if as_of < self.state.earliest:
            raise PurgedTimestampError(
                f"as_of={as_of} is before the purge point: history before {self.state.earliest} was "
                f"removed by retention; the earliest answerable as_of is {self.state.earliest} "
                "(load the cold tier to look further back)"
            )

    def check_table_as_of(self, descriptor: TableDescriptor, as_of: int) -> TableDescriptor:
        """Refuse as_of below a table's own purge point (TTL retention); returns the descriptor."""
        earliest = self.state.earliest_of(descriptor.table_uuid)
        if as_of < earliest:
            raise PurgedTimestampError(
                f"as_of={as_of} is before the purge point of table {descriptor.table_name!r}: its history before "
                f"{earliest} was removed by its time-to-live; the earliest answerable as_of for it is {earliest}"
            )
        return descriptor

    def tables_as_of(self, as_of: int) -> tuple[TableDescriptor, ...]:
        """``tables_at`` of this state's schema history, kept with the state per run of schema
        entries below ``as_of`` (a worker asks at the T of every event: replaying for each costs
        more than the lookup's own search)."""
        entries = self.state.schema_history
        derived = self.state.derived
        if ("schema_times",) not in derived:
            times = [e.logical_timestamp for e in entries]
            # not in timestamp order (never written so, but then): nothing to share
            derived[("schema_times",)] = times if all(a <= b for a, b in itertools.pairwise(times)) else None
        times = derived[("schema_times",)]
        if times is None:
            return tables_at(entries, as_of)
        below = bisect.bisect_left(times, as_of)
        memo = derived.setdefault(("tables_at",), {})
        tables = memo.get(below)
        if tables is None:
            tables = tables_at(entries[:below], as_of)
            while len(memo) >= _TABLES_KEPT:
                memo.pop(next(iter(memo)), None)
            memo[below] = tables
        return tables

    def resolve(self, table: str, as_of: int) -> TableDescriptor:
        """A table by name (as of ``as_of``) or by uuid."""
        tables = self.tables_as_of(as_of)
        for descriptor in tables:
            if descriptor.table_name == table:
                return self.check_table_as_of(descriptor, as_of)
        for descriptor in tables:
            if descriptor.table_uuid == table:
                return self.check_table_as_of(descriptor, as_of)
        names = ", ".join(d.table_name for d in tables) or "none"
        raise TableNotFoundError(
            f"no table {table!r} as of {as_of} in database {self.database}; tables then: {names}"
        )

    @functools.cached_property
    def _all_supercolumns(self) -> Mapping[str, tuple[Any, ...]]:
        # replayed once per frozen state (kept with it: a store makes a context per call), not
        # once per table read
        derived = self.state.derived
        supercolumns = derived.get("supercolumns")
        if supercolumns is None:
            supercolumns = derived["supercolumns"] = replay_schema_history(self.state.schema_history).supercolumns
        return supercolumns

    def supercolumns(self, table_uuid: str) -> tuple[Any, ...]:
        return self._all_supercolumns.get(table_uuid, ())

    def _live(self, descriptor: TableDescriptor, as_of: int, keys: Sequence[int] | None = None) -> pa.Table:
        """Live supertable rows of a table as of ``as_of``, only the supercolumns it shows then."""
        return live_rows(
            self.store,
            self.state,
            descriptor.table_uuid,
            self.supercolumns(descriptor.table_uuid),
            as_of,
            keys=keys,
            columns=[c.supercolumn for c in descriptor.columns],
            reserved=False,  # the callers see synthetic_key and the columns only
        )

    # --- operations ----------------------------------------------------------------

    def load_table(self, table: str, as_of: int, ordered: bool = False) -> pa.Table:
        """The table as of ``as_of``: synthetic_key then its columns in order, named as then.

        Rows come in no promised order (as a Delta, Iceberg or DuckLake scan gives them), or in key
        order with ``ordered=True``: where the files as of ``as_of`` answer by a filter alone (a
        closed read), DuckDB scans them and the rows are not put in key order, which would cost
        about as much again as reading them; elsewhere (an open interval, overlaid or joined) the
        key-ordered read is the faster one and answers either way."""
        self.check_as_of(as_of)
        descriptor = self.resolve(table, as_of)
        if not ordered and self._scan_order_answers(descriptor, as_of):
            con = reader_cursor()
            try:
                relation, wanted = self._scan(con, descriptor, as_of, ordered=False)
                return project(relation.to_arrow_table().cast(wanted), descriptor)
            finally:
                con.close()
        return project(self._live(descriptor, as_of), descriptor)

    def load_table_reader(self, table: str, as_of: int, batch_size: int = 100_000,
                          ordered: bool = False) -> pa.RecordBatchReader:
        """``load_table`` as a stream of record batches, for tables larger than memory: in key order
        with ``ordered=True``, otherwise in the order ``load_table`` gives (DuckDB's scan order where a
        filter alone answers, key order elsewhere), so that a stream read whole is its table.

        DuckDB reads the catalog's files for ``as_of`` (no user SQL runs here, so no sandbox) on a
        cursor of one process-wide database (opening one costs more than a small read); the cursor
        and its TEMP view close when the reader is exhausted or closed.
        """
        self.check_as_of(as_of)
        descriptor = self.resolve(table, as_of)
        ordered = ordered or not self._scan_order_answers(descriptor, as_of)
        con = reader_cursor()
        try:
            relation, wanted = self._scan(con, descriptor, as_of, ordered)
            # a batch alone would type an array column by its own values' depths (one batch of
            # flat arrays, the next of nested ones), so the whole result's are probed first
            depths = _array_depths(relation, descriptor)
            source = relation.to_arrow_reader(batch_size)
            schema = project(wanted.empty_table(), descriptor, depths).schema
        except BaseException:
            con.close()
            raise

        def batches() -> Any:
            try:
                for batch in source:
                    yield from project(pa.Table.from_batches([batch]).cast(wanted), descriptor, depths).to_batches()
            finally:
                con.close()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def count_rows(self, descriptor: TableDescriptor, as_of: int) -> int:
        """How many rows the table ``descriptor`` (in force as of ``as_of``) has as of ``as_of``:
        counted by DuckDB over the catalog's files on the process-wide reader (no user SQL, so no
        sandbox to make nor statement to parse), reading the key column only."""
        self.check_as_of(as_of)
        con = reader_cursor()
        try:
            view = live_view(con, self.store, self.state, descriptor.table_uuid,
                             self.supercolumns(descriptor.table_uuid), as_of, [], "__count")
            row = con.execute(f"SELECT count(*) FROM {_ident(view.name)}").fetchone()
            return int(row[0]) if row else 0
        finally:
            con.close()

    def _scan_order_answers(self, descriptor: TableDescriptor, as_of: int) -> bool:
        """Do the rows come in DuckDB's scan order when no order is asked for? Where a filter alone
        answers (a closed read); elsewhere the reconstruction gives key order anyway."""
        return is_closed_read(self.store, select_files(self.state, descriptor.table_uuid, as_of))

    def _scan(self, con: Any, descriptor: TableDescriptor, as_of: int, ordered: bool) -> tuple[Any, pa.Schema]:
        """A DuckDB relation on ``con`` over the live rows of a table as of ``as_of`` (a TEMP view
        over the files the catalog lists), only the key and the table's supercolumns, and the
        Arrow schema its batches are cast to (the supertable's own types)."""
        supercolumns = self.supercolumns(descriptor.table_uuid)
        view = live_view(con, self.store, self.state, descriptor.table_uuid, supercolumns, as_of,
                         [c.supercolumn for c in descriptor.columns], "__live")
        shown = {KEY, *(c.supercolumn for c in descriptor.columns)}
        # only the columns the table shows: DuckDB then reads neither t nor is_deleted beyond its filters
        names = [name for name in con.sql(f"SELECT * FROM {_ident(view.name)}").columns if name in shown]
        order = f" ORDER BY {_ident(KEY)}" if ordered else ""
        relation = con.sql(f"SELECT {', '.join(_ident(n) for n in names)} FROM {_ident(view.name)}{order}")
        stored = supertable_schema(supercolumns)
        return relation, pa.schema([stored.field(name) for name in names])

    def fetch_row(self, table: str, key: int, as_of: int) -> dict[str, Any] | None:
        """One row as of ``as_of`` as {column name: value}, or None."""
        key = _synthetic_key(key)
        self.check_as_of(as_of)
        descriptor = self.resolve(table, as_of)
        if not descriptor.columns:  # a row of no columns: whether the key is live is all there is
            return {} if self._live(descriptor, as_of, keys=[key]).num_rows else None
        row = live_row(self.store, self.state, descriptor.table_uuid, self.supercolumns(descriptor.table_uuid),
                       as_of, key, [c.supercolumn for c in descriptor.columns])
        if row is None:
            return None
        values = row.to_pylist()[0]
        return {c.column_name: from_arrow_value(c.data_type, values[c.supercolumn]) for c in descriptor.columns}

    def get_catalog(self, as_of: int) -> tuple[TableDescriptor, ...]:
        """The table descriptors in force as of ``as_of``."""
        self.check_as_of(as_of)
        return _cached(_CATALOGS, (*self._sandbox_key(), as_of), lambda: tables_at(self.state.schema_history, as_of))

    def row_history(self, table: str, key: int) -> list[dict[str, Any]]:
        """Every retained version of a key, oldest first, values named as at each version's time."""
        key = _synthetic_key(key)
        descriptor = self._resolve_any_time(table)
        supercolumns = self.supercolumns(descriptor.table_uuid)
        files = self.state.versions_of(descriptor.table_uuid)
        schema = supertable_schema(supercolumns)
        con = reader_cursor()
        try:
            table_ = key_versions(con, self.store, files, schema, key)
        finally:
            con.close()
        if table_ is None:  # an object store, or types DuckDB gives back otherwise
            table_ = read_key(self.store, files, schema, schema.names, key, None, 2**63 - 1)
        table_ = table_.sort_by([(LT, "ascending")])
        epochs = _descriptor_epochs(self.state.schema_history, descriptor.table_uuid)
        ts = table_.column(LT).to_pylist()
        deleted = table_.column(DELETED).to_pylist()
        values: list[dict[str, Any] | None] = [None] * len(ts)
        # rows are in timestamp order, so each schema epoch is one run of rows: the values of a
        # run are converted column by column (not value by value), named as in that epoch, and
        # its dicts are built by map() (a Python loop per row costs a third more)
        bounds = [bisect.bisect_left(ts, t) for t, _ in epochs[1:]] + [len(ts)]
        start = bisect.bisect_left(ts, epochs[0][0]) if epochs else len(ts)
        for (_, at), end in zip(epochs, bounds, strict=True):
            if at is not None and end > start:
                run = table_.slice(start, end - start)
                names = [c.column_name for c in at.columns]
                columns = [from_arrow_values(c.data_type, run.column(c.supercolumn)) for c in at.columns]
                rows = zip(*columns, strict=True) if columns else itertools.repeat((), end - start)
                values[start:end] = map(dict, map(zip, itertools.repeat(names), rows))
            start = end
        for i in itertools.compress(range(len(ts)), deleted):
            values[i] = None  # a deletion has no values
        return [
            {"logical_timestamp": t, "is_deleted": d, "values": v}
            for t, d, v in zip(ts, deleted, values, strict=True)
        ]

    def _resolve_any_time(self, table: str) -> TableDescriptor:
        latest = self.state.frontier + 1
        try:
            return self.resolve(table, latest)
        except TableNotFoundError:
            for entry in reversed(self.state.schema_history):
                if entry.descriptor is not None and table in (entry.table_name, entry.table_uuid):
                    return entry.descriptor
            raise

    def diff(self, table: str, from_: int, to: int) -> dict[str, list[dict[str, Any]]]:
        """Keys inserted, deleted and changed between the states as of ``from_`` and ``to``.

        The table is the one named ``table`` at ``to`` (or at ``from_`` if it is gone by then),
        followed by uuid across renames. A key is changed when a column it has in both states
        differs (a column whose type changed in between is compared after casting the old value).
        Each list is in key order; ``diff_reader`` gives the same as a stream of Arrow batches.
        """
        from history_pipeline.query.diff import diff_to_dict

        return diff_to_dict(self.diff_reader(table, from_, to, as_stored=True))

    def diff_reader(self, table: str, from_: int, to: int, batch_size: int = 100_000,
                    as_stored: bool = False) -> pa.RecordBatchReader:
        """``diff`` as a stream of record batches (kind, key, before, after: see ``query/diff.py``),
        computed by DuckDB over the catalog's files for both states; the rows' columns typed as
        ``load_table`` gives them, or with ``as_stored`` as stored (what ``diff_to_dict`` reads)."""
        from history_pipeline.query import diff as d

        self.check_as_of(from_)
        self.check_as_of(to)
        anchor = self._maybe_resolve(table, to) or self._maybe_resolve(table, from_)
        if anchor is None:
            self.resolve(table, to)  # raises, listing the tables that exist then
        assert anchor is not None
        self.check_table_as_of(anchor, from_)  # below a TTL purge point the "before" state is gone
        epochs = _descriptor_epochs(self.state.schema_history, anchor.table_uuid)
        before, after = _epoch_at(epochs, from_), _epoch_at(epochs, to)
        supercolumns = self.supercolumns(anchor.table_uuid)
        con = reader_cursor()
        try:
            views, depths = [], []
            for descriptor, as_of, name in ((before, from_, "__diff_before"), (after, to, "__diff_after")):
                if descriptor is None:
                    views.append(None)
                    depths.append({})
                    continue
                live_view(con, self.store, self.state, anchor.table_uuid, supercolumns, as_of,
                          [c.supercolumn for c in descriptor.columns], name)
                views.append(name)
                depths.append(_array_depths(con.sql(f"SELECT * FROM {_ident(name)}"), descriptor))
            sides = d.DiffSides(anchor.table_uuid, from_, to, before, after, views[0], views[1],
                                supertable_schema(supercolumns))
            con.register("__diff_unsettled", pa.table({"k": d.unsettled_changes(con, sides)}))
            schema = d.diff_schema(sides, (depths[0], depths[1]), as_stored)
            source = con.sql(d.diff_query(sides)).to_arrow_reader(batch_size)
        except BaseException:
            con.close()
            raise

        def batches() -> Any:
            try:
                yield from d.answer_batches(source, sides, schema, (depths[0], depths[1]), as_stored)
            finally:
                con.close()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def _maybe_resolve(self, table: str, as_of: int) -> TableDescriptor | None:
        try:
            return self.resolve(table, as_of)
        except TableNotFoundError:
            return None

    def sql(self, query: str, as_of: int) -> pa.Table:
        """Read-only SQL over every table visible as of ``as_of`` plus _history_catalog.schema_history."""
        with self.sql_reader(query, as_of) as reader:
            return reader.read_all()

    def sql_reader(self, query: str, as_of: int, batch_size: int = 100_000) -> pa.RecordBatchReader:
        """``sql`` as a stream of record batches, for results larger than memory.

        The DuckDB connection behind it closes when the reader is exhausted or closed.
        """
        self.check_as_of(as_of)
        _check_read_only(query)
        fresh, kept = sandbox_cursor(self._sandbox_key(), self._readable_paths)
        try:
            referenced = _referenced_tables(query)
            tables = [
                d for d in self.get_catalog(as_of) if referenced is None or d.table_name.lower() in referenced
            ]
            with_history = referenced is None or not referenced.isdisjoint(_HISTORY_NAMES)
            views = self._views(fresh, tables, as_of)
            schema, shared = self._schema_for(kept, views, as_of)
        except BaseException:
            fresh.close()
            raise
        # a cursor a finished query of this schema gave back has it, its registrations and macros set
        # up already: taking one costs nothing, setting them up about a millisecond each
        pooled = kept.take(schema, fresh)
        con = pooled.con
        try:
            wide, shapes = self._create_views(pooled, kept, views, as_of, schema, shared, with_history)
            with self._sql_errors(as_of, wide):
                # the rewrite depends on the query and the column types it sees, not on T: a worker's
                # every query is the first at its T, and probing costs more than the query itself
                key = (*self._sandbox_key(), query, as_of if shapes is None else shapes)
                made: list[_Rewrite] = []

                def make() -> _Rewrite:
                    made.append(_rewrite(con, query))
                    return made[0]

                exact = _cached(_REWRITES, key, make)
                if made:  # the probe created its macros on this very cursor
                    pooled.macros.update(exact.macros)
                for macro in exact.macros:
                    if macro not in pooled.macros:  # made by the probe on its cursor, or by an earlier query
                        con.execute(macro)
                        pooled.macros.add(macro)
                relation = con.sql(exact.query)
                duck_types = [str(t) for t in relation.types]
                source = relation.to_arrow_reader(batch_size)
            if exact.names is not None:
                source = _renamed_reader(source, [*exact.names, *source.schema.names[len(exact.names):]])
            try:
                result_schema = _exact_texts(_restore_types(source.schema.empty_table(), duck_types),
                                             exact.texts, exact.shown_columns).schema
            except pa.ArrowNotImplementedError as exc:  # e.g. a UNION value: pyarrow cannot build one
                names = ", ".join(f"{f.name} ({f.type})" for f in source.schema)
                raise QueryError(f"the result's columns {names} include a type Arrow cannot hand back ({exc}); "
                                 "cast it in the query, e.g. CAST(column AS VARCHAR)") from None
        except BaseException:
            kept.give_back(schema, pooled, keep=False)
            raise
        batches = self._batches(pooled, kept, schema, source, duck_types, as_of, wide, exact)
        next(batches)  # started: a reader dropped unread closes it, giving its cursor back
        return pa.RecordBatchReader.from_batches(result_schema, batches)

    def _batches(self, pooled: PooledCursor, kept: SandboxViews, schema: str, source: Any, duck_types: list[str],
                 as_of: int, wide: list[str], exact: _Rewrite) -> Any:
        finished = False
        try:
            yield None  # the caller's first step: from here on, closing the generator runs ``finally``
            with self._sql_errors(as_of, wide):
                for batch in source:
                    table = _restore_types(pa.Table.from_batches([batch]), duck_types)
                    yield from _exact_texts(table, exact.texts, exact.shown_columns).to_batches()
            finished = True
        finally:
            source.close()
            kept.give_back(schema, pooled, keep=finished and pooled.poolable)

    @contextlib.contextmanager
    def _sql_errors(self, as_of: int, wide: list[str]) -> Any:
        """DuckDB's errors as the typed errors of this package."""
        try:
            yield
        except duckdb.PermissionException as exc:
            raise SandboxViolationError(f"refused by the read-only sandbox: {exc}") from None
        except duckdb.CatalogException as exc:
            names = ", ".join(d.table_name for d in self.get_catalog(as_of)) or "none"
            raise TableNotFoundError(f"{exc} (as of {as_of}, the tables are: {names})") from None
        except duckdb.Error as exc:
            hint = ""
            if wide:
                hint = (f"; note: {', '.join(wide)} hold NUMERIC values wider than DECIMAL(38) as of {as_of}, "
                        "so SQL sees them as exact text (cast them, e.g. to DOUBLE, to compute approximately)")
            raise QueryError(f"the query failed as of {as_of}: {exc}{hint}") from None

    def forget(self, as_of: int | None = None) -> None:
        """Drop what this process keeps for the queries of this catalog state as of ``as_of`` (its
        views, the tables kept for them, idle cursors, prepared SQL), or for every T with None (the
        state's sandbox too). The next query there is prepared anew; answers are the same."""
        key = self._sandbox_key()
        width = len(key)
        with _cache_lock:
            for cache in (_VIEWS, _HISTORIES, _CATALOGS, _REWRITES):
                # a rewrite is kept per state and view shapes; only one of array tables holds T
                at = width + 1 if cache is _REWRITES else width
                for k in [k for k in cache if k[:width] == key and (as_of is None or k[at] == as_of)]:
                    del cache[k]
        sandbox_forget(key, None if as_of is None else AS_OF_SCHEMA.format(as_of=as_of))

    def _sandbox_key(self) -> tuple[str, ...]:
        return (type(self.store).__name__, self.store.full_path(self.database), str(self.state.txn_id),
                self.state.txn_uuid or "")

    def _readable_paths(self) -> list[str] | None:
        """Every live file of this state on a local root (S3 files are read as registered datasets)."""
        if not isinstance(self.store, LocalStore):
            return None
        return [self.store.full_path(f.path) for f in self.state.files.values()]

    def _views(self, con: Any, tables: Sequence[TableDescriptor], as_of: int
               ) -> list[tuple[TableDescriptor, _TableView | None]]:
        """Each table's view at ``as_of`` (None for a table with array columns, exposed per query),
        its SQL and NUMERIC probe made once per process (``_VIEWS``) on ``con``."""
        _refuse_names_only_case_tells_apart(tables, as_of)
        key = (*self._sandbox_key(), as_of)
        views: list[tuple[TableDescriptor, _TableView | None]] = []
        for descriptor in tables:
            self.check_table_as_of(descriptor, as_of)
            if any(c.data_type.kind is TypeKind.ARRAY for c in descriptor.columns):
                views.append((descriptor, None))
                continue
            views.append((descriptor, _cached(_VIEWS, (*key, descriptor.table_uuid),
                                              lambda d=descriptor: self._table_view(con, d, as_of))))
        return views

    @staticmethod
    def _schema_for(kept: SandboxViews, views: Sequence[tuple[TableDescriptor, _TableView | None]],
                    as_of: int) -> tuple[str, bool]:
        """The schema a query at ``as_of`` reads its views in, and whether it is shared by other T:
        shared when every view is a filter over rows this sandbox keeps for the same files (their
        SQL then differs between such T only by T, taken from ``AS_OF_VARIABLE``), for the first
        query at T; a second query at T makes T's own schema, whose live rows are kept, and a T with
        its own schema already reads it."""
        own = AS_OF_SCHEMA.format(as_of=as_of)
        parts = []
        for descriptor, view in views:
            if view is None or view.interval is None or view.interval[0] not in kept.intervals:
                return own, False
            parts.append((descriptor.table_name, view.interval[0], view.columns))
        # a T with views of its own reads them (its second query keeps its live rows)
        if not parts or own in kept.schemas or kept.served_shared(own):
            return own, False
        return AS_OF_SCHEMA.format(as_of="s" + hashlib.sha1(repr(parts).encode()).hexdigest()[:20]), True

    def _create_views(self, pooled: PooledCursor, kept: SandboxViews,
                      views: Sequence[tuple[TableDescriptor, _TableView | None]], as_of: int, schema: str,
                      shared: bool, with_history: bool = True) -> tuple[list[str], tuple[Any, ...] | None]:
        """Resolve the query's table names to their live rows at ``as_of``, under their names then,
        plus the schema history when the query may read it. Returns the NUMERIC columns too wide
        for DECIMAL(38, s), and what fixes the views' column types (their names and select lists;
        None when a table with array columns, typed by its rows, is among them).

        A view is made once per sandbox in ``schema``, which the cursor ``USE``s: T's own
        (``AS_OF_SCHEMA``), or with ``shared`` one every T whose views read the same kept rows
        shares, T set as ``AS_OF_VARIABLE`` on the cursor (the schema history then registered whole,
        filtered by it too); a table with array columns is a TEMP view of its reconstruction, which
        the cursor finds first.
        """
        con, done = pooled.con, pooled.done
        if pooled.as_of != as_of and (shared or pooled.as_of is not None):
            # the cursor's variable outlives its move from a shared schema: it filters the history
            con.execute(f"SET VARIABLE {AS_OF_VARIABLE} = CAST({int(as_of)} AS BIGINT)")
            pooled.as_of = as_of
        if with_history and "history" not in done:  # registering it costs about a millisecond
            at = None if shared else as_of
            register_schema_history(con, _cached(_HISTORIES, (*self._sandbox_key(), at), lambda: schema_history_table(
                [e for e in self.state.schema_history if at is None or e.logical_timestamp < at])))
            done.add("history")
        # a T a shared schema served before asks again: its own views keep its live rows at once
        again = not shared and schema in kept.shared_at
        wide: list[str] = []
        shapes: list[tuple[str, str]] | None = []
        for index, (descriptor, view) in enumerate(views):
            if view is None:
                # its TEMP view holds this query's reconstruction: the cursor is not kept for another
                pooled.poolable = False
                shapes = None
                wide.extend(self._expose_materialized(con, descriptor, as_of, index))
                continue
            if descriptor.table_uuid not in done:
                if shared:
                    assert view.interval is not None
                    kept.ensure_shared(con, schema, descriptor.table_name, view.shared_sql.replace(
                        CHANGES_TOKEN, kept.intervals[view.interval[0]][0]), view.interval[0])
                else:
                    for name, dataset in view.datasets:
                        con.register(name, dataset)
                        pooled.registered.append(name)
                    kept.ensure(con, schema, descriptor.table_name, view.sql, view.changes, view.live_bytes,
                                view.interval)
                    if again:
                        kept.ensure(con, schema, descriptor.table_name)
                done.add(descriptor.table_uuid)
            elif kept.deferred and not shared:  # a pooled cursor's second query at T keeps what the first deferred
                kept.ensure(con, schema, descriptor.table_name)
            wide.extend(view.wide)
            if shapes is not None:
                shapes.append((descriptor.table_name, view.columns))
        if "use" not in done:  # USE costs about a millisecond
            kept.use(con, schema)
            done.add("use")
        return wide, None if shapes is None else (with_history, *shapes)

    def _table_view(self, con: Any, descriptor: TableDescriptor, as_of: int) -> _TableView:
        """The SELECT a table's view runs as of ``as_of``; unconstrained NUMERIC as DECIMAL(p, s)
        fitted to the live values (probed here, once) or exact text when wider than DECIMAL(38)."""
        supercolumns = self.supercolumns(descriptor.table_uuid)
        live = live_sql(self.store, self.state, descriptor.table_uuid, supercolumns, as_of,
                        [c.supercolumn for c in descriptor.columns],
                        f"__live_{hashlib.sha1(descriptor.table_uuid.encode()).hexdigest()[:16]}_{as_of}", con)
        for name, dataset in live.datasets:
            con.register(name, dataset)
        fits: dict[str, tuple[int, int] | None] = {}
        wide = []
        unconstrained = [c for c in descriptor.columns
                         if c.data_type.kind is TypeKind.NUMERIC and not c.data_type.is_exact_decimal]
        if unconstrained:
            probe = ", ".join(f"{_NUMERIC_INT_DIGITS.format(c=_ident(c.supercolumn))}, "
                              f"{_NUMERIC_SCALE.format(c=_ident(c.supercolumn))}" for c in unconstrained)
            row = con.execute(f"SELECT {probe} FROM ({live.sql}) live").fetchall()[0]
            for n, c in enumerate(unconstrained):
                int_digits, scale = row[2 * n] or 0, row[2 * n + 1] or 0
                # the precision the values need, so that an exact AVG keeps as many decimals as room allows
                # (scale 38 too stays text: DuckDB reads "1E-38" into no DECIMAL)
                fits[c.supercolumn] = ((max(1, int_digits + scale), scale) if int_digits + scale <= 38 and scale < 38
                                       else None)
                if fits[c.supercolumn] is None:
                    wide.append(f"{descriptor.table_name}.{c.column_name}")
        columns = _sql_columns(descriptor, fits)
        changes = None
        if live.changes_sql is not None and live.materialized_sql is not None:
            view = (live.materialized_sql.replace(COLUMNS_TOKEN, columns) if live.kept_tail
                    else f"SELECT {columns} FROM ({live.materialized_sql}) live")
            changes = (live.changes_sql, live.changes_bytes, view)
        interval = None
        shared = ""
        if live.interval is not None:
            name, build, where, size = live.interval
            interval = (name, build, f"SELECT {columns} FROM {CHANGES_TOKEN} WHERE {where}", size)
            shared = (f"SELECT {columns} FROM {CHANGES_TOKEN} "
                      f"WHERE {interval_filter(f'getvariable({AS_OF_VARIABLE!r})')}")
        return _TableView(f"SELECT {columns} FROM ({live.sql}) live", live.datasets, tuple(wide), changes,
                          live.live_bytes, columns, interval, shared)

    def _expose_materialized(self, con: Any, descriptor: TableDescriptor, as_of: int, index: int) -> list[str]:
        """A table with array columns is exposed from its reconstructed Arrow table: arrays are stored
        as JSON whose depth may vary by row, so only the reconstruction knows their SQL type (a list
        when uniform, JSON otherwise). Returns the NUMERIC columns too wide for DECIMAL(38, s)."""
        data = self.load_table(descriptor.table_name, as_of)
        shows_key = _shows_key(descriptor)
        if not shows_key:  # the key is column 0, the user's column of its name comes later
            data = data.remove_column(0)
        wide: list[str] = []
        for c in descriptor.columns:
            if c.data_type.kind is TypeKind.NUMERIC and not c.data_type.is_exact_decimal:
                position = data.schema.get_field_index(c.column_name)
                exact = exact_decimal_array(data.column(position), fit_precision=True)
                if exact is None:
                    wide.append(f"{descriptor.table_name}.{c.column_name}")
                    column = data.column(position)
                    exact = pa.chunked_array(
                        [k.storage if isinstance(k, pa.ExtensionArray) else k for k in column.chunks], pa.string()
                    )
                data = data.set_column(position, c.column_name, exact)
        raw = f"__table_{index}"
        con.register(raw, data)
        parts = [KEY] if shows_key else []
        for c in descriptor.columns:
            ident = _ident(c.column_name)
            field = data.schema.field(c.column_name)
            if c.data_type.kind is TypeKind.JSONB or isinstance(field.type, ArrayResultType):
                parts.append(f"CAST({ident} AS JSON) AS {ident}")  # array depths vary by row: JSON holds them
            elif c.data_type.kind is TypeKind.CHAR:
                parts.append(f"{_char_text(ident)} AS {ident}")
            else:
                parts.append(ident)
        con.execute(f"CREATE TEMP VIEW {_ident(descriptor.table_name)} AS SELECT {', '.join(parts)} FROM {raw}")
        return wide

@dataclass(frozen=True)
class _TableView:
    """What a query's view of one table is at (state, T): its SELECT, the datasets it names, and
    its NUMERIC columns too wide for DECIMAL(38, s)."""

    sql: str
    datasets: tuple[tuple[str, Any], ...]
    wide: tuple[str, ...]
    changes: tuple[str, int, str] | None = None  # see SandboxViews.ensure
    live_bytes: int = 0  # see SandboxViews.ensure
    columns: str = ""  # the select list: the view's column names and types
    interval: tuple[str, str, str, int] | None = None  # see SandboxViews.ensure
    shared_sql: str = ""  # the interval's view taking T from AS_OF_VARIABLE (SandboxViews.ensure_shared)


@dataclass(frozen=True)
class _Rewrite:
    """A query as run (NUMERIC quotients and averages exact), the macros it calls, the user's column
    names when renamed, and the quotients the result shows (their operands in hidden columns)."""

    query: str
    macros: tuple[str, ...]
    names: tuple[str, ...] | None
    texts: tuple[ResultQuotient, ...] = ()
    shown_columns: int = 0  # see ExactRewrite


def _rewrite(con: Any, query: str) -> _Rewrite:
    exact = exact_numeric_rewrite(con, query)
    names = None
    if exact.query != query:
        try:
            names = tuple(con.sql(query).columns)  # the user's column names
        except duckdb.Error:  # it calls what only the rewrite defines (div): the rewritten query's names
            names = None
    return _Rewrite(exact.query, exact.macros, names, exact.quotients, exact.shown_columns)


def _exact_texts(table: pa.Table, quotients: tuple[ResultQuotient, ...], width: int) -> pa.Table:
    """Each quotient column of the result as PostgreSQL's exact digits (read back as Decimal),
    computed from its operands' columns (hidden, or the user's own), and the columns from ``width``
    on (the hidden ones) dropped."""
    if not quotients:
        return table
    columns = list(table.columns)
    for q in quotients:
        try:
            texts = quotient_texts([table.column(i) for i in q.columns], q)
        except ArithmeticError as exc:  # PostgreSQL's own refusals: division by zero, ln(0), sqrt(-1)
            raise QueryError(f"the query failed: {exc}") from None
        columns[q.shown] = numeric_result_array(pa.array(texts, pa.string()))
    return pa.table(columns[:width], names=table.column_names[:width])


#: per (store, database, transaction, T[, table]) what a query builds before it runs: catalog
#: states are immutable, so these never go stale; bounded, oldest dropped first
_CACHE_SIZE = 1024
_cache_lock = threading.Lock()
_VIEWS: OrderedDict[tuple[Any, ...], _TableView] = OrderedDict()
_REWRITES: OrderedDict[tuple[Any, ...], _Rewrite] = OrderedDict()
_HISTORIES: OrderedDict[tuple[Any, ...], pa.Table] = OrderedDict()
#: what DuckDB names for ``_history_catalog.schema_history`` (in the sandbox it sees through the view)
_HISTORY_NAMES = frozenset({"schema_history", "__schema_history"})
_CATALOGS: OrderedDict[tuple[Any, ...], tuple[TableDescriptor, ...]] = OrderedDict()


def _cached(cache: OrderedDict[tuple[Any, ...], Any], key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``make()`` on a miss (outside the lock: two makers agree)."""
    with _cache_lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = make()
    with _cache_lock:
        cache[key] = value
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    return value


def _renamed_reader(source: pa.RecordBatchReader, names: list[str]) -> pa.RecordBatchReader:
    """The same batches under other column names."""
    schema = pa.schema([field.with_name(name) for field, name in zip(source.schema, names, strict=True)])
    return pa.RecordBatchReader.from_batches(
        schema, (pa.RecordBatch.from_arrays(batch.columns, schema=schema) for batch in source))


def _refuse_names_only_case_tells_apart(tables: Sequence[TableDescriptor], as_of: int) -> None:
    """A QueryError when two of the tables, or two columns of one, differ only in case: DuckDB's names
    are case-insensitive even when quoted, so one view hid the other and "X" read table x's rows."""
    groups: dict[str, list[str]] = {}
    for descriptor in tables:
        groups.setdefault(descriptor.table_name.lower(), []).append(descriptor.table_name)
        columns: dict[str, list[str]] = {}
        for column in descriptor.columns:
            columns.setdefault(column.column_name.lower(), []).append(column.column_name)
        clash = next((names for names in columns.values() if len(names) > 1), None)
        if clash:
            raise QueryError(f"columns {' and '.join(map(repr, clash))} of table {descriptor.table_name!r} differ "
                             f"only in case as of {as_of}: SQL here cannot tell them apart (its names are "
                             "case-insensitive); read the table with load_table")
    clash = next((names for names in groups.values() if len(names) > 1), None)
    if clash:
        raise QueryError(f"tables {' and '.join(map(repr, clash))} differ only in case as of {as_of}: SQL here "
                         "cannot tell them apart (its names are case-insensitive); read them with load_table")


def _restore_types(table: pa.Table, duckdb_types: list[str]) -> pa.Table:
    """DuckDB hands UUID and JSON results over as text: give them back their own types."""
    import uuid as uuidlib

    columns = []
    for column, type_name in zip(table.columns, duckdb_types, strict=True):
        if type_name == "UUID" and pa.types.is_string(column.type):
            values = [None if v is None else uuidlib.UUID(v).bytes for v in column.to_pylist()]
            column = pa.array(values, pa.uuid())
        elif type_name.startswith("UUID[") and type_name.endswith("]"):  # lists of UUIDs: the same, inside
            storage, target = pa.binary(16), pa.uuid()
            for _ in range(type_name.count("[")):
                storage, target = pa.list_(storage), pa.list_(target)
            if column.type != target:
                values = [None if v is None else map_leaves(v, lambda u: None if u is None else uuidlib.UUID(u).bytes)
                          for v in column.to_pylist()]
                column = pa.array(values, storage).cast(target)
        elif type_name == "JSON" and pa.types.is_string(column.type):
            column = jsonb_result_array(column)
        columns.append(column)
    return pa.table(columns, names=table.column_names)


@functools.lru_cache(maxsize=1024)
def _referenced_tables(query: str) -> frozenset[str] | None:
    """Lower-cased names the query reads (None when DuckDB cannot tell), found inside a sandbox.

    Naming the tables binds table functions, so it runs with external access already off.
    """
    probe = parser_cursor()
    try:
        return frozenset(name.lower() for name in probe.get_table_names(query))
    except duckdb.PermissionException as exc:
        raise SandboxViolationError(f"refused by the read-only sandbox: {exc}") from None
    except duckdb.Error:
        return None
    finally:
        probe.close()


def _descriptor_epochs(
    history: Sequence[SchemaHistoryEntry], table_uuid: str
) -> list[tuple[int, TableDescriptor | None]]:
    """(t of each schema change of a table, its descriptor from t + 1 on), in order."""
    epochs: list[tuple[int, TableDescriptor | None]] = []
    for entry in history:
        if entry.table_uuid == table_uuid:
            if epochs and epochs[-1][0] == entry.logical_timestamp:
                epochs[-1] = (entry.logical_timestamp, entry.descriptor or epochs[-1][1])
            else:
                epochs.append((entry.logical_timestamp, entry.descriptor))
    return epochs


def _epoch_at(epochs: list[tuple[int, TableDescriptor | None]], as_of: int) -> TableDescriptor | None:
    """The descriptor in force as of ``as_of`` (changes with t < as_of)."""
    index = bisect.bisect_left(epochs, as_of, key=lambda epoch: epoch[0]) - 1
    return epochs[index][1] if index >= 0 else None


def project(rows: pa.Table, descriptor: TableDescriptor, depths: Mapping[str, set[int]] | None = None) -> pa.Table:
    """Supertable rows to a table as users see it: synthetic_key, then columns under their names
    (array columns typed by ``depths``, by supercolumn, when ``rows`` are a part of the table)."""
    arrays = [rows.column(KEY)]
    names = [KEY]
    for c in descriptor.columns:
        column = rows.column(c.supercolumn) if c.supercolumn in rows.column_names else pa.nulls(rows.num_rows)
        arrays.append(_user_array(column, c.data_type, None if depths is None else depths.get(c.supercolumn)))
        names.append(c.column_name)
    return pa.table(arrays, names=names)


def _array_depths(relation: Any, descriptor: TableDescriptor) -> dict[str, set[int]]:
    """The depths of the non-empty values of each array column in ``relation`` (the opening
    brackets of their compact JSON: arrays are rectangular), so that every batch of a stream
    gets the type the whole result has."""
    columns = [c.supercolumn for c in descriptor.columns
               if c.data_type.kind is TypeKind.ARRAY and c.supercolumn in relation.columns]
    if not columns:
        return {}
    probe = ", ".join(f"list(DISTINCT length(regexp_extract(CAST({_ident(c)} AS VARCHAR), '^\\[+'))) "
                      f"FILTER (WHERE CAST({_ident(c)} AS VARCHAR) <> '[]')" for c in columns)
    row = relation.aggregate(probe).fetchall()[0]
    return {c: set(found or ()) for c, found in zip(columns, row, strict=True)}


def _user_array(column: Any, data_type: DataType, depths: set[int] | None = None) -> Any:
    if data_type.kind is TypeKind.ARRAY:
        return array_result_array(column, data_type, depths)
    if data_type.kind is TypeKind.JSONB:
        return jsonb_result_array(column)
    if data_type.kind is TypeKind.NUMERIC and not data_type.is_exact_decimal:
        return numeric_result_array(column)
    if data_type.kind is TypeKind.REAL:
        # a REAL reads back as the shortest decimal that names it (0.1, not 0.10000000149...),
        # as PostgreSQL prints it: through Arrow's shortest float32 formatting
        return pc.cast(pc.cast(column, pa.string()), pa.float64())
    if data_type.kind is TypeKind.INTERVAL and column.type == INTERVAL_ARROW:
        return interval_values(column)
    return column



def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _char_text(source: str) -> str:
    """A CHAR(n) column as SQL sees it: its text without the blank padding. DuckDB has no blank-padded
    type, and PostgreSQL compares, groups, sorts, measures (length) and concatenates (||) a bpchar as that
    text; only its display (and LIKE, regular expressions, concat()) keeps the blanks."""
    return f"rtrim({source}, ' ')"


def _shows_key(descriptor: TableDescriptor) -> bool:
    """Does SQL see ``synthetic_key`` beside the table's columns? Not when a column of the table has
    that name (DuckDB's names are case-insensitive): the user's query means the user's column, as in
    PostgreSQL, where the table has no other."""
    return all(c.column_name.lower() != KEY for c in descriptor.columns)


def _sql_columns(descriptor: TableDescriptor, numeric_types: Mapping[str, tuple[int, int] | None]) -> str:
    """The view's select list: supercolumns under their names as of T, in the types SQL sees."""
    parts = [KEY] if _shows_key(descriptor) else []
    for c in descriptor.columns:
        source, ident = _ident(c.supercolumn), _ident(c.column_name)
        kind = c.data_type.kind
        if kind is TypeKind.NUMERIC and not c.data_type.is_exact_decimal:
            fitted = numeric_types.get(c.supercolumn)
            # through DECIMAL(38, s): DuckDB reads exponent text ("1E-20", as Python writes small
            # values) into DECIMAL(p, s) only with a digit to spare, and p = s for values below 1
            expr = source if fitted is None else (f"CAST(CAST({source} AS DECIMAL(38, {fitted[1]})) "
                                                  f"AS DECIMAL({fitted[0]}, {fitted[1]}))")
        elif kind is TypeKind.JSONB:
            expr = f"CAST({source} AS JSON)"
        elif kind is TypeKind.REAL:
            # the shortest decimal that names the float32, as PostgreSQL prints a REAL
            expr = f"CAST(CAST({source} AS VARCHAR) AS DOUBLE)"
        elif kind is TypeKind.INTERVAL:
            expr = (f"to_months({source}.months) + to_days({source}.days) + "
                    f"to_microseconds({source}.micros)")
        elif kind is TypeKind.CHAR:
            expr = _char_text(source)
        else:
            expr = source
        parts.append(f"{expr} AS {ident}")
    return ", ".join(parts)


def exact_decimal_array(column: Any, fit_precision: bool = False) -> Any | None:
    """A column of unconstrained NUMERIC text as decimal128(38, s), s fitted to its values (and the
    precision too with ``fit_precision``); None when some value needs more than 38 digits (the text
    then stays the exact form)."""
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    if isinstance(column, pa.ChunkedArray):
        storage = pa.chunked_array(
            [c.storage if isinstance(c, pa.ExtensionArray) else c for c in column.chunks], pa.string()
        )
    con = reader_cursor()  # a new database costs 15-50 ms; a cursor's registrations are its own
    try:
        con.register("__numeric", pa.table({"v": storage}))
        int_digits, scale = con.execute(
            f"SELECT {_NUMERIC_INT_DIGITS.format(c='v')}, {_NUMERIC_SCALE.format(c='v')} FROM __numeric"
        ).fetchall()[0]
        int_digits, scale = int_digits or 0, scale or 0
        if int_digits + scale > 38:
            return None
        precision = max(1, int_digits + scale) if fit_precision else 38
        # read as DECIMAL(38, s) first: DuckDB refuses exponent text such as "1E-20" or "12E-1" in
        # a DECIMAL(p, s) without a digit to spare (p = 20, s = 20), then narrows exactly
        wide = f"CAST(v AS DECIMAL(38, {scale}))"
        try:
            fitted = con.sql(f"SELECT CAST({wide} AS DECIMAL({precision}, {scale})) AS v FROM __numeric")
            return fitted.to_arrow_table().column("v")
        except duckdb.ConversionException:
            return None  # "1E-38" fits no DECIMAL DuckDB reads it into: the text stays the exact form
    finally:
        con.close()


@functools.lru_cache(maxsize=1024)
def _synthetic_key(key: Any) -> int:
    """``key`` as a synthetic key (numpy integers too), or a :class:`QueryError` saying what it is
    (a str or None failed deep in the key-range pruning with a bare TypeError, a float matched nothing)."""
    try:
        value = operator.index(key)
    except TypeError:
        raise QueryError(f"key {key!r} is not a synthetic key: pass a 64-bit integer") from None
    if isinstance(key, bool) or not -(2**63) <= value < 2**63:
        raise QueryError(f"key {key!r} is not a synthetic key: pass a 64-bit integer")
    return value


def _check_read_only(query: str) -> None:
    """Refuse anything but SELECT statements (parsed once per query text), and any mention of the
    sandbox's per-T schemas (a query reads its own T only through the names it resolves)."""
    if not isinstance(query, str):
        raise QueryError(f"SQL must be a string, got {type(query).__name__}")
    _check_read_only_text(query)


@functools.lru_cache(maxsize=1024)
def _check_read_only_text(query: str) -> None:
    """``_check_read_only`` of a string; a query that passed once passes again without a parse."""
    if _INTERNAL_SCHEMA.search(query):
        raise SandboxViolationError(
            "refused by the read-only sandbox: names starting with __hp_asof_ are internal; name the tables as of T"
        )
    probe = parser_cursor()
    try:
        statements = probe.extract_statements(query)
    except duckdb.ParserException:  # (sql_reader's path: the one-line error sql gives, naming the line)
        from history_pipeline.query.statements import check_syntax

        check_syntax(query)
        raise
    finally:
        probe.close()
    if not statements:
        raise SandboxViolationError("empty SQL")
    for statement in statements:
        if statement.type != duckdb.StatementType.SELECT:
            raise SandboxViolationError(
                f"only read-only SELECT queries run against history; got a {statement.type.name} statement"
            )


_INTERNAL_SCHEMA = re.compile(AS_OF_SCHEMA.split("{")[0], re.IGNORECASE)

# Decimal text as written by Python's str(Decimal): "-12.3400", "1.5E-7", "1.2345E+7".
# Integer digits and scale of each value (over-estimated, never under), to pick DECIMAL(38, s).
_MANTISSA = "split_part(lower({c}), 'e', 1)"
_EXPONENT = "coalesce(TRY_CAST(nullif(split_part(lower({c}), 'e', 2), '') AS INTEGER), 0)"
_NUMERIC_INT_DIGITS = (
    "max(greatest(0, length(ltrim(split_part(" + _MANTISSA + ", '.', 1), '-+0')) + " + _EXPONENT + "))"
)
_NUMERIC_SCALE = "max(greatest(0, length(split_part(" + _MANTISSA + ", '.', 2)) - " + _EXPONENT + "))"
