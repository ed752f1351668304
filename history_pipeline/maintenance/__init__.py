"""Maintenance: merging small files, retention to a purge timestamp, exports and the cold tier."""
