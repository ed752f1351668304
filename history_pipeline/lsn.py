"""PostgreSQL log sequence numbers (LSNs) as logical timestamps.

A captured database's timestamps are LSNs as 64-bit integers (docs/format.md, "Captured
databases"); users read them from PostgreSQL in its ``X/Y`` form (``pg_current_wal_lsn()``), so
every ``as_of`` also accepts that form.
"""

from __future__ import annotations

import re

from history_pipeline.errors import HistoryError

_LSN_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
_MAX = 2**64 - 1


def parse_lsn(text: str) -> int:
    """``"16/B374D848"`` -> the LSN as an integer (high 32 bits before the slash)."""
    match = _LSN_RE.match(text)
    if not match:
        raise HistoryError(f"{text!r} is not a PostgreSQL LSN: expected hex 'X/Y' such as '0/16B3748'")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(value: int) -> str:
    """The integer LSN in PostgreSQL's ``X/Y`` form."""
    if not 0 <= value <= _MAX:
        raise HistoryError(f"{value} is not a PostgreSQL LSN (must be in [0, 2^64-1])")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def to_timestamp(value: int | str) -> int:
    """A logical timestamp from an integer, a decimal string, or an ``X/Y`` LSN."""
    if isinstance(value, bool):
        raise HistoryError(f"as_of must be an integer or an 'X/Y' LSN, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        stripped = value.strip()
        if re.fullmatch(r"[+-]?\d+", stripped):
            return int(stripped)
        if "/" in stripped:
            return parse_lsn(stripped)
    raise HistoryError(f"as_of must be an integer or an 'X/Y' LSN such as '0/16B3748', got {value!r}")


def as_of_argument(text: str) -> int:
    """argparse ``type=`` for ``--as-of``: an integer or an ``X/Y`` LSN (a usage error otherwise)."""
    import argparse

    try:
        return to_timestamp(text)
    except HistoryError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
