"""Metadata the Dagster UI shows readably: numbers and text, and tables as Markdown (not JSON blobs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str = "(none)") -> dg.MetadataValue:
    """A Markdown table (``empty`` when there are no rows)."""
    lines = [f"| {' | '.join(str(c).replace('|', '/') for c in row)} |" for row in rows]
    if not lines:
        return dg.MetadataValue.md(empty)
    head = f"| {' | '.join(headers)} |\n|{'---|' * len(headers)}\n"
    return dg.MetadataValue.md(head + "\n".join(lines))
