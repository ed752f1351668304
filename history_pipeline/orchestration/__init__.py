"""Dagster glue: resources, assets, sensors and schedules wired to the core (which never imports Dagster)."""
