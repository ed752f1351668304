"""Shared fixtures: event builders used across the suite."""

from __future__ import annotations

import pytest


def create_table(t, table_uuid="tbl-1", name="orders", columns=None):
    return {
        "op": "create_table",
        "t": t,
        "table_uuid": table_uuid,
        "table_name": name,
        "columns": columns
        or [
            {"column_uuid": "c-id", "column_name": "id", "data_type": "BIGINT", "is_nullable": False},
            {"column_uuid": "c-amount", "column_name": "amount", "data_type": "NUMERIC(10,2)"},
        ],
    }


@pytest.fixture
def wal_dir(tmp_path):
    return tmp_path / "wal"
