"""Point-in-time exports: the whole database as of T, one Parquet file per table plus its schema.

An export becomes visible only when its manifest is written, after every
table file: an interrupted upload leaves no partial export that a loader
would read.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from history_pipeline.errors import HistoryError
from history_pipeline.io.store import ObjectStore
from history_pipeline.query.engine import QueryContext, exact_decimal_array
from history_pipeline.schema import TableDescriptor
from history_pipeline.types import TypeKind, interval_storage, interval_values

MANIFEST = "manifest.json"


class ExportSource(Protocol):
    """What an export reads: the database's name and a frozen view of its newest state."""

    @property
    def database(self) -> str: ...

    def query_context(self) -> QueryContext: ...


def export_prefix(database: str, as_of: int) -> str:
    return f"{database}/exports/as_of={as_of:020d}"


def export_database(
    store: ExportSource, as_of: int, target: ObjectStore, on_table: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Write every table as of ``as_of`` to ``target``; returns the manifest."""
    context = store.query_context()
    tables = context.get_catalog(as_of)
    prefix = export_prefix(store.database, as_of)
    written = []
    for index, descriptor in enumerate(tables):
        data = _exact_numerics(context.load_table(descriptor.table_name, as_of), descriptor)
        data = _with_intervals(data, descriptor, interval_storage)
        buffer = io.BytesIO()
        pq.write_table(data, buffer, compression="zstd")
        path = f"{prefix}/tables/{index:04d}-{descriptor.table_uuid}.parquet"
        target.put(path, buffer.getvalue())
        written.append(
            {"table_name": descriptor.table_name, "path": path, "rows": data.num_rows,
             "bytes": len(buffer.getvalue()), "schema": descriptor.to_json()}
        )
        if on_table:
            on_table(descriptor.table_name)
    manifest = {"database": store.database, "as_of": as_of, "frontier": context.state.frontier, "tables": written}
    target.put(f"{prefix}/{MANIFEST}", json.dumps(manifest, indent=2).encode())
    return manifest


def _exact_numerics(data: pa.Table, descriptor: TableDescriptor) -> pa.Table:
    """Unconstrained NUMERIC columns as DECIMAL(38, s) when every value fits (any reader sums them
    exactly); otherwise they stay exact decimal text, never a float."""
    for column in descriptor.columns:
        if column.data_type.kind is TypeKind.NUMERIC and not column.data_type.is_exact_decimal:
            index = data.column_names.index(column.column_name)
            fitted = exact_decimal_array(data.column(index))
            if fitted is not None:
                data = data.set_column(index, column.column_name, fitted)
    return data


def _with_intervals(data: pa.Table, descriptor: TableDescriptor, convert: Callable[[Any], Any]) -> pa.Table:
    """``data`` with its INTERVAL columns converted: an export stores them as the store keeps them
    (``interval_storage``: Parquet has no type for Arrow's month_day_nano values), ``load_export``
    gives them back as ``load_table`` does (``interval_values``)."""
    for column in descriptor.columns:
        if column.data_type.kind is TypeKind.INTERVAL and column.column_name in data.column_names:
            index = data.column_names.index(column.column_name)
            data = data.set_column(index, column.column_name, convert(data.column(index)))
    return data


def list_exports(target: ObjectStore, database: str) -> list[int]:
    """The as_of of every complete export of ``database`` in ``target``."""
    found = []
    for obj in target.list(f"{database}/exports/"):
        if obj.path.endswith("/" + MANIFEST):
            found.append(int(obj.path.split("as_of=")[1].split("/")[0]))
    return sorted(found)


def load_export(target: ObjectStore, database: str, as_of: int) -> dict[str, pa.Table]:
    """The tables of a complete export, by name."""
    prefix = export_prefix(database, as_of)
    try:
        manifest = json.loads(target.get(f"{prefix}/{MANIFEST}"))
    except HistoryError:
        raise HistoryError(f"no complete export of {database} as of {as_of} in {target.uri}") from None
    return {t["table_name"]: _with_intervals(pq.read_table(io.BytesIO(target.get(t["path"]))),
                                             TableDescriptor.from_json(t["schema"]), interval_values)
            for t in manifest["tables"]}
