"""One request against one tenant's HistoryStore, answered as an Arrow table.

Only HistoryStore's public query methods are called, so remote answers are the local ones (SQL
runs in the very same sandbox). Runs inside a worker process (see ``workers.py``).
"""

from __future__ import annotations

import pyarrow as pa

from history_pipeline.service import protocol as p
from history_pipeline.service.limits import Limits, check_result_size
from history_pipeline.store import HistoryStore


def answer_bytes(table: pa.Table, batch_rows: int) -> pa.Buffer:
    """An answer as the Arrow IPC stream the server sends (record batches of at most ``batch_rows``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return sink.getvalue()


def execute(store: HistoryStore, request: p.Request, limits: Limits) -> pa.Table:
    """Answer ``request`` from ``store`` (ResultTooLargeError when the answer exceeds ``limits``)."""
    if isinstance(request, p.FetchRowRequest):
        # the row and its columns' names and types from one state (a commit between two reads of
        # the catalog could rename the table or a column under the row)
        descriptor, row = store.fetch_row_described(request.table_uuid, request.synthetic_key,
                                                    request.query_timestamp)
        return p.fetch_row_to_arrow(descriptor, row)
    if isinstance(request, p.LoadTableRequest):
        table = store.load_table(request.table_uuid, request.query_timestamp, request.ordered)
        check_result_size(table, limits, f"LoadTable of {request.table_uuid!r} as of {request.query_timestamp}")
        descriptor = p.resolve_descriptor(store.get_catalog(request.query_timestamp), request.table_uuid)
        return p.load_table_to_arrow(descriptor, table) if descriptor is not None else table
    if isinstance(request, p.GetCatalogRequest):
        return p.catalog_to_arrow(store.get_catalog(request.query_timestamp))
    if isinstance(request, p.SqlRequest):
        table = store.sql(request.query, request.query_timestamp)
        check_result_size(table, limits, f"the SQL result as of {request.query_timestamp}")
        return table
    if isinstance(request, p.RowHistoryRequest):
        table = p.row_history_to_arrow(store.row_history(request.table_uuid, request.synthetic_key))
        check_result_size(table, limits, f"the history of key {request.synthetic_key} of {request.table_uuid!r}")
        return table
    if isinstance(request, p.DiffRequest):
        table = store.diff_reader(request.table_uuid, request.from_timestamp, request.to_timestamp,
                                  as_stored=not request.load_table_types).read_all()
        check_result_size(
            table, limits,
            f"the diff of {request.table_uuid!r} from {request.from_timestamp} to {request.to_timestamp}",
        )
        return table
    if isinstance(request, p.ChangesRequest):
        tables = None if request.tables is None else list(request.tables)
        table = p.changes_to_arrow(store.changes(tables, since=request.since, until=request.until))
        check_result_size(table, limits, f"the changes from {request.since}")
        return table
    if isinstance(request, p.TableSchemasRequest):
        t = request.query_timestamp
        names = [d.table_name for d in store.get_catalog(t)]
        quoted = {n: '"' + n.replace('"', '""') + '"' for n in names}
        return p.table_schemas_to_arrow({n: store.sql(f"SELECT * FROM {quoted[n]} LIMIT 0", t).schema for n in names})
    if isinstance(request, p.StatusRequest):
        return p.status_to_arrow(store.frontier, store.earliest)
    raise TypeError(f"not a request message: {request!r}")
