"""One dynamic partition per sealed WAL segment: ``<database>.<segment id>``."""

from __future__ import annotations

import dagster as dg

segment_partitions = dg.DynamicPartitionsDefinition(name="wal_segments")


def segment_partition_key(database: str, segment_name: str) -> str:
    return f"{database}.{segment_name}"


def parse_segment_partition_key(key: str) -> tuple[str, int]:
    database, _, segment = key.rpartition(".")
    return database, int(segment)
