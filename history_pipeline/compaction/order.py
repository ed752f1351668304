"""The WAL writer's ordering rules over a sealed segment, as array operations (the DataFrame path).

The in-process compaction re-checks a sealed segment event by event (``compactor.check_order``,
``WalPosition.admit``). The DataFrame path never holds the segment's events on the driver, so the
lines are scanned where they already are, in contiguous *runs* of lines (the driver's routing
pieces, or a Spark partition of parsed lines): each run is scanned with numpy from a neutral
state (nothing closed, no event before it) and reports its first line, its first violating line
and the state just before it, and the state it leaves. The driver then walks the few runs in line
order from the segment's real starting state (``max(lower bound, frontier)``).

Why a neutral start gives the same first violation as the sequential check: every rule is
monotone in the state (a higher closed timestamp or last event timestamp only adds violations),
so a line violating from the neutral state violates from the real one; and once a run's first
line passes against the real state, the lines after it are checked against timestamps at least
as high locally as the real ones that still matter (a passing prefix is non-decreasing), so the
real check finds nothing the local one misses. Only a run's first line needs the real state. The
messages are ``WalPosition``'s own, computed for the one violating line with the real state.

A line that does not parse ends the scan: the in-process path reports it as malformed before it
checks the order, and so does the DataFrame path (from its plan or its tasks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.errors import TimestampOrderError
from history_pipeline.events import ROW_OPS, SCHEMA_OPS

#: below every timestamp (a close record may have t = -1, the genesis): "nothing yet"
NONE = -2
#: line kinds
ROW, SCHEMA, CLOSE, UNREADABLE = 0, 1, 2, 3


def above_upper_reason(t: int, upper: int) -> str:
    """Why an event above its segment's upper bound is refused."""
    return f"t={t} is above the segment's upper bound {upper}"


@dataclass(frozen=True)
class OrderState:
    """The ordering state before a line: the closed timestamp, the last event's timestamp and
    whether that event was a schema change (``NONE``: nothing yet)."""

    closed: int = NONE
    last: int = NONE
    schema: bool = False

    def then(self, later: OrderState) -> OrderState:
        """This state followed by the lines that left ``later`` from a neutral start."""
        if later.last == NONE:
            return OrderState(max(self.closed, later.closed), self.last, self.schema)
        return OrderState(max(self.closed, later.closed), later.last, later.schema)


@dataclass(frozen=True)
class Violation:
    """A run's first violating line (from the run's neutral start): its t, kind and the state before it."""

    line: int
    t: int
    kind: int
    before: OrderState


@dataclass(frozen=True)
class OrderRun:
    """What one contiguous run of lines (scanned from a neutral start) tells the driver."""

    first_line: int
    first: tuple[int, int] | None  # (t, kind) of its first line; None when that line is unreadable
    violation: Violation | None
    stopped: bool  # an unreadable line ended the scan (no violation at or after it is reported)
    out: OrderState  # the state the run leaves (meaningless once stopped or violated)


def scan(
    lines: np.ndarray, ts: np.ndarray, kinds: np.ndarray, state: OrderState, upper: int
) -> tuple[Violation | None, bool, OrderState]:
    """The first violation among consecutive lines from ``state``, whether an unreadable line
    ended the scan, and the state after the lines (vectorized: running maxima, no per-line Python)."""
    if len(kinds) and not kinds.any() and _rows_in_order(ts, state, upper):  # ROW is 0
        return None, False, OrderState(state.closed, int(ts[-1]), False)
    stop = np.flatnonzero(kinds == UNREADABLE)
    stopped = bool(len(stop))
    n = int(stop[0]) if stopped else len(kinds)
    if not n:
        return None, stopped, state
    t, kind = ts[:n].astype(np.int64), kinds[:n]
    close, schema = kind == CLOSE, kind == SCHEMA
    # in a prefix without violation close timestamps never decrease: the closed timestamp before a
    # line is the running maximum of the closes before it
    closed_incl = np.maximum.accumulate(np.maximum(np.where(close, t, NONE), state.closed))
    closed_before = np.concatenate(([state.closed], closed_incl[:-1]))
    # the last event (not a close) before each line, by index
    prev_incl = np.maximum.accumulate(np.where(close, -1, np.arange(n)))
    prev = np.concatenate(([-1], prev_incl[:-1]))
    has = prev >= 0
    last_before = np.where(has, t[np.maximum(prev, 0)], state.last)
    schema_before = np.where(has, schema[np.maximum(prev, 0)], state.schema)
    bad = (t > upper) | np.where(
        close,
        (t < closed_before) | (t < last_before),
        (t <= closed_before) | (t < last_before) | ((t == last_before) & (schema | schema_before)),
    )
    found = np.flatnonzero(bad)
    if len(found):
        j = int(found[0])
        before = OrderState(int(closed_before[j]), int(last_before[j]), bool(schema_before[j]))
        return Violation(int(lines[j]), int(t[j]), int(kind[j]), before), stopped, state
    end = prev_incl[-1]
    out = OrderState(int(closed_incl[-1]), int(t[end]) if end >= 0 else state.last,
                     bool(schema[end]) if end >= 0 else state.schema)
    return None, stopped, out


def _rows_in_order(ts: np.ndarray, state: OrderState, upper: int) -> bool:
    """Row events only (the common piece): do they pass? Non-decreasing, the first above the closed
    timestamp and not below (nor, after a schema change, at) the last event's, the last not above
    ``upper`` (a fast path of ``scan``: two passes instead of a dozen)."""
    first, last = int(ts[0]), int(ts[-1])
    if first <= state.closed or first < state.last or (first == state.last and state.schema) or last > upper:
        return False
    return bool((ts[1:] >= ts[:-1]).all())


class RunScanner:
    """Scans one run fed piece by piece, in line order (the driver's routing reads)."""

    def __init__(self, upper: int) -> None:
        self.upper = upper
        self.first_line: int | None = None
        self.first: tuple[int, int] | None = None
        self.violation: Violation | None = None
        self.stopped = False
        self.state = OrderState()

    @property
    def done(self) -> bool:
        """Nothing later can change the run's report."""
        return self.violation is not None or self.stopped

    def feed(self, lines: np.ndarray, ts: np.ndarray, kinds: np.ndarray) -> None:
        """The next lines of the run (ascending, consecutive with those fed before)."""
        if self.done or not len(lines):
            return
        if self.first_line is None:
            self.first_line = int(lines[0])
            self.first = None if kinds[0] == UNREADABLE else (int(ts[0]), int(kinds[0]))
        self.violation, self.stopped, self.state = scan(lines, ts, kinds, self.state, self.upper)

    def run(self) -> OrderRun | None:
        """The run's report (None when it held no line)."""
        if self.first_line is None:
            return None
        return OrderRun(self.first_line, self.first, self.violation, self.stopped, self.state)


def _reason(state: OrderState, t: int, kind: int, upper: int) -> str | None:
    """``WalPosition``'s verdict on one line given the real state before it."""
    from history_pipeline.wal.writer import WalPosition

    if t > upper:
        return above_upper_reason(t, upper)
    position = WalPosition(state.closed, None if state.last == NONE else state.last, state.schema)
    try:
        position.admit_kind(t, kind == CLOSE, kind == SCHEMA)
    except TimestampOrderError as exc:
        return exc.reason
    return None


def order_error(
    runs: Iterable[OrderRun], lower: int, frontier: int, upper: int, segment: str
) -> TimestampOrderError | None:
    """The segment's first ordering violation (as ``compactor.check_order`` names it) from its
    runs' reports, walked in line order from ``max(lower, frontier)``; None when there is none."""
    state = OrderState(closed=max(lower, frontier))
    for run in sorted(runs, key=lambda r: r.first_line):
        if run.first is not None:
            reason = _reason(state, *run.first, upper)
            if reason is not None:
                return TimestampOrderError(reason, segment=segment, line=run.first_line)
        if run.violation is not None:
            v = run.violation
            real = state.then(v.before)
            reason = _reason(real, v.t, v.kind, upper)
            # the neutral start only ever finds fewer violations than the real one (module docstring)
            assert reason is not None, f"line {v.line}: a violation from the neutral state only"
            return TimestampOrderError(reason, segment=segment, line=v.line)
        if run.stopped:
            return None
        state = state.then(run.out)
    return None


def kind_column() -> object:
    """A Spark column: the kind of each parsed line from its ``op`` and ``t``, computed in the JVM so
    that only integers reach Python (``UNREADABLE``: unknown op, or a t ``parse_line`` refuses: none,
    or below its op's least, -1 for a close and 0 otherwise)."""
    from pyspark.sql import functions as F

    op, t = F.col("op"), F.col("t")
    kind = (F.when(op.isin(*ROW_OPS) & (t >= 0), ROW).when(op.isin(*SCHEMA_OPS) & (t >= 0), SCHEMA)
            .when((op == "close") & (t >= -1), CLOSE).otherwise(UNREADABLE))
    return kind.cast("tinyint").alias("kind")


#: the rows ``order_runs_udf`` yields: one per run of a partition
RUN_SCHEMA = pa.schema(
    [(name, pa.int64()) for name in ("first_line", "first_t", "first_kind", "v_line", "v_t", "v_kind", "v_closed",
                                     "v_last")]
    + [("v_schema", pa.bool_()), ("stopped", pa.bool_()), ("out_closed", pa.int64()), ("out_last", pa.int64()),
       ("out_schema", pa.bool_())]
)
RUN_DDL = ", ".join(f"{f.name} {'boolean' if pa.types.is_boolean(f.type) else 'bigint'}" for f in RUN_SCHEMA)


def order_runs_udf(upper: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: a partition's (line, t, kind) rows in, one report per run of consecutive
    lines out (line 1, the opening close, is the starting state, not an event)."""

    def runs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held = list(batches)
        if not held:
            return
        table = pa.Table.from_batches(held)
        table = table.filter(pc.greater(table.column("line"), 1)).sort_by("line")
        if not table.num_rows:
            return
        lines = np.asarray(table.column("line").to_numpy())
        ts = np.asarray(table.column("t").fill_null(NONE).to_numpy())
        kinds = np.asarray(table.column("kind").to_numpy(), np.int8)
        cuts = np.flatnonzero(np.diff(lines) != 1) + 1
        out = []
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(lines)], strict=True):
            scanner = RunScanner(upper)
            scanner.feed(lines[a:b], ts[a:b], kinds[a:b])
            run = scanner.run()
            assert run is not None
            out.append(_run_row(run))
        yield pa.RecordBatch.from_pylist(out, schema=RUN_SCHEMA)

    return runs


def _run_row(run: OrderRun) -> dict[str, object]:
    v = run.violation
    return {
        "first_line": run.first_line,
        "first_t": None if run.first is None else run.first[0],
        "first_kind": None if run.first is None else run.first[1],
        "v_line": None if v is None else v.line, "v_t": None if v is None else v.t,
        "v_kind": None if v is None else v.kind,
        "v_closed": None if v is None else v.before.closed, "v_last": None if v is None else v.before.last,
        "v_schema": None if v is None else v.before.schema,
        "stopped": run.stopped,
        "out_closed": run.out.closed, "out_last": run.out.last, "out_schema": run.out.schema,
    }


def run_of_row(row: object) -> OrderRun:
    """An ``OrderRun`` back from a collected row of ``RUN_DDL``."""
    r = row.asDict() if hasattr(row, "asDict") else dict(row)  # type: ignore[call-overload]
    first = None if r["first_t"] is None else (int(r["first_t"]), int(r["first_kind"]))
    violation = None
    if r["v_line"] is not None:
        violation = Violation(int(r["v_line"]), int(r["v_t"]), int(r["v_kind"]),
                              OrderState(int(r["v_closed"]), int(r["v_last"]), bool(r["v_schema"])))
    out = OrderState(int(r["out_closed"]), int(r["out_last"]), bool(r["out_schema"]))
    return OrderRun(int(r["first_line"]), first, violation, bool(r["stopped"]), out)


def order_runs(parsed: object, upper: int) -> list[OrderRun]:
    """One action over a segment's parsed lines (``frames.parsed_lines``, cached): every run's report."""
    lines = parsed.select("line", "t", kind_column())  # type: ignore[attr-defined]
    rows = lines.mapInArrow(order_runs_udf(upper), RUN_DDL).collect()
    return [run_of_row(r) for r in rows]
