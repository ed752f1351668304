"""Compaction: sealed WAL segments become supertable versions, snapshots and schema history."""
