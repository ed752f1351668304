"""Asset checks: the catalog verifies, the frontier keeps up with the WAL, the invariant holds."""


import dagster as dg

from history_pipeline.orchestration.assets import supertables
from history_pipeline.orchestration.metadata import md_table
from history_pipeline.orchestration.resources import HistoryRootResource
from history_pipeline.query.invariant import sample_reconstruction
from history_pipeline.wal import SegmentState

MAX_PENDING_SEGMENTS = 3


@dg.asset_check(
    asset=supertables,
    blocking=True,  # exports wait while the catalog and its files disagree
    description="Every live file exists, reads, and matches its statistics; the WAL has no quarantined or "
    "unverifiable segment.",
)
def catalog_verifies_check(history: HistoryRootResource) -> dg.AssetCheckResult:
    problems = {db: [str(p) for p in history.open(db).verify()] for db in history.databases()}
    count = sum(len(p) for p in problems.values())
    listed = [(db, problem) for db, found in sorted(problems.items()) for problem in found[:20]]
    return dg.AssetCheckResult(
        passed=count == 0,
        metadata={
            "problems": count,
            "databases_checked": len(problems),
            "details": md_table(["database", "problem"], listed, empty="no problem found"),
        },
    )


@dg.asset_check(asset=supertables, description="No database has more than a few sealed segments waiting, "
                "and none is blocked by a quarantined segment.")
def frontier_lag_check(history: HistoryRootResource) -> dg.AssetCheckResult:
    rows = []
    for db in history.databases():
        store = history.open(db)
        rows.append((db, store.frontier, len(store.segments(SegmentState.SEALED)),
                     len(store.segments(SegmentState.QUARANTINED))))
    worst = max((r[2] for r in rows), default=0)
    quarantined = sum(r[3] for r in rows)
    return dg.AssetCheckResult(
        passed=worst <= MAX_PENDING_SEGMENTS and quarantined == 0,
        metadata={
            "most_pending_segments": worst,
            "allowed_pending_segments": MAX_PENDING_SEGMENTS,
            "quarantined_segments": quarantined,
            "by_database": md_table(["database", "frontier", "pending", "quarantined"], rows),
        },
    )


@dg.asset_check(asset=supertables, description="A few keys re-derived from the retained WAL match the store.")
def reconstruction_invariant_check(history: HistoryRootResource) -> dg.AssetCheckResult:
    checked, mismatches, unchecked = 0, [], {}
    for database in history.databases():
        sample = sample_reconstruction(history.open(database), samples=5)
        checked += sample.checked
        mismatches += [f"{database}: {m}" for m in sample.mismatches]
        if not sample.checked:
            unchecked[database] = sample.reason
    metadata = {"states_checked": checked, "mismatches": dg.MetadataValue.json(mismatches[:20]),
                "databases_unchecked": dg.MetadataValue.json(unchecked)}
    if not checked:
        # nothing was compared: say so, never pass vacuously
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
            description="checked nothing: " + ("; ".join(f"{d}: {r}" for d, r in unchecked.items())
                                               or "no database under the root"),
        )
    return dg.AssetCheckResult(passed=not mismatches, metadata=metadata)
