"""``history_pipeline.client.connect(url, token)``: the HistoryService client (see ``service/``)."""

from history_pipeline.service.client import HistoryClient, connect
from history_pipeline.service.protocol import (
    DiffRequest,
    FetchRowRequest,
    GetCatalogRequest,
    LoadTableRequest,
    RowHistoryRequest,
    SqlRequest,
)

__all__ = [
    "DiffRequest",
    "FetchRowRequest",
    "GetCatalogRequest",
    "HistoryClient",
    "LoadTableRequest",
    "RowHistoryRequest",
    "SqlRequest",
    "connect",
]
